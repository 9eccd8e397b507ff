"""Chapter 06's token-slot allocator with the list protocol: the array surface, checked after every call.

:class:`ArraySlotAllocator` is what the conformance suite and host callers use. It is a thin
adapter over :class:`~kvref_arraypool.slot_arrays.DeviceSlotAllocator` (one implementation, two
surfaces): ``alloc`` returns a list, and ``free`` calls the array surface's ``free`` and then its
``check()`` (ERR-511), so every refused free raises at once with the oracle's error. On that error
path :func:`kvref.contract.checks.pages_to_free` walks the call on the host to name the first
offending slot in the oracle's words; the refused call changed nothing, so the host sees the very
state the call saw.

A free costs one host read (the verdict and the counts together); ``alloc`` none while the free
list covers it.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise
from typing import Any, SupportsIndex

from kvref.contract.checks import pages_to_free
from kvref.contract.extend import decode_prefixes, plan_extend
from kvref_arraypool.inputs import index_array
from kvref_arraypool.ops import Array, ArrayOps
from kvref_arraypool.slot_arrays import DeviceSlotAllocator, SlotKernels

__all__ = ["ArraySlotAllocator"]


class ArraySlotAllocator:
    """Token slots in pages over device arrays; the oracle's allocator, slot for slot (chapter 06)."""

    def __init__(
        self,
        size: SupportsIndex,
        *,
        ops: ArrayOps,
        page_size: SupportsIndex = 1,
        sort: bool = True,
        kernels: SlotKernels | None = None,
    ) -> None:
        self._adopt(DeviceSlotAllocator(size, ops=ops, page_size=page_size, sort=sort, dtype="int64", kernels=kernels))

    @classmethod
    def over(cls, arrays: DeviceSlotAllocator) -> ArraySlotAllocator:
        """The list protocol over an existing array-surface allocator (with fused kernels, say)."""
        self = cls.__new__(cls)
        self._adopt(arrays)
        return self

    def _adopt(self, arrays: DeviceSlotAllocator) -> None:
        #: The array surface underneath (ERR-510..ERR-514): what an engine on a GPU calls.
        self.arrays = arrays
        self.ops = arrays.ops
        self.size, self.page_size, self.num_pages, self.sort = (
            self.arrays.size,
            self.arrays.page_size,
            self.arrays.num_pages,
            self.arrays.sort,
        )

    def available_size(self) -> int:
        """Slots of free and released pages, not those of an open group (RADIX-605)."""
        return self.arrays.available_size()

    @property
    def in_group(self) -> bool:
        """Whether a free group is open (RADIX-607)."""
        return self.arrays.in_group

    def alloc_ids(self, need_size: SupportsIndex) -> Array | None:
        """``alloc`` returning the slots as a fresh int64 device array, or None (RADIX-603)."""
        return self.arrays.alloc(need_size)

    def alloc(self, need_size: SupportsIndex) -> list[int] | None:
        """``need_size`` slots in whole pages as a list, or None when fewer are available (RADIX-603, RADIX-604)."""
        got = self.arrays.alloc(need_size)
        return None if got is None else self.ops.tolist(got)

    def alloc_many(self, need_sizes: Any) -> list[list[int]] | None:
        """One step's allocations: the slots of one ``alloc(sum)``, split per count, or None (RADIX-612)."""
        got = self.arrays.alloc_many(need_sizes)
        if got is None:
            return None
        slots, offsets = got
        flat = self.ops.tolist(slots)
        return [flat[start:end] for start, end in pairwise(offsets)]

    def alloc_extend(self, prefix_lens: object, seq_lens: object, last_locs: object) -> list[int] | None:
        """A step's slots for tokens ``[prefix_len, seq_len)`` of each request, or None (RADIX-613, RADIX-614)."""
        return self._extend(prefix_lens, seq_lens, last_locs, "alloc_extend")

    def alloc_decode(self, seq_lens: object, last_locs: object) -> list[int] | None:
        """One slot per request for its token ``seq_len - 1`` (RADIX-615)."""
        prefixes, seq = decode_prefixes(seq_lens)
        return self._extend(prefixes, seq, last_locs, "alloc_decode")

    def _extend(self, prefix_lens: object, seq_lens: object, last_locs: object, op: str) -> list[int] | None:
        plan = plan_extend(prefix_lens, seq_lens, last_locs, self.arrays.page_size, op, held=self.arrays.pages_held)
        fresh = self.alloc(plan.new_pages * self.arrays.page_size)
        return None if fresh is None else plan.compose(fresh)

    def free(self, indices: Iterable[SupportsIndex] | Array) -> None:
        """Return the pages ``indices`` fall in, each once; the oracle's errors, at once (RADIX-602, RADIX-606)."""
        arrays = self.arrays
        given = self.ops.device_ints(indices)  # a device array, taken as it is (int64: cast once, here)
        items: list[int] | None = None
        if given is None:
            given, items = index_array(indices, op="free", arg="indices")
            if len(given) == 0:
                return
        arrays.free(given)

        def explain() -> None:
            named = items if items is not None else self.ops.tolist(given)
            allocated = arrays.allocated_pages()
            pages_to_free(named, self.page_size, self.num_pages, lambda p: bool(allocated[p]), arrays.pending_pages())

        arrays.check(explain)

    def free_group_begin(self) -> None:
        """Open a free group (RADIX-607)."""
        self.arrays.free_group_begin()

    def free_group_end(self) -> None:
        """Release the open group's pages as one free of their concatenation (RADIX-607)."""
        self.arrays.free_group_end()

    def clear(self) -> None:
        """Every page free in ascending order; versions kept (RADIX-609)."""
        self.arrays.clear()

    def version(self, slot: SupportsIndex) -> int:
        """How many times ``slot`` has been handed out (RADIX-608); a host read."""
        return self.arrays.version(slot)

    def is_current(self, slot: SupportsIndex, version: SupportsIndex) -> bool:
        """Whether ``(slot, version)`` names the slot's current allocation (RADIX-608); a host read."""
        return self.arrays.is_current(slot, version)

    def is_allocated(self, slot: SupportsIndex) -> bool:
        """Whether ``slot``'s page is allocated; a host read."""
        return self.arrays.is_allocated(slot)

    def snapshot(self) -> dict[str, Any]:
        """The free order, the allocated pages and the versions, for before/after comparison."""
        return self.arrays.snapshot()

    def __repr__(self) -> str:
        return (
            f"ArraySlotAllocator(size={self.size}, page_size={self.page_size}, sort={self.sort}, "
            f"device={self.ops.device!r}, available={self.available_size()})"
        )
