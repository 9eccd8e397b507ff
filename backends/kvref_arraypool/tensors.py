"""NumPy-like tensor libraries (NumPy, CuPy) under chapter 08's data plane (:class:`kvref.oracle.data.Tensors`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from kvref.contract.errors import ConfigError

if TYPE_CHECKING:
    from kvref_arraypool.data_checks import DeviceSlotChecks

__all__ = ["LibraryTensors"]

_DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64")


class LibraryTensors:
    """The data plane's tensors on ``xp`` (``numpy`` or ``cupy``), on ``device``."""

    def __init__(self, xp: Any, *, name: str, device: str) -> None:
        self.xp = xp
        self.name = name
        self.device = device

    def supports(self, dtype: str) -> bool:
        """NumPy's dtypes (CuPy has the same): no bfloat16, no 8-bit floats."""
        return dtype in _DTYPES

    def zeros(self, shape: tuple[int, ...], dtype: str) -> Any:
        """A zeroed array; ConfigError for a dtype the library lacks (DATA-805)."""
        if not self.supports(dtype):
            raise ConfigError("DATA-805", f"{self.name} cannot hold dtype {dtype!r}; it holds {list(_DTYPES)}")
        return self.xp.zeros(shape, dtype=dtype)

    def index(self, host: np.ndarray) -> Any:
        """Host indices on the device, int64."""
        return self.xp.asarray(np.asarray(host, dtype=np.int64))

    def values(self, data: Any, dtype: str) -> Any:
        """``data`` (host or this library's) on the device in ``dtype``."""
        return self.xp.asarray(data).astype(dtype, copy=False)

    def to_host(self, a: Any) -> np.ndarray:
        """A NumPy copy."""
        return np.array(a.get() if hasattr(a, "get") else a, copy=True)

    def device_checks(self, slots: int) -> DeviceSlotChecks:
        """Checks of slot indices on this device (DATA-815), over the library's array operations."""
        from kvref_arraypool.data_checks import DeviceSlotChecks
        from kvref_arraypool.ops import NumpyLikeOps

        ops = NumpyLikeOps(self.xp, device=self.device, is_device=self.xp.__name__ != "numpy")
        return DeviceSlotChecks(ops, slots)

    def nbytes(self, a: Any) -> int:
        """``a.nbytes``."""
        return int(a.nbytes)
