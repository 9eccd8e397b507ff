"""Planted bugs of chapter 06: the oracle's allocator and radix tree, each with one bug a real
engine's token-slot allocator or radix cache has shipped (SGLang, pymllm, a bitmask slot allocator).

The allocator bugs are backends the conformance suite loads by name (``tests.meta.radix_bugs:X``:
the oracle's pools, a buggy ``create_slots``); the tree bugs are trees the scheduler machine of
``tests/test_radix_machine.py`` drives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvref.contract.extend import plan_extend
from kvref.oracle.backend import OracleBackend
from kvref.oracle.radix import OracleRadixCache, OracleSlotAllocator
from kvref.oracle.radix.nodes import Node

# ----------------------------------------------------------------- allocators


class SlotDoubleFree(OracleSlotAllocator):
    """A freed slot is freed again without complaint and handed out twice (SGLang #40305)."""

    def _pages_of(self, slots: Sequence[int], op: str) -> list[int]:
        ps = self.page_size
        return list(dict.fromkeys(s // ps for s in slots))

    def _release(self, pages: Any) -> None:
        target = self._released if self.sort else self._free
        for p in pages:
            self._allocated[p] = 0
            target.append(p)


class PaddingSlotFreed(OracleSlotAllocator):
    """``free([0])`` puts the padding page on the free list (SGLang's allocators check nothing)."""

    def free(self, indices: Any) -> None:
        named = list(indices)
        if any(s < self.page_size for s in named):
            (self._released if self.sort else self._free).append(0)
            named = [s for s in named if s >= self.page_size]
        super().free(named)


class ShortMisalignedAlloc(OracleSlotAllocator):
    """``alloc(n)`` takes ``n // page_size`` pages: a misaligned request gets a short result (SGLang's
    paged allocator outside its debug mode)."""

    def alloc(self, need_size: Any) -> list[int] | None:
        n = int(need_size)
        return super().alloc(n // self.page_size * self.page_size)


class GroupCountedEarly(OracleSlotAllocator):
    """``available_size`` counts pages freed inside an open group before the group ends."""

    def available_size(self) -> int:
        return super().available_size() + len(self._group or ()) * self.page_size


class UnsortedMerge(OracleSlotAllocator):
    """With sort on, released pages are merged unsorted: the lowest-first order is lost."""

    def _merge(self) -> None:
        self._free.extend(self._released)
        self._released.clear()


class MergeBeforeRefusing(OracleSlotAllocator):
    """A too-large alloc merges the release list in before it refuses: the refusal changes the free order
    (SGLang's TokenToKVPoolAllocator with need_sort)."""

    def alloc(self, need_size: Any) -> list[int] | None:
        if self.sort and need_size // self.page_size > len(self._free):
            self._merge()
        return super().alloc(need_size)


class ExtendSkipsOwnPage(OracleSlotAllocator):
    """``alloc_extend`` takes new pages for every token: a request's partly filled last page is left
    with holes, and its tokens are no longer page-contiguous (a slip of the phase-1 count)."""

    def alloc_extend(self, prefix_lens: Any, seq_lens: Any, last_locs: Any) -> list[int] | None:
        pre, seq = list(prefix_lens), list(seq_lens)
        aligned = [(p // self.page_size) * self.page_size for p in pre]
        return super().alloc_extend(aligned, [s - p + a for s, p, a in zip(seq, pre, aligned, strict=True)], last_locs)


class ExtendTrustsLastLoc(OracleSlotAllocator):
    """``alloc_extend`` never looks at ``last_loc``'s page: a stale one hands out slots of a page another
    request holds, or a free one (SGLang checks only its alignment, and only in debug mode)."""

    def _extend(self, prefix_lens: Any, seq_lens: Any, last_locs: Any, op: str) -> list[int] | None:
        plan = plan_extend(prefix_lens, seq_lens, last_locs, self.page_size, op, held=lambda locs: [True] * len(locs))
        fresh = self.alloc(plan.new_pages * self.page_size)
        return None if fresh is None else plan.compose(fresh)


def _backend(allocator: type[OracleSlotAllocator]) -> type[OracleBackend]:
    class PlantedSlotsBackend(OracleBackend):
        name = allocator.__name__

        def create_slots(
            self, size: int, *, page_size: int = 1, sort: bool = True, device: str | None = None
        ) -> OracleSlotAllocator:
            return allocator(size, page_size=page_size, sort=sort)

    PlantedSlotsBackend.__name__ = PlantedSlotsBackend.__qualname__ = allocator.__name__ + "Backend"
    return PlantedSlotsBackend


#: Each planted allocator bug and the rule the suite must name.
SLOT_BUGS: dict[str, str] = {
    "ExtendSkipsOwnPage": "RADIX-613",
    "ExtendTrustsLastLoc": "RADIX-614",
    "SlotDoubleFree": "RADIX-606",
    "PaddingSlotFreed": "RADIX-602",
    "ShortMisalignedAlloc": "RADIX-604",
    "GroupCountedEarly": "RADIX-605",
    "UnsortedMerge": "RADIX-610",
    "MergeBeforeRefusing": "RADIX-603",
}

for _name in SLOT_BUGS:
    globals()[_name] = _backend(globals()[_name])

# ----------------------------------------------------------------------- trees


class EvictWhileLocked(OracleRadixCache):
    """Eviction frees leaves whatever their locks: a running request's prefix is freed under it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._leaves.evictable = lambda node: node.alive and not node.is_root and not node.children  # type: ignore[method-assign]


class SplitDropsLocks(OracleRadixCache):
    """A node split where a prefix ends gives its new head no locks: the locked path's head is evictable."""

    def _split(self, child: Node, at: int) -> Node:
        head = super()._split(child, at)
        if head.locks:
            self._protected -= len(head.tokens)
        head.locks = 0
        self._leaves.offer(head)
        return head


class InsertOverwrites(OracleRadixCache):
    """Insert stores the caller's slots over the cached part of the key: cached values are replaced."""

    def insert(self, tokens: Any, slots: Any, *, namespace: Any = None, priority: Any = 0) -> int:
        have = super().insert(tokens, slots, namespace=namespace, priority=priority)
        match = self._peek(self._roots[namespace], tuple(tokens))[0]  # the deepest full node
        path = list(reversed(list(match.path())))
        at = 0
        for node in path:
            size = len(node.tokens)
            if at + size <= have:
                node.slots = list(slots)[at : at + size]
            at += size
        return have


class NamespaceIgnored(OracleRadixCache):
    """Every namespace shares one tree: an adapter's prefix serves another's request (SGLang #24638)."""

    def match(self, tokens: Any, *, namespace: Any = None) -> Any:
        return super().match(tokens, namespace=None)

    def insert(self, tokens: Any, slots: Any, *, namespace: Any = None, priority: Any = 0) -> int:
        return super().insert(tokens, slots, namespace=None, priority=priority)


class UnlockUnchecked(OracleRadixCache):
    """``unlock`` of a receipt already used decrements the locks again: counts go negative (SGLang's
    ``dec_lock_ref`` has no check; mllm #656)."""

    def unlock(self, receipt: Any) -> None:
        target = self._receipts.pop(receipt.ident, None) or self._nodes.get(receipt.node)
        if target is None:
            return
        for n in target.path():
            n.locks -= 1
            if n.locks == 0:
                self._protected -= len(n.tokens)
            self._leaves.offer(n)


class RemovalsUnreported(OracleRadixCache):
    """An eviction's pages are never reported removed (vLLM's PFX-317 deviation in a radix tree's
    events): a router mirroring the events keeps routing to pages the cache dropped."""

    def take_events(self) -> list[Any]:
        return [e for e in super().take_events() if type(e).__name__ != "BlockRemoved"]


#: Each planted tree bug and the rule the scheduler machine must name.
TREE_BUGS: dict[type[OracleRadixCache], str] = {
    EvictWhileLocked: "RADIX-625",
    SplitDropsLocks: "RADIX-624",
    InsertOverwrites: "RADIX-626",
    NamespaceIgnored: "RADIX-622",
    UnlockUnchecked: "RADIX-624",
    RemovalsUnreported: "RADIX-634",
}
