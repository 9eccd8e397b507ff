"""kvref's CuPy backend: the array core on CuPy arrays on a CUDA device, or on NumPy arrays on the host.

Registered under the ``kvref.backends`` entry point ``cupy``. Without a usable CUDA device the
same code runs on NumPy and the backend says so: its device is ``host``, never a GPU name.
"""

from kvref_cupy.backend import CupyBackend, backend

__all__ = ["CupyBackend", "backend"]
