"""The oracle's cache orders: what the eviction policies read (chapter 04).

``evictable``: the cached blocks in release order (lru, EVICT-401); ``registered``: hashed blocks
in registration order, kept under ``fifo`` only (EVICT-406); ``hashed_in_use``: hashed blocks
with references (what lru-leaf's reclaimable count reads); ``access``: each block's last access,
a position on ``access_clock`` (lru-leaf-access, EVICT-411).

Under ``lru-leaf`` and ``lru-leaf-access`` the release order also keeps a heap of its blocks by the
order the policy evicts in (:class:`LeafCandidates`): the release order, or the last access (a
cached block is never accessed while it stays cached: an access pins it, taking it out). Eviction
pops the heap; a block it finds not to be a leaf is dropped, and pushed again when it becomes one
(its hash gets a second copy, or its last resident child leaves: :meth:`CacheOrders.may_be_leaves`).
Each eviction is then O(log n) instead of a pass over every interior block before the first leaf.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from heapq import heapify, heappop, heappush

from kvref.contract.policies import EvictionPolicy

__all__ = ["CacheOrders", "LeafCandidates"]


class LeafCandidates(OrderedDict[int, None]):
    """The release order (an ordered dict of block ids) of a prefix-closed policy, with a heap of
    ``(stamps[b], b)`` entries for its blocks, least stamp first (EVICT-403, EVICT-411).

    ``stamps`` is the block's place in the release order, set here when a block enters it, or,
    with ``stamp_on_release`` off, the orders' ``access`` list (the last access). An entry is live
    while its block is in the order with that stamp; others are dropped when met. Every block of
    the order that may be a leaf has a live entry (:meth:`requeue` is called when one becomes a leaf).
    """

    def __init__(self, stamps: list[int], *, stamp_on_release: bool) -> None:
        super().__init__()
        self.stamps = stamps
        self.stamp_on_release = stamp_on_release
        self.clock = 0
        self.heap: list[tuple[int, int]] = []

    def __setitem__(self, block: int, value: None) -> None:
        if block in self:
            return
        super().__setitem__(block, value)
        if self.stamp_on_release:
            self.stamps[block] = self.clock
            self.clock += 1
        self.push(block)

    def clear(self) -> None:
        """Empty the order and its heap."""
        super().clear()
        self.heap.clear()

    def push(self, block: int) -> None:
        """Push a live entry for ``block``; a heap grown to mostly dead entries is rebuilt instead,
        with one live entry per block of the order."""
        heap, stamps = self.heap, self.stamps
        if len(heap) < 2 * len(self) + 64:
            heappush(heap, (stamps[block], block))
        else:
            heap[:] = [(stamps[b], b) for b in self]
            heapify(heap)

    def requeue(self, blocks: Iterable[int]) -> None:
        """Push a live entry for each of ``blocks`` still in the order (one that may have become a leaf)."""
        for b in blocks:
            if b in self:
                self.push(b)

    def pop_least(self) -> int | None:
        """The block of the least live entry, its entry popped (the block stays in the order); None
        when no live entry is left."""
        heap, stamps = self.heap, self.stamps
        while heap:
            stamp, block = heappop(heap)
            if block in self and stamps[block] == stamp:
                return block
        return None


class CacheOrders:
    """Release, registration and access orders of a pool of ``n`` blocks under ``policy``."""

    def __init__(self, n: int, policy: EvictionPolicy) -> None:
        self.policy = policy
        self.access = [-1] * n
        self.access_clock = 0
        self.evictable: OrderedDict[int, None] = (
            LeafCandidates(self.access if policy.by_access else [0] * n, stamp_on_release=not policy.by_access)
            if policy.prefix_closed
            else OrderedDict()
        )
        self.registered: OrderedDict[int, None] = OrderedDict()
        self.hashed_in_use: set[int] = set()

    def stamp_access(self, ids: Iterable[int]) -> None:
        """Mark the blocks one call handed out or pinned as accessed now, in ascending id order
        (EVICT-411); only ``lru-leaf-access`` reads the marks."""
        if self.policy.by_access:
            access, clock = self.access, self.access_clock
            for b in sorted(set(ids)):
                access[b] = clock
                clock += 1
            self.access_clock = clock

    def by_access(self) -> list[int]:
        """The cached blocks, least recently accessed first (EVICT-411); ties (never, but for blocks
        never accessed) in ascending id order."""
        access = self.access
        return sorted(self.evictable, key=lambda b: (access[b], b))

    def may_be_leaves(self, blocks: Iterable[int]) -> None:
        """``blocks`` (the copies of one hash) may have just become leaves: their hash got a second
        copy, or lost its last resident child. Under lru-leaf and lru-leaf-access, their cached ones
        go back into the eviction heap (:meth:`LeafCandidates.requeue`)."""
        evictable = self.evictable
        if isinstance(evictable, LeafCandidates):
            evictable.requeue(blocks)
