"""The array core's cache orders: release, registration and access, and the count of cached blocks (chapter 04).

:class:`CacheOrders` keeps the release order of cached blocks (lru, EVICT-401) and the
registration order of hashed blocks (fifo, EVICT-406) as :class:`~kvref_arraypool.queue.StampQueue`
over the blocks' stamps, the stamp clock both share, the access marks of lru-leaf-access
(EVICT-411) and the number of cached blocks, a host counter read without a device sync.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvref.contract.policies import EvictionPolicy
from kvref_arraypool.blocks import BlockArrays
from kvref_arraypool.ops import Array
from kvref_arraypool.queue import StampQueue

__all__ = ["CacheOrders"]

_FIFO = EvictionPolicy.FIFO


class CacheOrders:
    """The orders the policies read, over the blocks' release, registration and access stamps."""

    def __init__(self, blocks: BlockArrays, policy: EvictionPolicy) -> None:
        self.ops = blocks.ops
        self.blocks = blocks
        self.policy = policy
        self.lru = StampQueue(blocks.ops, blocks.released, 2 * blocks.n + 64)
        self.fifo = StampQueue(blocks.ops, blocks.registered, 2 * blocks.n + 64)
        self.clock = 0
        self.access_clock = 0
        self.num_cached = 0

    def stamps(self, m: int) -> Array:
        """``m`` fresh stamps, in order."""
        start = self.clock
        self.clock += m
        return self.ops.arange(start, start + m)

    def register(self, ids: Array) -> None:
        """Stamp newly hashed ``ids`` with their registration order (and join the fifo order under fifo)."""
        stamps = self.stamps(len(ids))
        self.blocks.registered[ids] = stamps
        if self.policy is _FIFO:
            self.fifo.push(ids, stamps)

    def cache(self, blocks: Array) -> None:
        """Hashed blocks whose last reference just went, in release order: they join the lru order."""
        k = len(blocks)
        if k:
            stamps = self.stamps(k)
            self.blocks.released[blocks] = stamps
            self.lru.push(blocks, stamps)
            self.num_cached += k

    def uncache(self, blocks: Array) -> None:
        """Cached ``blocks`` pinned again: they leave the lru order (PFX-310)."""
        if len(blocks):
            self.ops.fill_at(self.blocks.released, blocks, -1)
            self.num_cached -= len(blocks)

    def stamp_access(self, ids: Array, sizes: Sequence[int] | None = None) -> None:
        """Mark the blocks one call handed out or pinned as accessed now (EVICT-411): ascending id
        within a call; ``sizes`` splits a batched call into its single calls, in turn. A block named
        twice keeps its latest mark (a scatter-max, as marks only grow)."""
        m = len(ids)
        if not self.policy.by_access or m == 0:
            return
        ops = self.ops
        key = ids
        if sizes is not None and len(sizes) > 1:
            calls = np.repeat(np.arange(len(sizes), dtype=np.int64), np.asarray(sizes, dtype=np.int64))
            key = ops.asarray(calls) * self.blocks.n + ids
        start = self.access_clock
        ops.scatter_max(self.blocks.accessed, ids[ops.argsort(key)], ops.arange(start, start + m))
        self.access_clock = start + m

    def trim(self, left: int) -> None:
        """Advance the orders' heads past the ``left`` blocks that just left them."""
        self.lru.trim(left)
        if self.policy is _FIFO:
            self.fifo.trim(left)

    def cached_blocks(self) -> Array:
        """The cached blocks in release order, oldest first."""
        return self.lru.oldest(self.num_cached) if self.num_cached else self.ops.zeros(0)

    def eviction_order(self) -> list[int]:
        """Cached blocks in release order (lru order), oldest first."""
        return self.ops.tolist(self.cached_blocks())

    def access_order(self) -> list[int]:
        """The cached blocks, least recently accessed first (EVICT-411): what a snapshot compares."""
        cached = self.cached_blocks()
        return self.ops.tolist(cached[self.ops.argsort(self.blocks.accessed[cached])])

    def registration_order(self) -> Array:
        """Hashed blocks in registration order under fifo (empty under the other policies)."""
        return self.fifo.oldest(self.blocks.n) if self.policy is _FIFO else self.ops.zeros(0)

    def clear(self) -> None:
        """No cached block; both orders empty (the clocks go on)."""
        self.num_cached = 0
        self.lru.clear()
        self.fifo.clear()
