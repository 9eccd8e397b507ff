"""torch under chapter 08's data plane (:class:`kvref.oracle.data.Tensors`): CUDA where present, else the CPU."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kvref.contract.errors import ConfigError

if TYPE_CHECKING:
    from kvref_arraypool.data_checks import DeviceSlotChecks

__all__ = ["TorchTensors"]

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
}


class TorchTensors:
    """The data plane's tensors on ``device`` (``cpu`` or ``cuda:N``); ``pin_memory`` pins host buffers."""

    name = "torch"

    def __init__(self, device: str, *, pin_memory: bool = False) -> None:
        self.device = device
        self.pin_memory = pin_memory and device == "cpu" and torch.cuda.is_available()

    def supports(self, dtype: str) -> bool:
        """float32, float16, bfloat16, float8_e4m3fn and the integer types (DATA-805)."""
        return dtype in _DTYPES

    def zeros(self, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
        """A zeroed tensor; ConfigError for a dtype torch lacks (DATA-805)."""
        if not self.supports(dtype):
            raise ConfigError("DATA-805", f"torch cannot hold dtype {dtype!r}; it holds {sorted(_DTYPES)}")
        return torch.zeros(shape, dtype=_DTYPES[dtype], device=self.device, pin_memory=self.pin_memory)

    def index(self, host: np.ndarray) -> torch.Tensor:
        """Host indices on the device, int64."""
        return torch.as_tensor(np.asarray(host, dtype=np.int64), device=self.device)

    def values(self, data: Any, dtype: str) -> torch.Tensor:
        """``data`` (a NumPy array or a tensor) on the device in ``dtype``."""
        tensor = data if isinstance(data, torch.Tensor) else torch.as_tensor(np.asarray(data))
        return tensor.to(device=self.device, dtype=_DTYPES[dtype])

    def to_host(self, a: torch.Tensor) -> np.ndarray:
        """A NumPy copy (bfloat16 and 8-bit floats as float32)."""
        a = a.detach().cpu()
        if a.dtype in (torch.bfloat16, torch.float8_e4m3fn):
            a = a.float()
        return np.array(a.numpy(), copy=True)

    def device_checks(self, slots: int) -> DeviceSlotChecks:
        """Checks of slot indices on this device (DATA-815), over torch's array operations."""
        from kvref_arraypool.data_checks import DeviceSlotChecks

        from kvref_torch.ops import TorchOps

        return DeviceSlotChecks(TorchOps(self.device), slots)

    def nbytes(self, a: torch.Tensor) -> int:
        """Elements times element size."""
        return int(a.numel() * a.element_size())
