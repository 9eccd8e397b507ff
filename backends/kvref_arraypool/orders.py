"""The array core's cache orders: release, registration and access, and the count of cached blocks (chapter 04).

:class:`CacheOrders` keeps the release order of cached blocks (lru, EVICT-401) and the
registration order of hashed blocks (fifo, EVICT-406), each a :class:`StampQueue` over the
blocks' stamps, the stamp clock both share, the access marks of lru-leaf-access (EVICT-411) and
the number of cached blocks, a host counter read without a device sync.

A :class:`StampQueue` keeps an order as an append-only array. Each entry is a block and the stamp
it got when it joined; the entry is live while the pool's stamp array still holds that stamp for
the block (``stamp_of[block] == stamp``). Leaving the order is therefore one scalar write in the
pool (``stamp_of[block] = -1``), never a search: dead entries are skipped lazily and dropped when
the head passes them or when the array fills up and is compacted. The oldest live entries are read
window by window from the head, so taking the first ``k`` costs O(k + dead entries skipped),
independent of the pool size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kvref.contract.policies import EvictionPolicy
from kvref_arraypool.blocks import BlockArrays
from kvref_arraypool.host_arrays import positions
from kvref_arraypool.ops import Array, ArrayOps

__all__ = ["CacheOrders", "StampQueue"]

_FIFO = EvictionPolicy.FIFO
Eligible = Callable[[Array], Array]


class StampQueue:
    """Blocks in the order they joined, live while ``stamp_of[block]`` equals their entry's stamp.

    ``capacity`` must be at least twice the most blocks that can be live at once plus the largest
    single push, so a compaction always makes room.
    """

    def __init__(self, ops: ArrayOps, stamp_of: Array, capacity: int) -> None:
        self.ops = ops
        self.stamp_of = stamp_of
        self.blocks = ops.full(capacity, -1)
        self.stamps = ops.full(capacity, -1)
        self.capacity = capacity
        self.head = 0
        self.tail = 0

    def push(self, blocks: Array, stamps: Array) -> None:
        """Append blocks (with their new stamps) at the young end, in order."""
        m = len(blocks)
        if m == 0:
            return
        if self.tail + m > self.capacity:
            self.compact(m)
        self.blocks[self.tail : self.tail + m] = blocks
        self.stamps[self.tail : self.tail + m] = stamps
        self.tail += m

    def _live(self, qb: Array, qs: Array) -> Array:
        return self.stamp_of[qb] == qs

    def compact(self, room: int = 0) -> None:
        """Move the entries to the front, in order, leaving at least ``room`` past the tail.

        While they fill at most half the array, all of them move (one copy: no look at which are
        live, so no host read on a device); otherwise only the live ones. Either way the next
        compaction is at least half an array of pushes away.
        """
        qb, qs = self.blocks[self.head : self.tail], self.stamps[self.head : self.tail]
        span = self.tail - self.head
        if span > self.capacity // 2 or span + room > self.capacity:
            keep = self._live(qb, qs)
            qb, qs = qb[keep], qs[keep]
        n = len(qb)
        self.blocks[:n] = self.ops.copy(qb)
        self.stamps[:n] = self.ops.copy(qs)
        self.head, self.tail = 0, n

    def clear(self) -> None:
        """Forget every entry."""
        self.head = self.tail = 0

    def oldest(self, k: int, eligible: Eligible | None = None) -> Array:
        """Up to ``k`` oldest live blocks (that ``eligible`` accepts), oldest first; changes nothing."""
        blocks, _, _ = self.live_prefix(k, eligible)
        return blocks

    def live_prefix(self, k: int | None, eligible: Eligible | None = None) -> tuple[Array, Array, bool]:
        """The ``k`` oldest live entries (all of them for None) as ``(blocks, stamps, exhausted)``.

        ``exhausted`` is True when the whole order was read, i.e. there are no more.
        """
        ops = self.ops
        parts_b: list[Array] = []
        parts_s: list[Array] = []
        got = 0
        pos = self.head
        truncated = False
        while (k is None or got < k) and pos < self.tail:
            width = self.tail - pos if k is None else min(self.tail - pos, max(2 * (k - got), 256))
            qb = self.blocks[pos : pos + width]
            qs = self.stamps[pos : pos + width]
            ok = self._live(qb, qs)
            if eligible is not None:
                ok &= eligible(qb)
            idx = ops.nonzero(ok)
            if k is not None and len(idx) > k - got:
                idx = idx[: k - got]
                truncated = True  # live entries were left in this window
            parts_b.append(qb[idx])
            parts_s.append(qs[idx])
            got += len(idx)
            pos += width
        exhausted = pos >= self.tail and not truncated
        if not parts_b:
            empty = ops.zeros(0)
            return empty, empty, exhausted
        if len(parts_b) == 1:
            return parts_b[0], parts_s[0], exhausted
        return ops.concat(parts_b), ops.concat(parts_s), exhausted

    def trim(self, left: int = 0) -> None:
        """Advance the head past dead entries (after ``left`` blocks left the order: often the oldest).

        Windows from the head, the first wide enough for ``left`` dead entries and 64 more, each
        doubling the last: one host read each, so usually one in all.
        """
        width = left + 64
        while self.head < self.tail:
            end = min(self.tail, self.head + width)
            window = self._live(self.blocks[self.head : end], self.stamps[self.head : end])
            live = positions(self.ops.to_host(window))
            if len(live):
                self.head += int(live[0])
                return
            self.head = end
            width *= 2


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
