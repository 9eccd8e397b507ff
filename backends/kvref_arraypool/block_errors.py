"""What the block pool's array surface records on the device, and what its fused kernels promise (ERR-511).

The error codes a ``free`` or ``acquire`` of :class:`kvref_arraypool.block_arrays.DeviceBlockPool`
writes into its record, with their rules, shared by the array path and by fused kernels
(:class:`BlockKernels`: ``kvref_cuda``'s CUDA C writes the same numbers).
"""

from __future__ import annotations

from typing import Protocol

from kvref.contract.errors import BlockIdError, BlockStateError, InvalidValueError, NotHeldError, ReservedBlockError
from kvref_arraypool.deferred import ErrorKind
from kvref_arraypool.ops import Array

__all__ = [
    "BAD_SLOT",
    "BLOCK_ERRORS",
    "FREE_BLOCK",
    "HELD_ALREADY",
    "NOT_HELD",
    "RANGE",
    "RESERVED",
    "TWICE",
    "BlockKernels",
]

#: The codes (the fused kernels write the same numbers).
RANGE, RESERVED, NOT_HELD, BAD_SLOT, TWICE, FREE_BLOCK, HELD_ALREADY = 1, 2, 3, 4, 5, 6, 7

#: The errors a device-checked ``free`` or ``acquire`` records (ERR-511), by code.
BLOCK_ERRORS = {
    RANGE: ErrorKind("POOL-103", BlockIdError, "is outside the pool's block ids"),
    RESERVED: ErrorKind("POOL-118", ReservedBlockError, "is a reserved block, never handed out"),
    NOT_HELD: ErrorKind(
        "POOL-108", NotHeldError, "is a block its request slot holds no reference to (a double or foreign free?)"
    ),
    BAD_SLOT: ErrorKind("ERR-517", InvalidValueError, "is a request slot outside [0, max_requests)"),
    TWICE: ErrorKind("POOL-109", NotHeldError, "names a (block, request slot) pair the call named before"),
    FREE_BLOCK: ErrorKind("POOL-119", BlockStateError, "is a free block, whose content is undefined"),
    HELD_ALREADY: ErrorKind(
        "ERR-518", InvalidValueError, "is a block its request slot holds already (one reference per slot and block)"
    ),
}


class BlockKernels(Protocol):
    """Fused one-slot calls for one array library and device (:class:`kvref_cuda.CudaBlockKernels`).

    Each does in one launch what the array path of :class:`DeviceBlockPool` does for a call
    whose entries all belong to one request slot, over the same arrays and record, with the same
    result; ``call`` (a ``free``, or an ``acquire``) takes up to ``max_call`` entries.
    """

    name: str
    max_call: int

    def allocate(
        self,
        *,
        stack: Array,
        ref: Array,
        gen: Array,
        bits: Array,
        record: Array,
        total: int,
        words: int,
        slot: int,
        dtype: str,
    ) -> Array:
        """Pop ``total`` blocks for ``slot``; the fresh ids in ``dtype``."""

    def call(
        self,
        *,
        ids: Array,
        ref: Array,
        bits: Array,
        reserved: Array,
        first: Array,
        stack: Array,
        record: Array,
        num_blocks: int,
        words: int,
        slot: int,
        free: bool,
    ) -> None:
        """Check and apply a ``free`` (``free=True``) or an ``acquire`` of ``ids`` by ``slot``."""
