"""The CuPy backend object: CuPy's availability, device choice and arrays (CONF-901, CONF-906, CONF-907).

Every factory is the array core's (:class:`kvref_arraypool.backend.ArrayBackend`). On a host
where ``cupy.cuda.is_available()`` is False (no driver, no device) the core runs on NumPy arrays,
the same operations CuPy spells, and the device is reported as ``host`` (CONF-909).
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

from kvref_arraypool.backend import ArrayBackend

if TYPE_CHECKING:
    from kvref_arraypool.ops import ArrayOps

    from kvref.oracle.data.tensors import Tensors

__all__ = ["CupyBackend", "backend"]


def _cuda_available() -> bool:
    try:
        import cupy
    except ImportError:
        return False
    try:
        return bool(cupy.cuda.is_available())
    except Exception:  # pragma: no cover - a broken driver counts as no device
        return False


class CupyBackend(ArrayBackend):
    """The array core on CuPy (``cuda:N``) or, without CUDA, on NumPy (``host``)."""

    name = "cupy"
    kernel_library = "cupy"
    probe_device = "host"
    host_device = "host"
    host_names = ("host", "cpu")
    no_cuda = "and cupy.cuda.is_available() is False"

    def version(self) -> str:
        """The installed CuPy's version (any build: cupy-cuda12x, cupy-cuda13x, ...), or ``numpy <v>``."""
        for dist in metadata.packages_distributions().get("cupy", []):
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        import numpy

        return f"numpy {numpy.__version__}"

    def availability(self) -> str | None:
        """None when CuPy (or, for the host path, NumPy) imports; else why not."""
        try:
            import numpy  # noqa: F401
        except ImportError:
            return "numpy is not installed"
        try:
            import cupy  # noqa: F401
        except ImportError:
            return "cupy is not installed"
        return None

    def cuda_devices(self) -> int:
        """``cupy.cuda.runtime.getDeviceCount()`` where ``cupy.cuda.is_available()``, else 0."""
        if not _cuda_available():
            return 0
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())

    def pool_name(self, device: str) -> str:
        """``cupy (host: numpy)`` on the host, ``cupy`` on CUDA (CONF-909)."""
        return "cupy (host: numpy)" if device == "host" else "cupy"

    def ops(self, device: str) -> ArrayOps:
        """NumPy on the host, CuPy on ``cuda:N`` (made current)."""
        from kvref_arraypool.ops import NumpyLikeOps

        if device == "host":
            import numpy

            return NumpyLikeOps(numpy, device="host", is_device=False)
        import cupy  # pragma: no cover - needs a CUDA device

        cupy.cuda.Device(int(device.partition(":")[2])).use()  # pragma: no cover
        return NumpyLikeOps(cupy, device=device, is_device=True)  # pragma: no cover

    def tensors(self, device: str, **options: Any) -> Tensors:
        """NumPy arrays on the host, CuPy's on ``cuda:N`` (made current): chapter 08's tensors."""
        from kvref_arraypool.tensors import LibraryTensors

        if device == "host":
            import numpy

            return LibraryTensors(numpy, name="cupy (host: numpy)", device="host", **options)
        import cupy  # pragma: no cover - needs a CUDA device

        cupy.cuda.Device(int(device.partition(":")[2])).use()  # pragma: no cover
        return LibraryTensors(cupy, name="cupy", device=device, **options)  # pragma: no cover


#: The object the entry point names.
backend = CupyBackend()
