"""One KV cache group's side of the manager (REQ-730..REQ-733): its tables, hits, releases and caching.

:class:`GroupTables` keeps, per request, the group's table (block ids in token order, the null
block standing for a block outside a sliding window) and how many leading positions are cached,
as vLLM's single-type managers do. A full-attention group never skips a token; a sliding-window
group of ``W`` tokens skips the first ``n - W + 1`` of ``n`` computed tokens, releases the blocks
they fill wholly (REQ-730) and finds its hits right to left (REQ-731). A mamba group is a window
of 2 tokens (the state after the last computed token, REQ-757, REQ-758) that also refuses, for one
step, a hit it cached in that step (REQ-759). Every group draws blocks
from its pool (the manager's one pool, or its own: REQ-735), holding them under the request id,
and caches them under its own keys (:func:`~kvref.contract.manager.group_key`, REQ-733).
"""

from __future__ import annotations

import weakref

from kvref.contract.manager import NULL_BLOCK, CacheGroup, group_key
from kvref.contract.protocol import PrefixCache
from kvref.contract.requests import Request

__all__ = ["GroupTables", "longest_common_hit"]


class GroupTables:
    """Group ``index`` of a manager over ``pool``: per-request tables, cached counts and keys."""

    def __init__(self, index: int, spec: CacheGroup, pool: PrefixCache, block_size: int) -> None:
        self.index = index
        self.spec = spec
        self.pool = pool
        self.block_size = block_size
        self.window = spec.window_tokens
        self.is_mamba = spec.kind == "mamba"
        #: Keys a mamba group cached since the scheduler's step began (REQ-759).
        self.cached_this_step: set[int] = set()
        self.tables: dict[str, list[int]] = {}
        self.num_cached: dict[str, int] = {}
        self._keys: weakref.WeakKeyDictionary[Request, list[int]] = weakref.WeakKeyDictionary()

    @property
    def is_full(self) -> bool:
        """Whether the group attends to every token (full attention)."""
        return self.window is None

    def keys(self, req: Request) -> list[int]:
        """The request's block keys in this group, one per full block so far (REQ-733)."""
        hashes = req.block_hashes
        if self.index == 0:
            return hashes
        keys = self._keys.get(req)
        if keys is None:
            keys = self._keys[req] = []
        for i in range(len(keys), len(hashes)):
            keys.append(group_key(hashes[i], self.index))
        return keys

    def skipped_blocks(self, num_tokens: int) -> int:
        """Leading blocks outside the window once ``num_tokens`` tokens are computed (0 for full attention)."""
        if self.window is None:
            return 0
        return max(0, num_tokens - self.window + 1) // self.block_size

    # ------------------------------------------------------------------ hits (REQ-704, REQ-731)

    def find_hit(self, keys: list[int], max_blocks: int) -> list[int]:
        """The group's hit within ``max_blocks`` blocks: the longest cached prefix (full attention), or
        the rightmost run of cached blocks long enough for the window, the null block to its left (REQ-731)."""
        pool = self.pool
        if self.window is None:
            return pool.lookup(keys[:max_blocks]) if max_blocks else []
        need = self.run_length()
        found: list[int] = [NULL_BLOCK] * max_blocks
        run = 0
        for i in range(max_blocks - 1, -1, -1):
            hit = pool.lookup([keys[i]])  # a window's block is cached as a chain of one (REQ-733)
            if not hit:
                run = 0
                continue
            found[i] = hit[0]
            run += 1
            if run >= need:
                return found[: i + run]
        return found[:run]  # no run as long as the window: the cached blocks from the first, if any

    def run_length(self) -> int:
        """Consecutive cached blocks a window's hit needs (REQ-731); 0 for full attention."""
        return 0 if self.window is None else -(-(self.window - 1) // self.block_size)

    def is_hit_honest(self, keys: list[int], hits: list[int]) -> bool:
        """Whether ``hits`` is a hit this group could have found: every block cached under the group's key
        for its position, a window's null blocks only left of its run (REQ-731)."""
        block_hash = self.pool.block_hash
        nulls = 0
        while nulls < len(hits) and hits[nulls] == NULL_BLOCK and self.window is not None:
            nulls += 1
        if nulls and nulls > len(hits) - self.run_length():
            return False
        return all(block_hash(block) == keys[i] for i, block in enumerate(hits[nulls:], start=nulls))

    # ------------------------------------------------------------------ allocation (REQ-708, REQ-709, REQ-730)

    def release_skipped(self, rid: str, num_computed: int) -> None:
        """Replace the blocks wholly outside the window with the null block and release them, tail first (REQ-730)."""
        if self.window is None:
            return
        table = self.tables.get(rid)
        if not table:
            return
        freed: list[int] = []
        for i in range(min(self.skipped_blocks(num_computed), len(table)) - 1, -1, -1):
            if table[i] == NULL_BLOCK:
                break
            freed.append(table[i])
            table[i] = NULL_BLOCK
        if freed:
            self.pool.free(freed, holder=rid)

    def blocks_to_take(self, rid: str, required: int, hits: list[int], num_computed: int) -> int:
        """Available blocks the group takes for ``required`` blocks in all: new ones plus cached hits it pins."""
        table = self.tables.get(rid)
        if table is not None:
            return max(required - len(table), 0)
        if self.is_mamba and hits and self.pool.block_hash(hits[-1]) in self.cached_this_step:
            return self.pool.num_usable + 1  # REQ-759: its state may not be written yet; as vLLM, never fits
        skipped = self.skipped_blocks(num_computed)
        pinned = [b for b in hits[skipped:] if b != NULL_BLOCK]
        ref_count = self.pool.ref_count
        return max(required - max(skipped, len(hits)), 0) + sum(1 for b in pinned if ref_count(b) == 0)

    def adopt(self, rid: str, hits: list[int], num_computed: int) -> None:
        """Start the request's table: null blocks where the window skips, then the hits it pins (REQ-708)."""
        skipped = self.skipped_blocks(num_computed)
        kept = hits[skipped:]
        pinned = [b for b in kept if b != NULL_BLOCK]
        if pinned:
            self.pool.acquire(pinned, holder=rid)
        table = [NULL_BLOCK] * skipped + kept
        self.tables[rid] = table
        self.num_cached[rid] = len(table)

    def extend(self, rid: str, required: int) -> list[int]:
        """Allocate the blocks that bring the table to ``required`` blocks, and return them."""
        table = self.tables[rid]
        count = max(required - len(table), 0)
        fresh = self.pool.allocate(count, holder=rid) if count else []
        table.extend(fresh)
        return fresh

    # ------------------------------------------------------------------ caching (REQ-710), free (REQ-713)

    def cache(self, req: Request, num_tokens: int) -> list[tuple[int, int]]:
        """Register the blocks the first ``num_tokens`` tokens fill wholly; return the (position, key) pairs."""
        rid = req.request_id
        table = self.tables.get(rid)
        if table is None:
            return []
        start, end = self.num_cached[rid], min(num_tokens // self.block_size, len(table))
        if end <= start:
            return []
        keys = self.keys(req)
        positions = [i for i in range(start, end) if table[i] != NULL_BLOCK]
        if self.window is None:  # a chain after the cached prefix, which the request holds
            self.pool.register(table[start:end], keys[start:end], parent_hash=keys[start - 1] if start else None)
        else:  # each block on its own: its key names its whole prefix, and what precedes it may be gone
            for i in positions:
                self.pool.register([table[i]], [keys[i]])
        self.num_cached[rid] = end
        if self.is_mamba:
            self.cached_this_step.update(keys[i] for i in positions)
        return [(i, keys[i]) for i in positions]

    def free(self, rid: str) -> None:
        """Release the request's blocks once each, tail first, and forget its table (REQ-713)."""
        table = self.tables.pop(rid, None)
        self.num_cached.pop(rid, None)
        if table:
            held = [b for b in reversed(table) if b != NULL_BLOCK]
            if held:
                self.pool.free(held, holder=rid)


def longest_common_hit(groups: list[GroupTables], req: Request, limit: int) -> list[list[int]]:
    """Each group's hit, all of the longest length every group serves (REQ-732): full attention
    first, then the sliding windows within it until no group shortens it, then full attention cut."""
    found: dict[int, list[int]] = {}
    length = limit
    for g in groups:
        if g.is_full:
            found[g.index] = g.find_hit(g.keys(req), length)
            length = min(length, len(found[g.index]))
    windows = [g for g in groups if not g.is_full]
    while windows:
        for g in windows:
            found[g.index] = g.find_hit(g.keys(req), length)
        shortest = min(len(found[g.index]) for g in windows)
        if shortest == length:
            break
        length = shortest
    return [found[g.index][:length] for g in groups]
