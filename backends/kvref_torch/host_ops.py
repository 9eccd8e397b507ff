"""torch on the CPU, the array core's way: NumPy arrays, handed out as tensors of their memory (:class:`TorchHostOps`).

On the CPU every torch call pays a dispatch of several microseconds, where NumPy's costs well
under one; the array core makes tens of small calls per pool operation, so on torch's own ops a
batch-1 ``allocate`` + ``free`` took 130-190 us against 4 us for the oracle. This layer runs the
core on NumPy arrays in host memory; what the core hands out (:meth:`export`: ``allocate_ids``,
``match_ids``, ``graph_arrays``) is a CPU tensor of the same memory (``torch.from_numpy``, no
copy), and what a caller passes in (a CPU tensor, a NumPy array or a list) is read without a copy
where it is int64 already. So the tensors of ``graph_arrays`` are the pool's state itself, at
fixed addresses, as on CUDA. (Allocating through torch instead would cost a torch call for every
scratch array of every operation.)

The launch and sync budget of ``kvref_torch.counting`` counts torch's own kernels, so it builds
its pools on :class:`kvref_torch.ops.TorchOps` (as a CUDA device runs them), never on this layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from kvref_arraypool.ops import Array, NumpyLikeOps

from kvref_torch.ops import INTEGER_DTYPES

__all__ = ["TorchHostOps"]


class TorchHostOps(NumpyLikeOps):
    """int64/bool NumPy arrays on the host, handed to the caller as CPU tensors of their memory (``name`` ``torch``)."""

    def __init__(self) -> None:
        super().__init__(np, device="cpu", is_device=False)
        self.name = "torch"

    def address(self, a: Array) -> int:
        """Where ``a``'s data starts: a tensor's ``data_ptr()``, a NumPy view's ``ctypes.data`` (the same memory)."""
        return int(a.data_ptr()) if isinstance(a, torch.Tensor) else int(a.ctypes.data)

    def export(self, a: Array) -> Any:
        """``a`` as a CPU tensor of the same memory (``torch.from_numpy``; a read-only array is copied first)."""
        if isinstance(a, torch.Tensor):
            return a
        if not a.flags.writeable:  # torch.from_numpy warns on read-only memory
            a = a.copy()
        return torch.from_numpy(np.ascontiguousarray(a))

    def device_ints(self, values: object, *, any_width: bool = False) -> Array | None:
        """A 1-d integer CPU tensor (or NumPy array) as an int64 NumPy view (a copy only to widen)."""
        if isinstance(values, torch.Tensor):
            if values.ndim != 1 or values.device.type != "cpu" or values.dtype not in INTEGER_DTYPES:
                return None
            values = values.detach().numpy()
        return super().device_ints(values, any_width=any_width)
