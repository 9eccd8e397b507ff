"""The oracle's reference counting: hand out, check, release and pin references (chapter 01).

Each call checks everything first (ERR-501): a plain pass over the arguments finds whether
anything is wrong, and the explainers of :mod:`kvref.contract.checks` name the first thing, in
the order of checks every implementation shares (ERR-509), reading the pool's public view
(``view``). Then the state changes, a few list and dict operations per block.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

from kvref.contract.checks import BlockView, explain_acquire, explain_generations, explain_release
from kvref.contract.errors import OutOfBlocksError
from kvref.contract.events import CacheCounters
from kvref.contract.policies import EvictionPolicy
from kvref.oracle.blockpool.blocks import BlockLists, take_free
from kvref.oracle.blockpool.eviction import Eviction

__all__ = ["ReferenceCounts"]

_REF_ZERO = EvictionPolicy.REF_ZERO


class ReferenceCounts:
    """References per block and per holder: allocate, release and pin, each checked first (POOL-104..POOL-119)."""

    def __init__(self, blocks: BlockLists, eviction: Eviction, counters: CacheCounters, view: BlockView) -> None:
        self.blocks = blocks
        self.eviction = eviction
        self.orders = eviction.orders
        self.index = eviction.index
        self.counters = counters
        self.view = view

    def allocate(self, n: int, holder: Hashable, op: str) -> list[int]:
        """``n`` (>= 1) unhashed blocks with one reference each for ``holder``, or OutOfBlocksError
        taking nothing (POOL-105). Free blocks first; cached ones are evicted for the shortfall
        only (EVICT-408) and come back without their hash (PFX-312)."""
        blocks = self.blocks
        free = blocks.free
        victims: list[int] = []
        if n > len(free):
            reclaimable = self.eviction.reclaimable()
            if n > len(free) + reclaimable:
                raise OutOfBlocksError(
                    "POOL-105",
                    f"{op}: asked for {n} blocks, {len(free) + reclaimable} available "
                    f"({len(free)} free + {reclaimable} evictable) of {blocks.num_usable} usable; "
                    "nothing was taken",
                )
            victims = self.eviction.victims(n - len(free))
        ids = take_free(free, n - len(victims))
        ids.extend(victims)
        ref, gen, holders = blocks.ref, blocks.gen, blocks.holders
        for b in ids:
            ref[b] = 1
            gen[b] += 1
            holders[b] = {holder: 1}
        blocks.add_held(holder, n)
        self.orders.stamp_access(ids)
        return ids

    def check_generations(self, ids: list[int], gens: list[int], op: str) -> None:
        """POOL-112: every in-range, unreserved block's generation matches the caller's."""
        blocks = self.blocks
        n, gen, reserved = blocks.n, blocks.gen, blocks.is_reserved
        for b, g in zip(ids, gens, strict=True):
            if 0 <= b < n and not reserved[b] and gen[b] != g:
                explain_generations(self.view, ids, gens, op)

    def check_release(self, ids: list[int], holder: Hashable, gens: list[int] | None, op: str) -> None:
        """Every id is a block ``holder`` holds, as often as it occurs (POOL-108, POOL-109, POOL-112)."""
        if gens is not None:
            self.check_generations(ids, gens, op)
        n, holders = self.blocks.n, self.blocks.holders
        for b in ids:
            held = holders[b] if 0 <= b < n else None
            if held is None or holder not in held:
                explain_release(self.view, ids, holder, op)
        if len(ids) > 1 and len(set(ids)) != len(ids):
            for b, times in Counter(ids).items():
                if times > holders[b][holder]:  # type: ignore[index]
                    explain_release(self.view, ids, holder, op)

    def release(self, ids: list[int], holder: Hashable) -> None:
        """Drop one of ``holder``'s references per position of checked ``ids``, in order: a block whose
        last reference goes becomes free, or cached if hashed (PFX-311), or leaves the cache under
        ``ref-zero`` (EVICT-405); earlier positions count as released earlier (EVICT-401)."""
        blocks = self.blocks
        ref, holders, hashes, free = blocks.ref, blocks.holders, blocks.hash, blocks.free
        evictable, hashed_in_use = self.orders.evictable, self.orders.hashed_in_use
        ref_zero = self.orders.policy is _REF_ZERO
        kept = self.index.kept
        dropped: list[int] = []  # ref-zero: hashed blocks whose last reference goes, in order
        for b in ids:
            held = holders[b]
            left = held[holder] - 1  # type: ignore[index]
            if left:
                held[holder] = left  # type: ignore[index]
            else:
                del held[holder]  # type: ignore[union-attr]
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                holders[b] = None
                if hashes[b] is None:
                    free.append(b)
                    continue
                hashed_in_use.discard(b)
                if kept is not None:
                    kept.lose(hashes[b])  # type: ignore[arg-type]
                if ref_zero:
                    dropped.append(b)
                    free.append(b)
                else:
                    evictable[b] = None
        if dropped:
            self.index.unregister(dropped)
            self.counters.evictions += len(dropped)
        if ids:
            blocks.drop_held(holder, len(ids))

    def check_acquire(self, ids: list[int], op: str) -> None:
        """Every id is a block in use or cached (POOL-103, POOL-118, POOL-119)."""
        blocks = self.blocks
        n, ref, hashes, reserved = blocks.n, blocks.ref, blocks.hash, blocks.is_reserved
        for b in ids:
            if b < 0 or b >= n or reserved[b] or (ref[b] == 0 and hashes[b] is None):
                explain_acquire(self.view, ids, op)

    def pin(self, ids: list[int], holder: Hashable) -> None:
        """Add one reference for ``holder`` per position of checked ``ids``; a cached block so pinned
        leaves the eviction order (PFX-310)."""
        blocks = self.blocks
        ref, holders, hashes = blocks.ref, blocks.holders, blocks.hash
        evictable, hashed_in_use = self.orders.evictable, self.orders.hashed_in_use
        kept = self.index.kept
        for b in ids:
            r = ref[b]
            if r == 0:
                del evictable[b]
                hashed_in_use.add(b)
                if kept is not None:
                    kept.gain(hashes[b])  # type: ignore[arg-type]
                holders[b] = {holder: 1}
            else:
                held = holders[b]
                held[holder] = held.get(holder, 0) + 1  # type: ignore[index,union-attr]
            ref[b] = r + 1
        if ids:
            blocks.add_held(holder, len(ids))
            self.orders.stamp_access(ids)
