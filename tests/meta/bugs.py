"""Planted-bug implementations: the oracle with one real-world bug each, to test the suite.

Each class below is a kvref backend (usable as ``--kvref-backend tests.meta.bugs:NAME``) whose
pools are the oracle with one bug that a real KV-cache manager has shipped. None of them offers
``check_invariants`` or ``snapshot``: a buggy engine has no oracle inside to catch itself, so
the suite must find each bug from the outside. ``EXPECTED`` maps each bug to the rule the
suite must name when it fails.
"""

from __future__ import annotations

import zlib
from collections.abc import Hashable, Iterable
from itertools import islice
from typing import Any

from kvref.contract.events import BlockRemoved
from kvref.contract.validate import as_block_id_list, as_count, as_holder_list
from kvref.oracle import OracleBlockPool
from kvref.oracle.backend import OracleBackend
from kvref.oracle.blockpool.eviction import Eviction
from kvref.oracle.blockpool.pool import PoolParts
from kvref.oracle.blockpool.prefix import PrefixIndex
from kvref.oracle.blockpool.references import ReferenceCounts

__all__ = ["EXPECTED"]


class _Buggy(OracleBlockPool):
    """The oracle without its self-checks."""

    check_invariants = None  # type: ignore[assignment]
    snapshot = None  # type: ignore[assignment]

    def capabilities(self) -> frozenset[str]:
        return super().capabilities() - {"invariants", "snapshot"}


class DoubleFreeAccepted(_Buggy):
    """Freeing a free block is silently accepted and puts it on the free list a second time,
    so it is later handed out twice (vLLM V0 "Double free!", SGLang #40348)."""

    def free(self, block_ids: Any, *, holder: Hashable = None, generations: Any = None) -> None:
        ids = list(block_ids)
        blocks = self.blocks
        stray = [b for b in ids if 0 < b < blocks.n and blocks.ref[b] == 0 and blocks.hash[b] is None]
        blocks.free.extend(stray)
        super().free([b for b in ids if b not in stray], holder=holder)


class _ScatterRelease(ReferenceCounts):
    def release(self, ids: list[int], holder: Hashable) -> None:
        super().release(list(dict.fromkeys(ids)), holder)


class ScatterFree(_Buggy):
    """A batched release as a tensor scatter, ``ref[ids] -= 1``: a block listed twice in one call
    loses one reference only (Megatron-Core's ``release_memory_blocks`` before ``torch.unique``)."""

    parts = PoolParts(references=_ScatterRelease)


class _OldestFirst(Eviction):
    def victims(self, k: int, *, keep_tree: bool = True) -> list[int]:
        victims = list(islice(self.orders.evictable, k))
        self.index.unregister(victims, keep_tree=keep_tree)
        self.counters.evictions += k
        return victims

    def reclaimable(self) -> int:
        return len(self.orders.evictable)


class LeafIgnored(_Buggy):
    """lru-leaf evicts the least recently released block whatever its children: a parent leaves
    before its child (Megatron-Core before "only evict child blocks")."""

    parts = PoolParts(eviction=_OldestFirst)


class _AnyHolderReleases(ReferenceCounts):
    def check_release(self, ids: list[int], holder: Hashable, gens: Any, op: str) -> None:
        for b in ids:
            if not 0 <= b < self.blocks.n or self.blocks.ref[b] == 0:
                super().check_release(ids, holder, gens, op)

    def release(self, ids: list[int], holder: Hashable) -> None:
        for b in ids:
            held = self.blocks.holders[b]
            owner = holder if held and holder in held else next(iter(held))  # type: ignore[arg-type]
            super().release([b], owner)


class _HolderKeptAtZero(ReferenceCounts):
    def release(self, ids: list[int], holder: Hashable) -> None:
        super().release(ids, holder)
        for b in ids:
            held = self.blocks.holders[b]
            if held and holder not in held:  # still held by another
                held[holder] = 0  # the entry stays, and a holder at zero passes the holder check


class SecondReleaseBySameHolder(_Buggy):
    """A holder's entry stays at zero after its last release of a shared block, so the check that it
    holds the block passes again: its second release takes another holder's reference."""

    parts = PoolParts(references=_HolderKeptAtZero)

    def holders(self, block_id: Any) -> dict[Hashable, int]:
        return {h: k for h, k in super().holders(block_id).items() if k}  # zeros are not shown


class LockCountGoesNegative(_Buggy):
    """Releases are not checked against the holder: a release by someone who holds nothing takes
    a reference from whoever holds one, so a held block can be evicted (SGLang ``dec_lock_ref``)."""

    parts = PoolParts(references=_AnyHolderReleases)


class _IndexKeptOnEviction(Eviction):
    def victims(self, k: int, *, keep_tree: bool = True) -> list[int]:
        victims = list(self.orders.evictable)[:k]
        for b in victims:
            self.blocks.hash[b] = None
            del self.orders.evictable[b]
        self.counters.evictions += k
        return victims

    def reclaimable(self) -> int:
        return len(self.orders.evictable)


class StaleHashAfterEviction(_Buggy):
    """Eviction clears the block but not the hash index, so a later lookup serves the block's new
    content as the old prefix: a stale hit with another request's KV."""

    parts = PoolParts(eviction=_IndexKeptOnEviction)


class PartialAllocation(_Buggy):
    """When short, allocate takes the free blocks it found before raising: they leak."""

    def allocate(self, count: Any, *, holder: Hashable = None) -> list[int]:
        if isinstance(count, int) and count > self.num_available and self.blocks.free:
            super().allocate(len(self.blocks.free), holder=holder)
        return super().allocate(count, holder=holder)


class LookupTouches(_Buggy):
    """A lookup refreshes the recency of what it finds: a query changes what is evicted next."""

    def lookup(self, block_hashes: Any, **kwargs: Any) -> list[int]:
        found = super().lookup(block_hashes, **kwargs)
        for b in found:
            if b in self.orders.evictable:
                self.orders.evictable.move_to_end(b)
        return found


class ResetWhileInUse(_Buggy):
    """Reset does not wait for in-use blocks: it clears the whole index, hashes of blocks that
    requests still hold included, and reports success."""

    def reset(self) -> None:
        for b in self.orders.hashed_in_use:
            self.blocks.hash[b] = None
        self.orders.hashed_in_use.clear()
        self._drop_cache()


class ReservedHandedOut(_Buggy):
    """The null block sits on the free list and is handed out like any other."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.blocks.free.append(self._reserved[0])
        self.blocks.is_reserved[self._reserved[0]] = 0


class UntaggedExtraKeys(_Buggy):
    """Extra keys hashed as a flat tuple: an adapter named "x" and a cache salt "x" collide
    (vLLM #44701)."""

    def hash_blocks(self, token_ids: Any, block_size: int, **extra: Any) -> list[int]:
        from kvref.contract.hashing import ROOT_HASH, hash_block

        tokens = list(token_ids)
        flat = [v for k in ("adapter", "cache_salt") if (v := extra.get(k)) is not None]
        flat += [item.identifier for item in extra.get("multimodal", ())]
        out, parent = [], ROOT_HASH
        for i in range(len(tokens) // block_size):
            block = [*tokens[i * block_size : (i + 1) * block_size], zlib.crc32("|".join(map(str, flat)).encode())]
            parent = hash_block(parent, block)
            out.append(parent)
        return out


class HashKeptIn32Bits(_Buggy):
    """Each block's hash is stored in a 32-bit slot: distinct blocks share a hash once a cache holds
    tens of thousands of them, and a hit then serves another prefix's KV."""

    def hash_blocks(self, token_ids: Any, block_size: int, **extra: Any) -> list[int]:
        return [h & 0xFFFF_FFFF for h in super().hash_blocks(token_ids, block_size, **extra)]


class AdmissionBudgetOfEveryCachedBlock(_Buggy):
    """``allocate_many`` sizes its admission by the free blocks plus every cached one, though under
    ``lru-leaf`` the cached ancestors of a held block cannot be evicted: it admits an entry that does
    not fit, and that entry's allocation fails with the batch half done."""

    def allocate_many(self, counts: Any, *, holders: Any) -> list[list[int]]:
        op = "allocate_many"
        cs = [
            as_count(c, op=op, arg=f"counts[{i}]") for i, c in enumerate(as_block_id_list(counts, op=op, arg="counts"))
        ]
        hs = as_holder_list(holders, len(cs), op=op)
        for count, holder in zip(cs, hs, strict=True):
            self.paused.refuse(holder, count, op)
        budget, admitted = self.num_free + self.num_cached, []
        for count, holder in zip(cs, hs, strict=True):
            if count > budget:
                break
            budget -= count
            admitted.append(self.allocate(count, holder=holder))
        return admitted


class LastTokenHit(_Buggy):
    """A request whose prompt fills its blocks exactly is served all of them from the cache, so no
    token is left to compute the logits from."""

    def match_request(
        self, block_hashes: Any, *, num_tokens: Any, block_size: Any, holder: Hashable = None
    ) -> list[int]:
        return self.match(block_hashes, holder=holder)


class GenerationNotBumped(_Buggy):
    """Reallocation keeps the old generation, so a stale reference looks current."""

    def allocate(self, count: Any, *, holder: Hashable = None) -> list[int]:
        ids = super().allocate(count, holder=holder)
        for b in ids:
            self.blocks.gen[b] = 1
        return ids


class _RemovedPerCopy(PrefixIndex):
    def unregister(self, blocks: Iterable[int], *, keep_tree: bool = True) -> None:
        for b in list(blocks):
            h = self.blocks.hash[b]
            last = h is not None and len(self.copies.get(h, ())) == 1
            super().unregister((b,), keep_tree=keep_tree)
            if not last and self.events_on:
                self.events.append(BlockRemoved(h))  # type: ignore[arg-type]


class RemovedForEveryCopy(_Buggy):
    """``BlockRemoved`` is emitted whenever a copy is evicted, though another copy of the hash is
    still cached: a router then believes the prefix is gone (vLLM, before PR #55092)."""

    parts = PoolParts(index=_RemovedPerCopy)


class EagerEviction(_Buggy):
    """Allocation evicts cached blocks while never-cached blocks are still free (vLLM's free queue
    before PR #42656)."""

    def allocate(self, count: Any, *, holder: Hashable = None) -> list[int]:
        if (
            isinstance(count, int)
            and 0 < count <= self.num_available
            and self.orders.evictable
            and holder not in self.paused.holders
        ):
            victims = self.eviction.victims(min(count, len(self.orders.evictable)))
            self.blocks.free.extend(reversed(victims))
        return super().allocate(count, holder=holder)


class _PinRefreshesFifo(ReferenceCounts):
    def pin(self, ids: list[int], holder: Hashable) -> None:
        for b in ids:
            if b in self.orders.registered:
                self.orders.registered.move_to_end(b)
        super().pin(ids, holder)


class FifoRefreshedByHits(_Buggy):
    """Under fifo, a hit moves the block to the back of the queue: fifo silently becomes lru."""

    parts = PoolParts(references=_PinRefreshesFifo)


class _GenerationsLast(ReferenceCounts):
    def check_release(self, ids: list[int], holder: Hashable, gens: list[int] | None, op: str) -> None:
        super().check_release(ids, holder, None, op)
        if gens is not None:
            self.check_generations(ids, gens, op)


class StaleCheckedLast(_Buggy):
    """``free`` checks the blocks before the generations: a stale reference naming a block out of
    range is reported as out of range, not as stale (the order of checks, ERR-509)."""

    parts = PoolParts(references=_GenerationsLast)


class AllocateHandsOutAView(_Buggy):
    """``allocate`` returns one list the pool keeps and refills on its next allocation: ids the caller
    holds change under it (Megatron-Core's ``allocate_memory_blocks`` returns a view of its stack)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._out: list[int] = []

    def allocate(self, count: Any, *, holder: Hashable = None) -> list[int]:
        self._out[:] = super().allocate(count, holder=holder)
        return self._out


class ScatterPinInMatchMany(_Buggy):
    """``match_many`` pins its hits as one scatter, ``ref[ids] += 1``: a block two holders hit in one call
    gets one reference, though both are told they hold it."""

    def match_many(self, hash_lists: Any, *, holders: Any) -> list[list[int]]:
        got = super().match_many(hash_lists, holders=holders)
        seen: set[int] = set()
        for hits, holder in zip(got, holders, strict=True):
            lost = [b for b in hits if b in seen]
            seen.update(hits)
            if lost:
                self.references.release(lost, holder)
        return got


class AdmissionSkipsWhatDoesNotFit(_Buggy):
    """``allocate_many`` skips an entry that does not fit and goes on with the later ones, as a
    scheduler's admission loop with ``continue`` for ``break`` does: a later, smaller request
    overtakes the one that waits."""

    def allocate_many(self, counts: Any, *, holders: Any) -> list[list[int]]:
        cs, hs = list(counts), list(holders)
        if any(type(c) is not int or c < 0 for c in cs) or len(cs) != len(hs):
            return super().allocate_many(counts, holders=holders)
        if any(c and h in self.paused.holders for c, h in zip(cs, hs, strict=True)):
            return super().allocate_many(counts, holders=holders)
        out: list[list[int]] = []
        for c, h in zip(cs, hs, strict=True):
            out.append(self.allocate(c, holder=h) if c <= self.num_available else [])
        return out


class PausedCountMissedByFreeMany(_Buggy):
    """``paused_used`` is a counter the single ``free`` lowers and ``free_many`` forgets: a paused
    request that gives blocks back in a batch still counts them against the paused limit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._missed: dict[Hashable, int] = {}

    def free_many(self, block_lists: Any, *, holders: Any) -> None:
        super().free_many(block_lists, holders=holders)
        for ids, h in zip(block_lists, holders, strict=True):
            if h in self.paused.holders:
                self._missed[h] = self._missed.get(h, 0) + len(list(ids))

    def resume(self, holder: Hashable) -> None:
        super().resume(holder)
        self._missed.pop(holder, None)

    @property
    def paused_used(self) -> int:
        return super().paused_used + sum(self._missed.get(h, 0) for h in self.paused.holders)

    @property
    def paused_excess(self) -> int:
        return max(0, self.paused_used - self.paused_limit)


class _ReleaseQueue(ReferenceCounts):
    """References that also keep the blocks whose last reference went, in release order."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.queue: dict[int, None] = {}

    def release(self, ids: list[int], holder: Hashable) -> None:
        super().release(ids, holder)
        for b in ids:
            if self.blocks.ref[b] == 0:
                self.queue.pop(b, None)
                self.queue[b] = None


class OneQueueInReleaseOrder(_Buggy):
    """Free and cached blocks wait in one queue in release order and ``allocate`` takes its head:
    cached blocks released before a never-hashed block are evicted while that block is still free
    (one free queue for both kinds of block; vLLM's keeps them at its two ends instead)."""

    parts = PoolParts(references=_ReleaseQueue)

    def allocate(self, count: Any, *, holder: Hashable = None) -> list[int]:
        n = count if type(count) is int and isinstance(holder, str | None) else 0
        if 0 < n <= self.num_available and holder not in self.paused.holders:
            queue: dict[int, None] = self.references.queue  # type: ignore[attr-defined]
            free, evictable, ref = self.blocks.free, self.orders.evictable, self.blocks.ref
            idle = [b for b in queue if ref[b] == 0 and (b in evictable or b in free)]
            head = ([b for b in free if b not in queue] + idle)[:n]
            extra = sum(b in evictable for b in head) - max(0, n - len(free))
            if extra > 0:
                free.extend(reversed(self.eviction.victims(min(extra, self.eviction.reclaimable()))))
        return super().allocate(count, holder=holder)


class _IndexThatDoesNotGrow(PrefixIndex):
    """A prefix index of 1,024 entries that never grows: a hash registered while it is full is
    recorded on its block but placed nowhere a lookup looks."""

    ENTRIES = 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.placed: set[int] = set()

    def register(self, ids: list[int], hs: list[int], parent: int | None, explain: Any) -> None:
        super().register(ids, hs, parent, explain)
        for h in hs:
            if len(self.placed) < self.ENTRIES:
                self.placed.add(h)

    def unregister(self, blocks: Iterable[int], *, keep_tree: bool = True) -> None:
        blocks = list(blocks)
        gone = {self.blocks.hash[b] for b in blocks}
        super().unregister(blocks, keep_tree=keep_tree)
        self.placed -= {h for h in gone if h not in self.copies}

    def lookup(self, hs: list[int], parent: int | None, prefer: Any = None) -> list[int]:
        hit = super().lookup(hs, parent, prefer)
        found = next((i for i, h in enumerate(hs[: len(hit)]) if h not in self.placed), len(hit))
        return hit[:found]

    def clear(self) -> None:
        super().clear()
        self.placed.clear()


class IndexThatDoesNotGrow(_Buggy):
    """The prefix index is a table of 1,024 entries that never grows: past that many cached hashes a
    registered block is never found again (a fixed-size table, where a pool of a few dozen blocks
    never comes near the limit)."""

    parts = PoolParts(index=_IndexThatDoesNotGrow)


class _EvictionCountedPerCall(Eviction):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.uncounted = 0

    def victims(self, k: int, *, keep_tree: bool = True) -> list[int]:
        taken = super().victims(k, keep_tree=keep_tree)
        self.uncounted += max(len(taken) - 1, 0)
        return taken


class EvictableCountedOncePerEviction(_Buggy):
    """The count of evictable blocks goes down by one per eviction, however many blocks it took: after
    an allocation that evicts several blocks at once, ``num_available`` promises more than an
    allocation can get (a stale counter, as TensorRT-LLM's ``usedNumBlocks`` that went negative)."""

    parts = PoolParts(eviction=_EvictionCountedPerCall)

    @property
    def num_available(self) -> int:
        uncounted: int = self.eviction.uncounted  # type: ignore[attr-defined]
        return super().num_available + uncounted


def _backend(pool_cls: type[OracleBlockPool]) -> type[OracleBackend]:
    class PlantedBackend(OracleBackend):
        name = pool_cls.__name__

        def capabilities(self) -> frozenset[str]:
            return pool_cls(2).capabilities()

        def create(self, num_blocks: int, **kwargs: Any) -> OracleBlockPool:
            kwargs.pop("device", None)
            return pool_cls(num_blocks, **kwargs)

    PlantedBackend.__name__ = PlantedBackend.__qualname__ = pool_cls.__name__ + "Backend"
    return PlantedBackend


#: Each planted bug, the rule the suite must name, as backends the suite can load by name.
EXPECTED: dict[str, str] = {
    "DoubleFreeAccepted": "POOL-108",
    "ScatterFree": "POOL-107",
    "LeafIgnored": "EVICT-403",
    "LockCountGoesNegative": "POOL-108",
    "SecondReleaseBySameHolder": "POOL-108",
    "StaleHashAfterEviction": "PFX-312",
    "PartialAllocation": "POOL-105",
    "LookupTouches": "PFX-321",
    "ResetWhileInUse": "PFX-313",
    "ReservedHandedOut": "POOL-102",
    "UntaggedExtraKeys": "HASH-205",
    "HashKeptIn32Bits": "HASH-212",
    "LastTokenHit": "REQ-701",
    "GenerationNotBumped": "POOL-111",
    "RemovedForEveryCopy": "PFX-317",
    "EagerEviction": "EVICT-408",
    "FifoRefreshedByHits": "EVICT-406",
    "StaleCheckedLast": "ERR-509",
    "AllocateHandsOutAView": "POOL-123",
    "ScatterPinInMatchMany": "PFX-320",
    "AdmissionSkipsWhatDoesNotFit": "POOL-116",
    "AdmissionBudgetOfEveryCachedBlock": "POOL-116",
    "PausedCountMissedByFreeMany": "POOL-113",
    "OneQueueInReleaseOrder": "EVICT-408",
    "IndexThatDoesNotGrow": "PFX-307",
    "EvictableCountedOncePerEviction": "POOL-106",
}

for _name in EXPECTED:
    globals()[_name] = _backend(globals()[_name])


class _FreedToTheBottom(ReferenceCounts):
    def release(self, ids: list[int], holder: Hashable) -> None:
        free = self.blocks.free
        before = len(free)
        super().release(ids, holder)
        freed = free[before:]
        del free[before:]
        free[:0] = freed[::-1]  # to the bottom of the stack: reused last


class QueueOrderPool(OracleBlockPool):
    """Not a bug: freed blocks are reused last (a queue) instead of first (a stack), so ids differ
    from the oracle's while behaviour is the same. Passes under the renaming profile; fails under
    ``exact-order``."""

    check_invariants = None  # type: ignore[assignment]
    snapshot = None  # type: ignore[assignment]
    parts = PoolParts(references=_FreedToTheBottom)

    def capabilities(self) -> frozenset[str]:
        return super().capabilities() - {"invariants", "snapshot"}


QueueOrder = _backend(QueueOrderPool)


class QueueOrderExact(_backend(QueueOrderPool)):  # type: ignore[misc]
    """The same pool, declaring that it promises the oracle's exact ids."""

    conformance_profile = "exact-order"
