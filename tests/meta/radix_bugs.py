"""Planted bugs of chapter 06: the oracle's allocator and radix tree, each with one bug a real
engine's token-slot allocator or radix cache has shipped (SGLang, pymllm, a bitmask slot allocator).

The allocator bugs are backends the conformance suite loads by name (``tests.meta.radix_bugs:X``:
the oracle's pools, a buggy ``create_slots``); the tree bugs are trees the scheduler machine of
``tests/test_radix_machine.py`` drives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvref.contract.events import BlockStored
from kvref.contract.extend import plan_extend
from kvref.contract.hashing import hash_token_blocks
from kvref.oracle.backend import OracleBackend
from kvref.oracle.radix import OracleRadixCache, OracleSlotAllocator
from kvref.oracle.radix.events import PageEvents
from kvref.oracle.radix.nodes import Node

# ----------------------------------------------------------------- allocators


class SlotDoubleFree(OracleSlotAllocator):
    """A freed slot is freed again without complaint and handed out twice (SGLang #40305)."""

    def _pages_of(self, slots: Sequence[int], op: str) -> list[int]:
        ps = self.page_size
        return list(dict.fromkeys(s // ps for s in slots))


class PaddingSlotFreed(OracleSlotAllocator):
    """``free([0])`` puts the padding page on the free list (SGLang's allocators check nothing)."""

    def free(self, indices: Any) -> None:
        named = list(indices)
        if any(s < self.page_size for s in named):
            (self._released if self.sort else self._free).extend([0])
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


class SharedPathCountedPerLock(OracleRadixCache):
    """A path a second request locks is counted in ``evictable_size`` as well as in ``protected_size``,
    as if each request owned its own copy: an idle check of free plus evictable against the pool's
    size then reports a leak that is not there (SGLang's double-counted shared pages)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counted_again: dict[int, int] = {}

    def lock(self, node: Any) -> Any:
        before = self.protected_size()
        receipt = super().lock(node)
        if self.protected_size() == before:  # the path was locked already: a second request shares it
            self._counted_again[id(receipt)] = len(self.node_tokens(node))
        return receipt

    def unlock(self, receipt: Any) -> None:
        super().unlock(receipt)
        self._counted_again.pop(id(receipt), None)

    def evictable_size(self) -> int:
        return super().evictable_size() + sum(self._counted_again.values())


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
        match = self._peek(self._roots[namespace], self._aligned(tokens, "insert"))[0]  # the deepest full node
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


# ----------------------------------------------------------------- events


class PagesHashedAlone(PageEvents):
    """Each page is hashed from its own tokens and stored with no parent: a router cannot chain the
    pages of a key, and two keys sharing a page at different depths report one hash (RADIX-635)."""

    def stored(self, node: Node) -> None:
        if self.enabled:
            for at in range(0, len(node.tokens), self.page):
                self._events.append(
                    BlockStored(hash_token_blocks(node.tokens[at : at + self.page], self.page)[0], None)
                )


class NamespaceUnsalted(PageEvents):
    """Page hashes leave the namespace out: two adapters' equal keys report the same hashes (RADIX-636)."""

    def page_hashes(self, node: Node) -> tuple[int | None, list[int]]:
        tokens = [t for n in reversed(list(node.path())) for t in n.tokens]
        hashes = hash_token_blocks(tokens, self.page)
        first = len(hashes) - len(node.tokens) // self.page
        return (hashes[first - 1] if first else None), hashes[first:]


class EventTree(OracleRadixCache):
    """A tree whose events come from ``page_events``, a planted :class:`PageEvents`."""

    page_events: type[PageEvents] = PageEvents

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._events = self.page_events(self._events.page, enabled=self._events.enabled)


class SplitReportsPages(OracleRadixCache):
    """A split reports the node it cuts as removed and both halves as stored, though no page changed
    (RADIX-637): a consumer counting copies sees the pages dropped and cached again."""

    def _split(self, child: Node, at: int) -> Node:
        self._events.removed(child)
        head = super()._split(child, at)
        self._events.stored(head)
        self._events.stored(child)
        return head


def _radix_backend(name: str, tree: type[OracleRadixCache]) -> type[OracleBackend]:
    class PlantedRadixBackend(OracleBackend):
        def create_radix(self, size: int, **options: Any) -> tuple[OracleSlotAllocator, OracleRadixCache]:
            slots, _ = super().create_radix(size, **options)  # the oracle's checks of the options, then the bug
            kept = {k: options[k] for k in ("policy", "max_tokens", "enable_events") if k in options}
            return slots, tree(slots, **kept)

    PlantedRadixBackend.name = name
    PlantedRadixBackend.__name__ = PlantedRadixBackend.__qualname__ = name + "Backend"
    return PlantedRadixBackend


class PriorityDropped(OracleRadixCache):
    """``insert`` drops the priority it is given, as a caller that does not pass it on does: under
    ``priority`` the tree evicts by recency alone."""

    def insert(self, tokens: Any, slots: Any, *, namespace: Any = None, priority: Any = 0) -> int:
        return super().insert(tokens, slots, namespace=namespace)


PagesHashedAloneTree = type("PagesHashedAloneTree", (EventTree,), {"page_events": PagesHashedAlone})
NamespaceUnsaltedTree = type("NamespaceUnsaltedTree", (EventTree,), {"page_events": NamespaceUnsalted})

#: Each planted event bug, loaded by name as a backend whose trees have it, and the rule the suite must name.
EVENT_BUGS: dict[str, str] = {
    "PagesHashedAloneEvents": "RADIX-635",
    "NamespaceUnsaltedEvents": "RADIX-636",
    "SplitReportsPagesEvents": "RADIX-637",
}
PagesHashedAloneEvents = _radix_backend("PagesHashedAloneEvents", PagesHashedAloneTree)
NamespaceUnsaltedEvents = _radix_backend("NamespaceUnsaltedEvents", NamespaceUnsaltedTree)
SplitReportsPagesEvents = _radix_backend("SplitReportsPagesEvents", SplitReportsPages)

#: Each planted tree bug and the rule the scheduler machine must name.
TREE_BUGS: dict[type[OracleRadixCache], str] = {
    EvictWhileLocked: "RADIX-625",
    SharedPathCountedPerLock: "RADIX-625",
    SplitDropsLocks: "RADIX-624",
    InsertOverwrites: "RADIX-626",
    NamespaceIgnored: "RADIX-622",
    UnlockUnchecked: "RADIX-624",
    RemovalsUnreported: "RADIX-634",
}

#: Each planted eviction-order bug, loaded by name as a backend whose trees have it, and the rule the suite must name.
ORDER_BUGS: dict[str, str] = {"PriorityDroppedOrder": "RADIX-628"}
PriorityDroppedOrder = _radix_backend("PriorityDroppedOrder", PriorityDropped)
