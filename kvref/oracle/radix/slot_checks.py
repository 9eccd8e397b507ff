"""RADIX-626 for the oracle's radix tree: the slots an insert would store, checked before anything changes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvref.contract.errors import HashConflictError, InvalidValueError, NotHeldError
from kvref.oracle.radix.nodes import Node
from kvref.oracle.radix.records import TokenSlotAllocator

__all__ = ["check_new_slots"]


def check_new_slots(slots: Sequence[int], *, allocator: TokenSlotAllocator, owner: Mapping[int, Node], op: str) -> None:
    """Raise unless ``slots`` are whole allocated pages of ``allocator`` in order, each slot once and
    none held by a node of the tree (``owner``: slot -> node) (RADIX-626)."""
    ps = allocator.page_size
    seen: set[int] = set()
    for i, slot in enumerate(slots):
        if slot in seen or slot in owner:
            where = "twice in this insert" if slot in seen else f"already in the tree (node {owner[slot].ident})"
            raise HashConflictError("RADIX-626", f"{op}: slot {slot} is {where}; a slot holds one token")
        seen.add(slot)
        if not 0 <= slot < (allocator.num_pages + 1) * ps or not allocator.is_allocated(slot):
            raise NotHeldError("RADIX-626", f"{op}: slot {slot} is not an allocated slot of the allocator")
        if slot % ps != i % ps or (i % ps and slot != slots[i - 1] + 1):
            raise InvalidValueError(
                "RADIX-626", f"{op}: slot {slot} at position {i} breaks its page: pages are inserted whole, in order"
            )
