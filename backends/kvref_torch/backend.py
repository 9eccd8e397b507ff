"""The torch backend object: torch's availability, device choice and arrays (CONF-901, CONF-906, CONF-907).

Every factory is the array core's (:class:`kvref_arraypool.backend.ArrayBackend`); on ``cpu`` the
core runs torch's own operations on CPU tensors, the same code a CUDA device runs. ``torch`` is
imported only when the backend is asked for (``availability``, ``device`` or a factory), never
when the entry point is loaded.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

from kvref_arraypool.backend import ArrayBackend

if TYPE_CHECKING:
    from kvref_arraypool.ops import ArrayOps

    from kvref.oracle.data.tensors import Tensors

__all__ = ["TorchBackend", "backend"]


class TorchBackend(ArrayBackend):
    """The array core on torch tensors (``cpu`` or ``cuda:N``)."""

    name = "torch"
    kernel_library = "torch"
    host_device = "cpu"
    host_names = ("cpu",)
    no_cuda = "which torch cannot use here"

    def version(self) -> str:
        """The installed torch version."""
        try:
            return metadata.version("torch")
        except metadata.PackageNotFoundError:
            return "not installed"

    def availability(self) -> str | None:
        """None when torch imports; else why not."""
        try:
            import torch  # noqa: F401
        except ImportError:
            return "torch is not installed"
        try:
            import numpy  # noqa: F401
        except ImportError:
            return "numpy is not installed (the array core takes caller input through it)"
        return None

    def cuda_devices(self) -> int:
        """``torch.cuda.device_count()`` where torch can use CUDA, else 0."""
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def ops(self, device: str) -> ArrayOps:
        """torch's operations on ``device``: the same on ``cpu`` as on CUDA."""
        from kvref_torch.ops import TorchOps

        return TorchOps(device)

    def tensors(self, device: str, **options: Any) -> Tensors:
        """torch tensors on ``device``; ``pin_memory=True`` pins the host copies (chapter 08)."""
        from kvref_torch.tensors import TorchTensors

        return TorchTensors(device, **options)


#: The object the entry point names.
backend = TorchBackend()
