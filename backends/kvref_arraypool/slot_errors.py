"""What the token-slot allocator's array surface records on the device, and what its fused kernels promise.

The error codes a ``free`` of :class:`kvref_arraypool.slot_arrays.DeviceSlotAllocator` writes into
its record (ERR-511), with their rules, shared by the array path and by fused kernels
(:class:`SlotKernels`: ``kvref_cuda``'s CUDA C, or a test's stand-in).
"""

from __future__ import annotations

from typing import Protocol

from kvref.contract.errors import BlockIdError, NotHeldError, ReservedBlockError
from kvref_arraypool.deferred import ErrorKind
from kvref_arraypool.ops import Array

__all__ = ["SLOT_ERRORS", "SlotKernels"]

#: The errors a device-checked ``free`` records (ERR-511), by code; RADIX-606 and RADIX-602.
SLOT_ERRORS = {
    1: ErrorKind("RADIX-606", BlockIdError, "is out of range"),
    2: ErrorKind("RADIX-602", ReservedBlockError, "is in page 0, the padding page, never handed out"),
    3: ErrorKind(
        "RADIX-606",
        NotHeldError,
        "is in a page that is not allocated or was freed earlier in the open group (a double free?)",
    ),
}


class SlotKernels(Protocol):
    """Fused ``alloc`` and ``free`` for one array library and device (:class:`kvref_cuda.CudaSlotKernels`).

    Each does in one launch what the array path of :class:`DeviceSlotAllocator` does, over the
    same arrays and record, with the same result; ``free`` handles up to ``max_free`` entries and,
    in an open group, returns each entry's page and whether it was kept (marked); else None.
    """

    name: str
    max_free: int

    def alloc(
        self,
        *,
        ring: Array,
        state: Array,
        version: Array,
        record: Array,
        head: int,
        want: int,
        num_pages: int,
        page_size: int,
        dtype: str,
    ) -> Array:
        """Take ``want`` pages from ``ring`` at ``head``; the fresh slots in ``dtype``."""

    def free(
        self,
        *,
        slots: Array,
        state: Array,
        first: Array,
        ring: Array,
        released: Array,
        record: Array,
        head: int,
        num_pages: int,
        page_size: int,
        sort: bool,
        group: bool,
    ) -> tuple[Array, Array] | None:
        """Check ``slots`` and release (or, in a group, mark) their pages; in a group, each page and kept flag."""

    def free_then_alloc(
        self,
        *,
        slots: Array,
        state: Array,
        first: Array,
        ring: Array,
        released: Array,
        record: Array,
        version: Array,
        head: int,
        want: int,
        num_pages: int,
        page_size: int,
        sort: bool,
        dtype: str,
    ) -> Array:
        """``free`` of ``slots`` (no group open) then ``alloc`` of ``want`` pages at ``head``, as the two
        calls would (RADIX-616): in one launch where the kernels fuse them."""
