"""kvref's torch backend: the array core on torch tensors on ``cpu`` or ``cuda:N``.

Registered under the ``kvref.backends`` entry point ``torch``.
"""

from kvref_torch.backend import TorchBackend, backend

__all__ = ["TorchBackend", "backend"]
