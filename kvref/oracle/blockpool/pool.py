"""The oracle: a strict, plain, pure-Python block pool with a hash prefix cache (chapters 00-05).

:class:`OracleBlockPool` implements every rule of spec chapters 00-05 and is what other
implementations are compared with. It checks every precondition before it changes anything
(ERR-501), keeps explicit state that :meth:`~OracleBlockPool.check_invariants` can read, and stays
fast: the hot paths (``allocate`` from the free stack, ``free``, ``acquire``, ``lookup``) are a
few list and dict operations per block.

The pool composes its parts, each an object with its own state: the blocks' fields and the free
stack (:class:`~kvref.oracle.blockpool.blocks.BlockLists`), the cache orders
(:class:`~kvref.oracle.blockpool.orders.CacheOrders`), the prefix index and its events
(:class:`~kvref.oracle.blockpool.prefix.PrefixIndex`), eviction
(:class:`~kvref.oracle.blockpool.eviction.Eviction`), reference counting
(:class:`~kvref.oracle.blockpool.references.ReferenceCounts`), the batched calls
(:class:`~kvref.oracle.blockpool.batched.BatchedCalls`) and the fused replay
(:class:`~kvref.oracle.blockpool.replaying.FusedReplay`) and the paused holders
(:class:`~kvref.contract.pausing.PausedHolders`); the pool's shape comes from :mod:`kvref.contract`.
A subclass may name other classes for its parts (``parts``): the planted bugs of kvref's own tests do.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, SupportsIndex

from kvref.contract.checks import HashEntry, explain_register
from kvref.contract.containment import contain_faults
from kvref.contract.errors import CacheInUseError, InvalidTypeError, InvalidValueError
from kvref.contract.events import CacheCounters, KVEvent, PrefixCacheStats
from kvref.contract.pausing import PauseCalls, PausedHolders
from kvref.contract.policies import EvictionPolicy, as_policy
from kvref.contract.protocol import STANDARD_CAPABILITIES, BlockState, ReplayedBatch
from kvref.contract.shape import PoolShape
from kvref.contract.validate import (
    IntsLike,
    as_block_id_list,
    as_count,
    as_hash,
    as_hash_list,
    as_holder,
    as_pool_shape,
    register_arguments,
    request_prefix_limit,
)
from kvref.oracle.blockpool.batched import BatchedCalls
from kvref.oracle.blockpool.blocks import BlockLists
from kvref.oracle.blockpool.eviction import Eviction
from kvref.oracle.blockpool.invariants import check_pool_invariants
from kvref.oracle.blockpool.orders import CacheOrders
from kvref.oracle.blockpool.prefix import PrefixIndex
from kvref.oracle.blockpool.references import ReferenceCounts
from kvref.oracle.blockpool.replaying import FusedReplay

__all__ = ["OracleBlockPool", "PoolParts"]


@dataclass(frozen=True)
class PoolParts:
    """The classes a pool builds its parts from; a subclass of the pool may name its own."""

    blocks: type[BlockLists] = BlockLists
    orders: type[CacheOrders] = CacheOrders
    index: type[PrefixIndex] = PrefixIndex
    eviction: type[Eviction] = Eviction
    references: type[ReferenceCounts] = ReferenceCounts


@contain_faults
class OracleBlockPool(PoolShape, PauseCalls):
    """Block pool and hash prefix cache, the reference semantics of kvref (chapters 00-05).

    ``OracleBlockPool(num_blocks, *, policy="lru", reserved_ids=(0,), paused_limit=0,
    enable_events=False)``: ``num_blocks`` blocks, of which ``reserved_ids`` (the null block by
    default) are never handed out (POOL-102); ``policy`` is one of ``lru``, ``lru-leaf``,
    ``ref-zero``, ``fifo``, ``lru-leaf-access`` (chapter 04); ``paused_limit`` is the soft limit on
    references held by paused holders (POOL-113); ``enable_events`` turns on KV events (PFX-315).
    """

    name = "oracle"
    parts = PoolParts()

    def __init__(
        self,
        num_blocks: SupportsIndex,
        *,
        policy: str | EvictionPolicy = "lru",
        reserved_ids: IntsLike = (0,),
        paused_limit: int = 0,
        enable_events: bool = False,
    ) -> None:
        op = "OracleBlockPool"
        n, reserved = as_pool_shape(num_blocks, reserved_ids, op=op)
        if not isinstance(enable_events, bool):
            raise InvalidTypeError("POOL-101", f"{op}: enable_events must be a bool")
        chosen = as_policy(policy)
        self._n = n
        self._reserved = reserved
        self.paused = PausedHolders(as_count(paused_limit, op=op, arg="paused_limit"), self._references_of)
        parts = self.parts
        self.counters = CacheCounters()
        self.blocks = parts.blocks(n, reserved)
        self.orders = parts.orders(n, chosen)
        self.index = parts.index(self.blocks, self.orders, enable_events=enable_events)
        self.eviction = parts.eviction(self.blocks, self.orders, self.index, self.counters)
        self.references = parts.references(self.blocks, self.eviction, self.counters, self)
        self.batches = BatchedCalls(self.references, allocate=self.allocate, match=self._match, paused=self.paused)
        self.fused_replay = FusedReplay(self.eviction, self.counters)

    # ------------------------------------------------------------------ sizes

    @property
    def num_free(self) -> int:
        """Blocks neither in use nor cached."""
        return len(self.blocks.free)

    @property
    def num_cached(self) -> int:
        """Hashed blocks with no reference, waiting to be reused or evicted."""
        return len(self.orders.evictable)

    @property
    def num_in_use(self) -> int:
        """Blocks with at least one reference (STATE-003)."""
        return self.num_usable - len(self.blocks.free) - len(self.orders.evictable)

    @property
    def num_available(self) -> int:
        """The largest count ``allocate`` grants now: free plus reclaimable (POOL-106)."""
        return len(self.blocks.free) + self.eviction.reclaimable()

    @property
    def policy(self) -> EvictionPolicy:
        """The eviction policy (chapter 04)."""
        return self.orders.policy

    @property
    def events_enabled(self) -> bool:
        """Whether this pool records KV events (``enable_events``, PFX-315); the capability says it can."""
        return self.index.events_on

    @property
    def stats(self) -> PrefixCacheStats:
        """Cumulative hit statistics (PFX-318, PFX-319)."""
        return self.counters.stats()

    def capabilities(self) -> frozenset[str]:
        """Every capability of the protocol: the whole spec, and the fused replay (TRACE-1019)."""
        return STANDARD_CAPABILITIES | {"replay"}

    # ------------------------------------------------------------ block queries

    def ref_count(self, block_id: SupportsIndex) -> int:
        """References on ``block_id`` from all holders (STATE-002)."""
        return self.blocks.ref[self.blocks.check_id(block_id, "ref_count")]

    def holders(self, block_id: SupportsIndex) -> dict[Hashable, int]:
        """A copy of ``{holder: references}`` on ``block_id`` (STATE-002)."""
        held = self.blocks.holders[self.blocks.check_id(block_id, "holders")]
        return dict(held) if held else {}

    def generation(self, block_id: SupportsIndex) -> int:
        """How many times ``block_id`` has been allocated (POOL-111)."""
        return self.blocks.gen[self.blocks.check_id(block_id, "generation")]

    def block_hash(self, block_id: SupportsIndex) -> int | None:
        """The hash ``block_id`` is registered under, or None (PFX-301)."""
        return self.blocks.hash[self.blocks.check_id(block_id, "block_hash")]

    def block_state(self, block_id: SupportsIndex) -> BlockState:
        """The state of ``block_id`` (STATE-001)."""
        return self.blocks.state_of(self.blocks.check_id(block_id, "block_state"))

    def holder_references(self, holder: Hashable) -> int:
        """References ``holder`` holds over all blocks."""
        return self.blocks.held.get(as_holder(holder, op="holder_references"), 0)

    def _references_of(self, holder: Hashable) -> int:
        return self.blocks.held.get(holder, 0)

    def hash_entry(self, block_hash: int) -> HashEntry | None:
        """What the prefix index knows of ``block_hash`` (the explainers' view, :mod:`kvref.contract.checks`)."""
        return self.index.hash_entry(block_hash)

    def resident_hashes(self) -> frozenset[int]:
        """Hashes with at least one cached copy, in use or evictable (PFX-305)."""
        return frozenset(self.index.copies)

    def eviction_order(self) -> list[int]:
        """Cached blocks in release order (lru order), oldest first."""
        return list(self.orders.evictable)

    # ------------------------------------------------------- references

    def allocate(self, count: SupportsIndex, *, holder: Hashable = None) -> list[int]:
        """Take ``count`` unhashed blocks with one reference each for ``holder``, or none.

        Free blocks are taken first; cached blocks are evicted only for the shortfall
        (EVICT-408) and come back without their hash (PFX-312). Raises OutOfBlocksError when
        ``count > num_available`` (POOL-105), PausedHolderError for a paused holder (POOL-114).
        """
        n = as_count(count, op="allocate")
        holder = as_holder(holder, op="allocate")
        self.paused.refuse(holder, n, "allocate")
        if n == 0:
            return []
        return self.references.allocate(n, holder, "allocate")

    def _generations(self, generations: object, ids: list[int], op: str) -> list[int]:
        gens = as_block_id_list(generations, op=op, arg="generations")
        if len(gens) != len(ids):
            raise InvalidValueError(
                "ERR-506",
                f"{op}: {len(gens)} generations for {len(ids)} block ids; they must pair up",
            )
        return gens

    def free(self, block_ids: IntsLike, *, holder: Hashable = None, generations: IntsLike | None = None) -> None:
        """Drop one of ``holder``'s references per occurrence in ``block_ids``, in list order.

        A block whose last reference goes becomes free, or cached if hashed (PFX-311), or is
        dropped from the cache under ``ref-zero`` (EVICT-405). Positions earlier in the list count
        as released earlier (EVICT-401). All-or-nothing (POOL-107..POOL-109, POOL-112).
        """
        ids = as_block_id_list(block_ids, op="free")
        holder = as_holder(holder, op="free")
        gens = None if generations is None else self._generations(generations, ids, "free")
        self.references.check_release(ids, holder, gens, "free")
        self.references.release(ids, holder)

    def acquire(self, block_ids: IntsLike, *, holder: Hashable = None, generations: IntsLike | None = None) -> None:
        """Add one reference for ``holder`` per occurrence; blocks must be in use or cached.

        A cached block so acquired is pinned: it leaves the evictable set (PFX-310, POOL-110).
        """
        ids = as_block_id_list(block_ids, op="acquire")
        holder = as_holder(holder, op="acquire")
        self.paused.refuse(holder, len(ids), "acquire")
        gens = None if generations is None else self._generations(generations, ids, "acquire")
        if gens is not None:
            self.references.check_generations(ids, gens, "acquire")
        self.references.check_acquire(ids, "acquire")
        self.references.pin(ids, holder)

    # ---------------------------------------------------------- the prefix cache

    def register(
        self, block_ids: IntsLike, block_hashes: IntsLike, *, parent_hash: SupportsIndex | None = None
    ) -> None:
        """Cache in-use blocks: ``block_ids[i]`` under ``block_hashes[i]``, chained (PFX-301).

        ``block_hashes[0]``'s parent is ``parent_hash`` (None: the chain's root); each later
        hash's parent is the hash before it. Blocks must be in use (PFX-302) and unhashed
        (PFX-303); the parent must be resident (PFX-304); a resident hash keeps its parent
        (PFX-306). A hash that gains its first copy is reported as stored (PFX-317).
        """
        ids, hs, parent = register_arguments(
            block_ids, block_hashes, parent_hash, parent_resident=self.index.copies.__contains__
        )
        self.index.register(ids, hs, parent, lambda: explain_register(self, ids, hs, parent, "register"))

    def lookup(
        self,
        block_hashes: IntsLike,
        *,
        parent_hash: SupportsIndex | None = None,
        prefer: Sequence[int] | None = None,
    ) -> list[int]:
        """Blocks of the longest resident prefix of the chain; changes nothing (PFX-307, PFX-321).

        Hash ``i`` is a hit only if it is resident with the chain's parent (``parent_hash`` for
        the first); the walk stops at the first miss. Among several copies the oldest registered
        is returned, unless ``prefer[i]`` names another copy of that hash: the conformance suite
        uses ``prefer`` to follow the copy another implementation chose (PFX-308).
        """
        hs = as_hash_list(block_hashes, op="lookup")
        parent = None if parent_hash is None else as_hash(parent_hash, op="lookup", arg="parent_hash")
        return self.index.lookup(hs, parent, prefer)

    def match(
        self,
        block_hashes: IntsLike,
        *,
        holder: Hashable = None,
        parent_hash: SupportsIndex | None = None,
        prefer: Sequence[int] | None = None,
    ) -> list[int]:
        """``lookup``, acquire the hit for ``holder`` and count it in the stats (PFX-309).

        ``prefer`` is as for :meth:`lookup`.
        """
        hs = as_hash_list(block_hashes, op="match")
        holder = as_holder(holder, op="match")
        parent = None if parent_hash is None else as_hash(parent_hash, op="match", arg="parent_hash")
        self.paused.refuse(holder, len(hs), "match")
        return self._match(hs, parent, holder, prefer)

    def _match(
        self, hs: list[int], parent: int | None, holder: Hashable, prefer: Sequence[int] | None = None
    ) -> list[int]:
        hit = self.index.lookup(hs, parent, prefer)
        self.references.pin(hit, holder)
        self.counters.count_match(len(hs), len(hit))
        return hit

    def match_request(
        self, block_hashes: IntsLike, *, num_tokens: SupportsIndex, block_size: SupportsIndex, holder: Hashable = None
    ) -> list[int]:
        """``match`` for a request of ``num_tokens`` tokens: its last token is never a hit (REQ-701).

        At most ``(num_tokens - 1) // block_size`` blocks are matched, so the engine always has at
        least one token to compute and gets the logits of the last one.
        """
        hs = as_hash_list(block_hashes, op="match_request")
        limit = request_prefix_limit(len(hs), num_tokens, block_size)
        return self.match(hs[:limit], holder=holder)

    def hash_blocks(
        self,
        token_ids: IntsLike,
        block_size: int,
        *,
        adapter: str | int | None = None,
        cache_salt: str | None = None,
        multimodal: Sequence[Any] = (),
    ) -> list[int]:
        """kvref's own hashing (:func:`kvref.contract.hashing.hash_token_blocks`, default algorithm)."""
        from kvref.contract.hashing import hash_token_blocks

        return hash_token_blocks(token_ids, block_size, adapter=adapter, cache_salt=cache_salt, multimodal=multimodal)

    def take_events(self) -> list[KVEvent]:
        """Events since the last call, oldest first, and forget them (PFX-315)."""
        return self.index.take_events()

    # ------------------------------------------------------------- batched calls

    def allocate_many(self, counts: IntsLike, *, holders: Sequence[Hashable]) -> list[list[int]]:
        """Admit the longest prefix of the batch that fits, in order (POOL-116)."""
        return self.batches.allocate_many(counts, holders=holders)

    def free_many(self, block_lists: Sequence[IntsLike], *, holders: Sequence[Hashable]) -> None:
        """``free(block_lists[i], holder=holders[i])`` for each ``i`` in order, atomically (POOL-117)."""
        self.batches.free_many(block_lists, holders=holders)

    def match_many(self, hash_lists: Sequence[IntsLike], *, holders: Sequence[Hashable]) -> list[list[int]]:
        """``match(hash_lists[i], holder=holders[i])`` for each ``i`` in order (PFX-320)."""
        return self.batches.match_many(hash_lists, holders=holders)

    def replay_requests(self, block_lists: Sequence[IntsLike]) -> ReplayedBatch:
        """A batch of trace requests replayed in one call (TRACE-1019, TRACE-1020): :class:`FusedReplay`."""
        return self.fused_replay.replay_requests(block_lists)

    # ------------------------------------------------------------ starting over

    def evict(self, count: SupportsIndex) -> bool:
        """Evict the ``count`` cached blocks an allocation lacking ``count`` free blocks would (EVICT-412);
        False, evicting nothing, when fewer than ``count`` can be evicted (POOL-106)."""
        return self.eviction.evict(as_count(count, op="evict"))

    def reset(self) -> None:
        """Drop every cached block; refused with CacheInUseError while a block is in use (PFX-313)."""
        in_use = self.num_in_use
        if in_use:
            raise CacheInUseError("PFX-313", f"reset: {in_use} block(s) in use; release every reference first")
        self._drop_cache()

    def clear(self) -> None:
        """Drop every reference, pause and registration, blocks in use included (POOL-124).

        Every usable block is free again, in a new pool's order; no holder holds or is paused; no hash
        is resident (``AllBlocksCleared`` with events on; counted as a reset). Generations keep their
        counts (POOL-111), so a (block, generation) handle from before the clear is stale after it.
        What a holder held is gone: freeing it later is POOL-108's refusal.
        """
        self._drop_cache()
        self.blocks.clear()
        self.orders.hashed_in_use.clear()
        self.paused.clear()

    def _drop_cache(self) -> None:
        """Forget every registration, free the cached blocks, count the reset, emit all-cleared."""
        blocks, orders = self.blocks, self.orders
        for b in orders.evictable:
            blocks.hash[b] = None
            blocks.free.append(b)
        orders.evictable.clear()
        orders.registered.clear()
        self.counters.resets += 1
        self.index.clear()

    # ---------------------------------------------------------- views of the state

    def check_invariants(self) -> None:
        """Verify every invariant of the spec; raise InvariantViolation naming the rule broken
        (STATE-002..STATE-007, POOL-102, POOL-111, EVICT-404..EVICT-406)."""
        check_pool_invariants(self.blocks, self.orders, self.index)

    def snapshot(self) -> dict[str, Any]:
        """A deep, comparable copy of the whole state, eviction order included (ERR-501)."""
        blocks, orders, index = self.blocks, self.orders, self.index
        return {
            "free": list(blocks.free),
            "ref": list(blocks.ref),
            "gen": list(blocks.gen),
            "holders": [dict(h) if h else None for h in blocks.holders],
            "hash": list(blocks.hash),
            "held": dict(blocks.held),
            "paused": set(self.paused.holders),
            "copies": {h: list(c) for h, c in index.copies.items()},
            "parent": dict(index.parent),
            "children": dict(index.children),
            "evictable": list(orders.evictable),
            "access": list(orders.by_access()) if self.policy.by_access else [],
            "registered": list(orders.registered),
            "events": list(index.events),
            "stats": self.stats,
        }

    def __repr__(self) -> str:
        return (
            f"OracleBlockPool(num_blocks={self._n}, policy={self.policy.value!r}, "
            f"free={self.num_free}, in_use={self.num_in_use}, cached={self.num_cached})"
        )
