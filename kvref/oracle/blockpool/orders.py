"""The oracle's cache orders: what the eviction policies read (chapter 04).

``evictable``: the cached blocks in release order (lru, EVICT-401); ``registered``: hashed blocks
in registration order, kept under ``fifo`` only (EVICT-406); ``hashed_in_use``: hashed blocks
with references (what lru-leaf's reclaimable count reads); ``access``: each block's last access,
a position on ``access_clock`` (lru-leaf-access, EVICT-411).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kvref.contract.policies import EvictionPolicy

__all__ = ["CacheOrders"]


class CacheOrders:
    """Release, registration and access orders of a pool of ``n`` blocks under ``policy``."""

    def __init__(self, n: int, policy: EvictionPolicy) -> None:
        self.policy = policy
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.registered: OrderedDict[int, None] = OrderedDict()
        self.hashed_in_use: set[int] = set()
        self.access = [-1] * n
        self.access_clock = 0

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
        """The cached blocks, least recently accessed first (EVICT-411)."""
        return sorted(self.evictable, key=self.access.__getitem__)
