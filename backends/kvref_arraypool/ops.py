"""The thin per-library layer under the array core: what NumPy, CuPy and torch do differently.

The core (:mod:`kvref_arraypool.pool`) is written once against :class:`ArrayOps`. Indexing,
slicing, comparisons, arithmetic and bit operations on 1-d int64/bool arrays are spelled the same
in NumPy, CuPy and torch and are used directly; everything else goes through these methods:
scatter with duplicate indices, unique, stable sorting, copies, and moving data to and from the
host. Every array the core keeps is one-dimensional, int64 or bool, and lives on ``device``.

:class:`NumpyLikeOps` serves NumPy (host) and CuPy (CUDA); ``kvref_torch`` has its own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

__all__ = ["ArrayOps", "NumpyLikeOps"]

Array = Any


class ArrayOps(ABC):
    """Array operations the core needs beyond the spelling NumPy, CuPy and torch share.

    ``scatter_*`` accept duplicate indices and combine them (sum, max, min), unlike plain
    ``a[idx] = v`` whose winner among duplicates is unspecified. ``is_device`` is True when the
    arrays live in GPU memory; ``device`` names where they live, as ``kvref backends`` shows it.
    """

    name: str
    device: str
    is_device: bool
    #: Arrays copied to the host so far (``tolist``, ``to_host``): on a GPU each waits for the
    #: device. Counted for the launch/sync budget (``tests.launch_counting``); never reset here.
    host_reads: int = 0
    #: Host arrays copied in so far (``asarray``): on a GPU each is a host-to-device copy.
    host_writes: int = 0

    @abstractmethod
    def address(self, a: Array) -> int:
        """Where ``a``'s data starts in its device's memory: what a captured CUDA graph reads (CONF-908)."""

    @abstractmethod
    def zeros(self, n: int) -> Array:
        """int64 zeros of length ``n``."""

    @abstractmethod
    def full(self, n: int, value: int) -> Array:
        """int64 array of length ``n`` filled with ``value``."""

    @abstractmethod
    def falses(self, n: int) -> Array:
        """bool array of length ``n``, all False."""

    @abstractmethod
    def arange(self, start: int, stop: int | None = None) -> Array:
        """int64 ``[start, stop)`` (or ``[0, start)``)."""

    @abstractmethod
    def asarray(self, host: np.ndarray) -> Array:
        """A host int64/bool NumPy array as a device array (a view where the library allows)."""

    @abstractmethod
    def to_host(self, a: Array) -> np.ndarray:
        """A device array as a host NumPy array."""

    @abstractmethod
    def copy(self, a: Array) -> Array:
        """An independent copy."""

    @abstractmethod
    def concat(self, parts: list[Array]) -> Array:
        """Concatenation of 1-d arrays."""

    @abstractmethod
    def flip(self, a: Array) -> Array:
        """``a`` reversed."""

    def put(self, a: Array, idx: Array, values: Array | int) -> None:
        """``a[idx] = values``: an array of values, or one Python int (:meth:`fill_at`, nothing copied in)."""
        if isinstance(values, int):
            self.fill_at(a, idx, values)
        else:
            a[idx] = values

    @abstractmethod
    def fill_at(self, a: Array, idx: Array, value: int) -> None:
        """``a[idx] = value`` for a 1-d integer ``idx`` and a Python int, in place, with no host-to-device copy.

        Spelled ``a[idx] = value``, torch lifts ``value`` into a host tensor and copies it to the
        device, waiting for the copy (a host sync on every such line); this passes it to the kernel.
        """

    @abstractmethod
    def scatter_add(self, a: Array, idx: Array, values: Array | int) -> None:
        """``a[idx[i]] += values[i]`` for every ``i``, duplicates summed, in place."""

    @abstractmethod
    def scatter_max(self, a: Array, idx: Array, values: Array) -> None:
        """``a[idx[i]] = max(a[idx[i]], values[i])``, duplicates combined, in place."""

    @abstractmethod
    def scatter_min(self, a: Array, idx: Array, values: Array) -> None:
        """``a[idx[i]] = min(a[idx[i]], values[i])``, duplicates combined, in place."""

    @abstractmethod
    def unique(self, a: Array) -> tuple[Array, Array]:
        """Sorted distinct values and how often each occurs (int64)."""

    @abstractmethod
    def argsort(self, a: Array) -> Array:
        """Stable ascending argsort (int64)."""

    @abstractmethod
    def nonzero(self, mask: Array) -> Array:
        """Positions of True entries (int64)."""

    @abstractmethod
    def where(self, mask: Array, a: Array | int, b: Array | int) -> Array:
        """Elementwise ``a if mask else b``."""

    @abstractmethod
    def cumsum(self, a: Array) -> Array:
        """Inclusive prefix sum (int64)."""

    @abstractmethod
    def isin(self, a: Array, values: Array) -> Array:
        """Elementwise membership of ``a`` in ``values``."""

    @abstractmethod
    def first_true(self, mask: Array) -> tuple[Array, Array]:
        """Per row of a 2-d bool array: whether any entry is True, and the column of the first."""

    @abstractmethod
    def argmax_bool(self, mask: Array) -> Array:
        """The position of the first True of a non-empty 1-d bool array (0 when none), on the device."""

    @abstractmethod
    def device_ints(self, values: object, *, any_width: bool = False) -> Array | None:
        """``values`` as a 1-d int64 array on this device without a host copy, when it is a 1-d
        integer array of this library on this device; None for anything else (the host path).
        ``any_width``: keep a narrower integer dtype as it is (for a kernel that reads it)."""

    @abstractmethod
    def cast(self, a: Array, dtype: str) -> Array:
        """A fresh copy of ``a`` as ``"int32"`` or ``"int64"``: an output the caller owns."""

    @abstractmethod
    def count(self, mask: Array) -> int:
        """How many entries of ``mask`` are True (a host int: one device sync)."""

    def any(self, mask: Array) -> bool:
        """Whether any entry is True (one device sync)."""
        return bool(mask.any())

    def export(self, a: Array) -> Array:
        """``a`` as the caller's library holds it: what the core hands out (``allocate_ids``,
        ``match_ids``, ``graph_arrays``): ``a`` itself, an array of the library the core runs on."""
        return a

    def tolist(self, a: Array) -> list[int]:
        """Host list of Python ints."""
        self.host_reads += 1
        return list(a.tolist())

    def synchronize(self) -> None:  # noqa: B027 - a no-op is the right default for host arrays
        """Wait for queued device work (no-op on the host); benchmarks call it before stopping a clock."""


class NumpyLikeOps(ArrayOps):
    """NumPy on the host, or CuPy on a CUDA device, through one ``xp`` module (``numpy`` or ``cupy``); a method
    without a docstring does what :class:`ArrayOps` states."""

    def __init__(self, xp: Any, *, device: str, is_device: bool) -> None:
        self.xp = xp
        self.name = xp.__name__
        self.device = device
        self.is_device = is_device
        # ``ufunc.at`` on NumPy, and on CuPy since 13 (CuPy 14 deprecates cupyx.scatter_add/max/min,
        # whose DeprecationWarning fails a suite that treats warnings as errors).
        self._add_at = xp.add.at
        self._max_at = xp.maximum.at
        self._min_at = xp.minimum.at

    def address(self, a: Array) -> int:
        """``a.data.ptr`` on CuPy, ``a.ctypes.data`` on NumPy."""
        return int(a.data.ptr) if self.is_device else int(a.ctypes.data)

    def zeros(self, n: int) -> Array:
        return self.xp.zeros(n, dtype=self.xp.int64)

    def full(self, n: int, value: int) -> Array:
        return self.xp.full(n, value, dtype=self.xp.int64)

    def falses(self, n: int) -> Array:
        return self.xp.zeros(n, dtype=self.xp.bool_)

    def arange(self, start: int, stop: int | None = None) -> Array:
        if stop is None:
            return self.xp.arange(start, dtype=self.xp.int64)
        return self.xp.arange(start, stop, dtype=self.xp.int64)

    def asarray(self, host: np.ndarray) -> Array:
        """The host array itself on NumPy; a copy in device memory on CuPy."""
        self.host_writes += 1
        return self.xp.asarray(host)

    def to_host(self, a: Array) -> np.ndarray:
        """Host NumPy array (the array itself on NumPy)."""
        self.host_reads += 1
        if self.is_device:  # pragma: no cover - needs a CUDA device
            return np.asarray(a.get())
        return np.asarray(a)

    def copy(self, a: Array) -> Array:
        return a.copy()

    def concat(self, parts: list[Array]) -> Array:
        return self.xp.concatenate(parts)

    def flip(self, a: Array) -> Array:
        return a[::-1]

    def fill_at(self, a: Array, idx: Array, value: int) -> None:
        """``a[idx] = value``: NumPy and CuPy pass the scalar to the kernel."""
        a[idx] = value

    def scatter_add(self, a: Array, idx: Array, values: Array | int) -> None:
        """``xp.add.at``: duplicates summed (NumPy, and CuPy >= 13)."""
        self._add_at(a, idx, values)

    def scatter_max(self, a: Array, idx: Array, values: Array) -> None:
        self._max_at(a, idx, values)

    def scatter_min(self, a: Array, idx: Array, values: Array) -> None:
        self._min_at(a, idx, values)

    def unique(self, a: Array) -> tuple[Array, Array]:
        """``xp.unique`` with counts."""
        u, cnt = self.xp.unique(a, return_counts=True)
        return u, cnt.astype(self.xp.int64, copy=False)

    def argsort(self, a: Array) -> Array:
        return self.xp.argsort(a, kind="stable").astype(self.xp.int64, copy=False)

    def nonzero(self, mask: Array) -> Array:
        """``xp.flatnonzero`` of a 1-d mask, spelled ``mask.nonzero()[0]`` (7x cheaper on short NumPy arrays)."""
        return mask.nonzero()[0].astype(self.xp.int64, copy=False)

    def where(self, mask: Array, a: Array | int, b: Array | int) -> Array:
        return self.xp.where(mask, a, b)

    def cumsum(self, a: Array) -> Array:
        return self.xp.cumsum(a, dtype=self.xp.int64)

    def isin(self, a: Array, values: Array) -> Array:
        return self.xp.isin(a, values)

    def first_true(self, mask: Array) -> tuple[Array, Array]:
        """``argmax`` along axis 1, and whether each row's first maximum is True.

        A row of 8 bools read as one 8-byte word answers ``any`` in one pass (``any(axis=1)`` over
        short rows costs NumPy 3x an ``argmax``); other shapes read the entry ``argmax`` chose.
        """
        xp = self.xp
        first = mask.argmax(axis=1).astype(xp.int64, copy=False)
        if mask.ndim == 2 and mask.shape[1] == 8 and mask.flags.c_contiguous:
            return mask.view(xp.uint64).reshape(-1) != 0, first
        return mask[xp.arange(len(first)), first], first

    def argmax_bool(self, mask: Array) -> Array:
        return self.xp.argmax(mask)

    def device_ints(self, values: object, *, any_width: bool = False) -> Array | None:
        """An ``xp`` integer array as int64 (no copy when it is int64 already)."""
        xp = self.xp
        if isinstance(values, xp.ndarray) and values.ndim == 1 and values.dtype.kind in "iu":
            if values.dtype.kind == "u" and values.dtype.itemsize == 8:
                return None  # uint64 beyond int64: the host path names the value
            return values if any_width else values.astype(xp.int64, copy=False)
        return None

    def cast(self, a: Array, dtype: str) -> Array:
        """``a.astype(dtype)`` (always a copy)."""
        return a.astype(dtype, copy=True)

    def count(self, mask: Array) -> int:
        return int(self.xp.count_nonzero(mask))

    def any(self, mask: Array) -> bool:
        """``count_nonzero`` as a bool (on NumPy a quarter of ``mask.any()``'s cost on short arrays)."""
        return bool(self.xp.count_nonzero(mask))

    def synchronize(self) -> None:
        """Wait for the current CUDA stream on CuPy; nothing on NumPy."""
        if self.is_device:  # pragma: no cover - needs a CUDA device
            self.xp.cuda.get_current_stream().synchronize()
