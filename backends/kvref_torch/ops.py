"""torch's side of the array layer (:class:`kvref_arraypool.ops.ArrayOps`) on ``cpu`` or ``cuda:N``.

Host input arrive as NumPy arrays and are moved with one copy (a view on ``cpu``; pinned staging
is left to torch's caching allocator on CUDA). Scatters with duplicate indices use
``index_add_`` and ``scatter_reduce_``, which combine duplicates deterministically in value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from kvref_arraypool.ops import Array, ArrayOps

__all__ = ["INTEGER_DTYPES", "TorchOps"]

#: The integer dtypes a caller's tensor of ids may have.
INTEGER_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
_DTYPES = {"int32": torch.int32, "int64": torch.int64}


class TorchOps(ArrayOps):
    """int64/bool tensors on one torch device; a method without a docstring does what :class:`ArrayOps` states."""

    name = "torch"

    def __init__(self, device: str) -> None:
        self.torch_device = torch.device(device)
        self.device = str(self.torch_device)
        self.is_device = self.torch_device.type == "cuda"

    def address(self, a: Array) -> int:
        return int(a.data_ptr())

    def zeros(self, n: int) -> Array:
        return torch.zeros(n, dtype=torch.int64, device=self.torch_device)

    def full(self, n: int, value: int) -> Array:
        return torch.full((n,), value, dtype=torch.int64, device=self.torch_device)

    def falses(self, n: int) -> Array:
        return torch.zeros(n, dtype=torch.bool, device=self.torch_device)

    def arange(self, start: int, stop: int | None = None) -> Array:
        if stop is None:
            return torch.arange(start, dtype=torch.int64, device=self.torch_device)
        return torch.arange(start, stop, dtype=torch.int64, device=self.torch_device)

    def asarray(self, host: np.ndarray) -> Array:
        """A view of the host array on ``cpu``; a copy in device memory on CUDA, queued without a wait.

        On CUDA the array is staged in pinned memory and copied with ``non_blocking=True``: a copy
        from pageable memory makes the host wait for the device (a sync per call), a pinned one is
        queued on the stream. torch's caching host allocator keeps the staging buffer until the
        copy has run, so the caller may reuse ``host`` at once.
        """
        self.host_writes += 1
        if not host.flags.writeable:  # torch.from_numpy warns on read-only memory; take a copy
            host = host.copy()
        tensor = torch.from_numpy(np.ascontiguousarray(host))
        if self.is_device:  # pragma: no cover - needs a CUDA device
            return tensor.pin_memory().to(self.torch_device, non_blocking=True)
        return tensor

    def to_host(self, a: Array) -> np.ndarray:
        """Host NumPy array."""
        self.host_reads += 1
        result: np.ndarray = a.detach().cpu().numpy()
        return result

    def copy(self, a: Array) -> Array:
        return a.clone()

    def concat(self, parts: list[Array]) -> Array:
        return torch.cat(parts)

    def flip(self, a: Array) -> Array:
        return torch.flip(a, dims=(0,))

    def _values(self, values: Array | int, like: Array) -> Any:
        if isinstance(values, int):
            return torch.full(like.shape, values, dtype=torch.int64, device=self.torch_device)
        return values

    def fill_at(self, a: Array, idx: Array, value: int) -> None:
        """``index_fill_``: the value is a kernel argument, not a tensor copied in (as ``a[idx] = value`` makes it)."""
        if idx.dtype == torch.bool:  # a mask over the whole array, not positions
            a.masked_fill_(idx, value)
        else:
            a.index_fill_(0, idx if idx.dtype == torch.int64 else idx.to(torch.int64), value)

    def scatter_add(self, a: Array, idx: Array, values: Array | int) -> None:
        """``index_add_``."""
        a.index_add_(0, idx, self._values(values, idx))

    def scatter_max(self, a: Array, idx: Array, values: Array) -> None:
        """``scatter_reduce_(amax)``."""
        a.scatter_reduce_(0, idx, values, reduce="amax")

    def scatter_min(self, a: Array, idx: Array, values: Array) -> None:
        """``scatter_reduce_(amin)``."""
        a.scatter_reduce_(0, idx, values, reduce="amin")

    def unique(self, a: Array) -> tuple[Array, Array]:
        """``torch.unique`` (sorted) with counts."""
        u, cnt = torch.unique(a, sorted=True, return_counts=True)
        return u, cnt

    def argsort(self, a: Array) -> Array:
        return torch.sort(a, stable=True).indices

    def nonzero(self, mask: Array) -> Array:
        """``torch.nonzero`` flattened."""
        return torch.nonzero(mask).flatten()

    def where(self, mask: Array, a: Array | int, b: Array | int) -> Array:
        return torch.where(mask, a, b)

    def cumsum(self, a: Array) -> Array:
        return torch.cumsum(a, 0, dtype=torch.int64)

    def isin(self, a: Array, values: Array) -> Array:
        return torch.isin(a, values)

    def first_true(self, mask: Array) -> tuple[Array, Array]:
        """``any`` and ``argmax`` (first maximum) along dim 1; argmax needs a number type."""
        return mask.any(dim=1), mask.to(torch.uint8).argmax(dim=1)

    def argmax_bool(self, mask: Array) -> Array:
        """``argmax`` of the mask as uint8 (torch has no argmax of bool); the first maximum."""
        return mask.to(torch.uint8).argmax()

    def device_ints(self, values: object, *, any_width: bool = False) -> Array | None:
        """A 1-d integer tensor on this device, as int64 (no copy when it is int64 already).

        ``any_width``: its own dtype, laid out densely (a kernel reads entry ``i`` at ``base + i``, so
        a strided view is copied; it once read the wrong entries of ``slots[::2]``)."""
        if (
            isinstance(values, torch.Tensor)
            and values.ndim == 1
            and values.device == self.torch_device
            and values.dtype in INTEGER_DTYPES
        ):
            if any_width:
                return values if values.is_contiguous() else values.contiguous()
            return values.to(torch.int64)
        return None

    def cast(self, a: Array, dtype: str) -> Array:
        return a.to(_DTYPES[dtype], copy=True)

    def count(self, mask: Array) -> int:
        return int(torch.count_nonzero(mask))

    def synchronize(self) -> None:
        """``torch.cuda.synchronize`` on CUDA; nothing on the CPU."""
        if self.is_device:  # pragma: no cover - needs a CUDA device
            torch.cuda.synchronize(self.torch_device)
