"""The oracle's cache orders: what the eviction policies read (chapter 04).

``evictable``: the cached blocks in release order (lru, EVICT-401); ``registered``: hashed blocks
in registration order, kept under ``fifo`` only (EVICT-406); ``hashed_in_use``: hashed blocks
with references (what lru-leaf's reclaimable count reads); ``access``: each block's last access,
a position on ``access_clock`` (lru-leaf-access, EVICT-411).

Under ``lru-leaf-access`` the release order also keeps a heap of its blocks by last access
(:class:`AccessOrdered`): a cached block is never accessed while it stays cached (an access pins
it, taking it out), so its place in the heap holds until it leaves, and entries of blocks that
left are dropped when met. The eviction reads the cached blocks in access order from it in
O(log n) a block instead of sorting them all at every eviction.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from heapq import heapify, heappop, heappush

from kvref.contract.policies import EvictionPolicy

__all__ = ["AccessOrdered", "CacheOrders"]


class AccessOrdered(OrderedDict[int, None]):
    """The release order (an ordered dict of block ids) that also keeps its blocks in a heap by
    ``access[b]``, their last access (EVICT-411): whatever adds a block to the order adds it there."""

    def __init__(self, access: list[int]) -> None:
        super().__init__()
        self.access = access
        self.heap: list[tuple[int, int]] = []

    def __setitem__(self, block: int, value: None) -> None:
        super().__setitem__(block, value)
        heappush(self.heap, (self.access[block], block))

    def clear(self) -> None:
        """Empty the order and its heap."""
        super().clear()
        self.heap.clear()

    def least_recently_accessed(self) -> Iterator[int]:
        """The blocks in the order, least recently accessed first, read off the heap as far as the
        caller goes; entries of blocks that left the order, or came back since, are dropped."""
        heap, access = self.heap, self.access
        if len(heap) > 2 * len(self) + 64:  # mostly entries of blocks that left: rebuild
            heap[:] = [(access[b], b) for b in self]
            heapify(heap)
        taken: list[tuple[int, int]] = []
        try:
            while heap:
                entry = heappop(heap)
                stamp, block = entry
                if block in self and access[block] == stamp and (not taken or entry != taken[-1]):
                    taken.append(entry)
                    yield block
        finally:
            for entry in taken:  # what the caller did not take out of the order is dropped when met
                heappush(heap, entry)


class CacheOrders:
    """Release, registration and access orders of a pool of ``n`` blocks under ``policy``."""

    def __init__(self, n: int, policy: EvictionPolicy) -> None:
        self.policy = policy
        self.access = [-1] * n
        self.access_clock = 0
        self.evictable: OrderedDict[int, None] = AccessOrdered(self.access) if policy.by_access else OrderedDict()
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

    def by_access(self) -> Iterator[int]:
        """The cached blocks, least recently accessed first (EVICT-411), as far as the caller reads;
        ties (never, but for blocks never accessed) in ascending id order."""
        evictable = self.evictable
        if isinstance(evictable, AccessOrdered):
            return evictable.least_recently_accessed()
        return iter(sorted(evictable, key=lambda b: (self.access[b], b)))
