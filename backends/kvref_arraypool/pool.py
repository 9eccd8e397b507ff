"""The array core: a block pool and hash prefix cache with all state in device arrays (chapters 00-05, 09).

:class:`ArrayBlockPool` implements the same protocol and rules as the oracle
(:class:`kvref.oracle.OracleBlockPool`), over int64 arrays owned by an
:class:`~kvref_arraypool.ops.ArrayOps` (NumPy, CuPy or torch). There is no per-block Python
object and no Python loop over blocks on any path that succeeds: each call is a constant number
of array operations over its batch (plus a few per probe step of the hash tables and per
pointer-doubling round of lru-leaf eviction), and one implementation per operation, the one a GPU
runs. Bad input is *detected* with array operations; only then do the explainers of
:mod:`kvref.contract.checks` walk the batch to name the first offending entry exactly as the
oracle does, so the error class, rule and message agree with the oracle's (ERR-501, ERR-502,
ERR-509).

The pool composes its parts, as vLLM's block pool composes its free queue and hash map:

* :class:`~kvref_arraypool.blocks.BlockArrays`: every block's fields and the free stack;
* :class:`~kvref_arraypool.orders.CacheOrders`: release, registration and access orders;
* :class:`~kvref_arraypool.prefix_index.PrefixIndex`: hash entries, registration, lookups, events;
* :class:`~kvref_arraypool.eviction.Eviction`: the policy's victims (chapter 04);
* :class:`~kvref_arraypool.eviction.BlockSupply`: blocks taken for allocations, released ones settled;
* :class:`~kvref_arraypool.references.ReferenceCounts`: references, holders of shared blocks, pins;
* :class:`~kvref_arraypool.holders.HolderIds`: holders as small ids, and what each holds;
* :class:`~kvref_arraypool.batched.BatchedCalls`: a scheduler step's batched calls;
* :class:`~kvref.contract.pausing.PausedHolders`: paused holders and their soft limit (POOL-113).

Every method runs between CUDA-graph captures (CONF-908): allocation sizes, error checks and
eviction depend on values read back to the host.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, SupportsIndex

import numpy as np

from kvref.contract.checks import HashEntry, explain_acquire, explain_register, explain_release
from kvref.contract.containment import contain_faults
from kvref.contract.errors import (
    CacheInUseError,
    HashConflictError,
    InvalidTypeError,
    InvalidValueError,
    InvariantViolation,
)
from kvref.contract.events import CacheCounters, KVEvent, PrefixCacheStats
from kvref.contract.pausing import PauseCalls, PausedHolders
from kvref.contract.policies import EvictionPolicy, as_policy
from kvref.contract.protocol import STANDARD_CAPABILITIES, BlockState
from kvref.contract.shape import PoolShape
from kvref.contract.validate import (
    IntsLike,
    as_count,
    as_hash,
    as_holder,
    as_pool_shape,
    request_prefix_limit,
)
from kvref_arraypool.batched import BatchedCalls
from kvref_arraypool.blocks import BlockArrays
from kvref_arraypool.eviction import BlockSupply, Eviction
from kvref_arraypool.holders import HolderIds
from kvref_arraypool.host_arrays import count_distinct
from kvref_arraypool.inputs import hash_array, index_array
from kvref_arraypool.invariants import check_pool_invariants
from kvref_arraypool.ops import Array, ArrayOps
from kvref_arraypool.orders import CacheOrders
from kvref_arraypool.prefix_index import PrefixIndex
from kvref_arraypool.references import ReferenceCounts

__all__ = ["ArrayBlockPool"]


@contain_faults
class ArrayBlockPool(PoolShape, PauseCalls):
    """Block pool and hash prefix cache over device arrays; the oracle's semantics (chapters 00-05).

    ``ArrayBlockPool(num_blocks, *, ops, policy="lru", reserved_ids=(0,), paused_limit=0,
    enable_events=False, name="array")``: ``ops`` chooses the array library and device; the other
    arguments are the oracle's: ``num_blocks`` blocks of which ``reserved_ids`` are never handed
    out (POOL-102), eviction ``policy`` (chapter 04), ``paused_limit`` (POOL-113) and
    ``enable_events`` (PFX-315). Block ids are handed out in the oracle's order, so the pool also
    passes the ``exact-order`` profile.
    """

    def __init__(
        self,
        num_blocks: SupportsIndex,
        *,
        ops: ArrayOps,
        policy: str | EvictionPolicy = "lru",
        reserved_ids: IntsLike = (0,),
        paused_limit: int = 0,
        enable_events: bool = False,
        name: str = "array",
    ) -> None:
        n, reserved = as_pool_shape(num_blocks, reserved_ids, op=name)
        if not isinstance(enable_events, bool):
            raise InvalidTypeError("POOL-101", f"{name}: enable_events must be a bool")
        self.name = name
        self.ops = ops
        self._n = n
        self._reserved = reserved
        self.paused = PausedHolders(as_count(paused_limit, op=name, arg="paused_limit"), self._references_of)
        self.blocks = BlockArrays(ops, n, reserved)
        self.orders = CacheOrders(self.blocks, as_policy(policy))
        self.index = PrefixIndex(self.blocks, self.orders, enable_events=enable_events)
        self.eviction = Eviction(self.blocks, self.orders, self.index)
        self.counters = CacheCounters()
        self.supply = BlockSupply(self.blocks, self.eviction, self.counters)
        self.references = ReferenceCounts(self.blocks, self.orders)
        self.holder_ids = HolderIds(name)
        self.batches = BatchedCalls(
            self,
            supply=self.supply,
            references=self.references,
            holders=self.holder_ids,
            index=self.index,
            paused=self.paused,
        )

    # ------------------------------------------------------------------ sizes

    @property
    def num_free(self) -> int:
        """Blocks neither in use nor cached; a host counter, no device sync."""
        return self.blocks.num_free

    @property
    def num_cached(self) -> int:
        """Hashed blocks with no reference; a host counter, no device sync."""
        return self.orders.num_cached

    @property
    def num_in_use(self) -> int:
        """Blocks with at least one reference (STATE-003)."""
        return self.num_usable - self.blocks.num_free - self.orders.num_cached

    @property
    def num_available(self) -> int:
        """The largest count ``allocate`` grants now: free plus reclaimable (POOL-106)."""
        return self.supply.available()

    @property
    def policy(self) -> EvictionPolicy:
        """The eviction policy (chapter 04)."""
        return self.orders.policy

    @property
    def device(self) -> str:
        """Where the arrays live."""
        return self.ops.device

    @property
    def events_enabled(self) -> bool:
        """Whether this pool records KV events (``enable_events``, PFX-315); the capability says it can."""
        return self.index.events_on

    @property
    def stats(self) -> PrefixCacheStats:
        """Cumulative hit statistics (PFX-318, PFX-319)."""
        return self.counters.stats()

    def capabilities(self) -> frozenset[str]:
        """Every capability of the protocol but the fused replay (TRACE-1019): replay goes step by step;
        and ``id-arrays``, the array forms of the calls (:meth:`allocate_ids`, :meth:`match_ids`,
        :meth:`allocate_many_ids`, :meth:`free_many_ids`).

        On a CUDA device also ``cuda-graph``: :meth:`graph_arrays` may be read by captured graphs.
        """
        declared = STANDARD_CAPABILITIES | {"id-arrays"}
        return declared | {"cuda-graph"} if self.ops.is_device else declared

    # ---------------------------------------------------------------- queries

    def ref_count(self, block_id: SupportsIndex) -> int:
        """References on ``block_id`` from all holders (STATE-002)."""
        return int(self.blocks.ref[self.blocks.check_id(block_id, "ref_count")])

    def holders(self, block_id: SupportsIndex) -> dict[Hashable, int]:
        """``{holder: references}`` on ``block_id`` (STATE-002)."""
        b = self.blocks.check_id(block_id, "holders")
        return self.references.holders_of(b, self.holder_ids.holder_of)

    def generation(self, block_id: SupportsIndex) -> int:
        """How many times ``block_id`` has been allocated (POOL-111)."""
        return int(self.blocks.gen[self.blocks.check_id(block_id, "generation")])

    def block_hash(self, block_id: SupportsIndex) -> int | None:
        """The hash ``block_id`` is registered under, or None (PFX-301)."""
        h = int(self.blocks.hash[self.blocks.check_id(block_id, "block_hash")])
        return None if h < 0 else h

    def block_state(self, block_id: SupportsIndex) -> BlockState:
        """The state of ``block_id`` (STATE-001)."""
        return self.blocks.state_of(self.blocks.check_id(block_id, "block_state"))

    def holder_references(self, holder: Hashable) -> int:
        """References ``holder`` holds over all blocks."""
        return self.holder_ids.references_of(as_holder(holder, op="holder_references"))

    def _references_of(self, holder: Hashable) -> int:
        return self.holder_ids.references_of(holder)

    def hash_entry(self, block_hash: int) -> HashEntry | None:
        """What the prefix index knows of ``block_hash`` (the explainers' view, :mod:`kvref.contract.checks`)."""
        return self.index.hash_entry(block_hash)

    def resident_hashes(self) -> frozenset[int]:
        """Hashes with at least one cached copy, in use or evictable (PFX-305)."""
        return self.index.resident_hashes()

    def eviction_order(self) -> list[int]:
        """Cached blocks in release order (lru order), oldest first."""
        return self.orders.eviction_order()

    # ------------------------------------------------------- allocate and free

    def allocate(self, count: SupportsIndex, *, holder: Hashable = None) -> list[int]:
        """Take ``count`` unhashed blocks with one reference each for ``holder``, or none (POOL-104..106).

        Free blocks are taken first (top of the stack first); cached blocks are evicted only for
        the shortfall (EVICT-408) and come back without their hash (PFX-312).
        """
        return self.ops.tolist(self._allocate(count, holder))

    def allocate_ids(self, count: SupportsIndex, *, holder: Hashable = None) -> Array:
        """``allocate``, returning the ids as a fresh device array (int64) instead of a list.

        The form an engine uses to write block tables without a round trip through Python ints.
        """
        return self.ops.export(self._allocate(count, holder))

    def _allocate(self, count: SupportsIndex, holder: Hashable) -> Array:
        n = as_count(count, op="allocate")
        holder = as_holder(holder, op="allocate")
        self.paused.refuse(holder, n, "allocate")
        if n == 0:
            return self.ops.zeros(0)
        ids = self.supply.take(n, "allocate")
        self.references.hand_out(ids, self.holder_ids.give(holder))
        self.holder_ids.add(holder, n)
        return ids

    def free(self, block_ids: IntsLike, *, holder: Hashable = None, generations: IntsLike | None = None) -> None:
        """Drop one of ``holder``'s references per occurrence in ``block_ids``, in list order.

        A block whose last reference goes becomes free, or cached if hashed (PFX-311), or is
        dropped under ``ref-zero`` (EVICT-405); earlier positions count as released earlier
        (EVICT-401). All-or-nothing (POOL-107..POOL-109, POOL-112).
        """
        op = "free"
        host, items = index_array(block_ids, op=op)
        holder = as_holder(holder, op=op)
        gens = None if generations is None else self._generations(generations, len(host), op)
        if len(host) == 0:
            return
        if gens is not None:
            self.references.check_generations(host, gens, op)
        hid = self.holder_ids.known(holder)
        checked = self.references.check_release(host, hid, known=hid >= 0)
        if checked is None:
            explain_release(self, items if items is not None else host.tolist(), holder, op)
            raise InvariantViolation(
                "ERR-508", f"{op}: the batch was refused but no entry is at fault"
            )  # pragma: no cover
        self.supply.settle(*self.references.release(checked, hid))
        self.holder_ids.drop(holder, len(host))

    def _generations(self, generations: object, expected: int, op: str) -> np.ndarray:
        gens, _ = index_array(generations, op=op, arg="generations")
        if len(gens) != expected:
            raise InvalidValueError(
                "ERR-506", f"{op}: {len(gens)} generations for {expected} block ids; they must pair up"
            )
        return gens

    def acquire(self, block_ids: IntsLike, *, holder: Hashable = None, generations: IntsLike | None = None) -> None:
        """Add one reference for ``holder`` per occurrence; blocks must be in use or cached (POOL-110).

        A cached block so acquired is pinned: it leaves the eviction order (PFX-310).
        """
        op = "acquire"
        host, items = index_array(block_ids, op=op)
        holder = as_holder(holder, op=op)
        self.paused.refuse(holder, len(host), op)
        gens = None if generations is None else self._generations(generations, len(host), op)
        if gens is not None:
            self.references.check_generations(host, gens, op)
        if len(host) == 0:
            return
        blocks = self.blocks
        if blocks.in_range(host):
            ids = self.ops.asarray(host)
            bad = blocks.is_reserved[ids] | ((blocks.ref[ids] == 0) & (blocks.hash[ids] < 0))
            if self.references.pin(ids, self.holder_ids.next_id(holder), refuse=bad):  # checked in the pin's read
                self.holder_ids.give(holder)
                self.holder_ids.add(holder, len(host))
                return
        explain_acquire(self, items if items is not None else host.tolist(), op)

    # ---------------------------------------------------------- the prefix cache

    def register(
        self, block_ids: IntsLike, block_hashes: IntsLike, *, parent_hash: SupportsIndex | None = None
    ) -> None:
        """Cache in-use blocks: ``block_ids[i]`` under ``block_hashes[i]``, chained (PFX-301..306, PFX-317).

        ``block_hashes[0]``'s parent is ``parent_hash`` (None: the chain's root); each later hash's
        parent is the hash before it.
        """
        op = "register"
        host, items = index_array(block_ids, op=op)
        hs = hash_array(block_hashes, op=op)
        m = len(host)
        if m != len(hs):
            raise InvalidValueError("ERR-506", f"{op}: {m} block ids for {len(hs)} hashes; they must pair up")
        parent = -1 if parent_hash is None else as_hash(parent_hash, op=op, arg="parent_hash")
        parent_entry, parent_depth = self.index.parent_of(parent, op) if parent >= 0 else (-1, -1)
        if m == 0:
            return
        shown = items if items is not None else host.tolist()
        if m > 1 and (len(set(items)) if items is not None else count_distinct(host)) != m:
            raise HashConflictError("PFX-303", f"{op}: a block occurs twice in {shown}; a block has one hash")
        self.index.register(
            host,
            hs,
            parent,
            parent_entry,
            parent_depth,
            lambda: explain_register(self, shown, hs.tolist(), None if parent < 0 else parent, op),
        )

    def lookup(self, block_hashes: IntsLike, *, parent_hash: SupportsIndex | None = None) -> list[int]:
        """Blocks of the longest resident prefix of the chain; changes nothing (PFX-307, PFX-308, PFX-321).

        Among several copies of a hash the oldest registered is returned.
        """
        hs = hash_array(block_hashes, op="lookup")
        parent = -1 if parent_hash is None else as_hash(parent_hash, op="lookup", arg="parent_hash")
        return self.ops.tolist(self.index.lookup(hs, parent))

    def match(
        self, block_hashes: IntsLike, *, holder: Hashable = None, parent_hash: SupportsIndex | None = None
    ) -> list[int]:
        """``lookup``, acquire the hit for ``holder`` and count it in the stats (PFX-309, PFX-318)."""
        return self.ops.tolist(self._match(block_hashes, holder, parent_hash))

    def match_ids(
        self, block_hashes: IntsLike, *, holder: Hashable = None, parent_hash: SupportsIndex | None = None
    ) -> Array:
        """``match``, returning the hit as a fresh device array (int64) instead of a list."""
        return self.ops.export(self._match(block_hashes, holder, parent_hash))

    def _match(self, block_hashes: IntsLike, holder: Hashable, parent_hash: SupportsIndex | None) -> Array:
        hs = hash_array(block_hashes, op="match")
        holder = as_holder(holder, op="match")
        parent = -1 if parent_hash is None else as_hash(parent_hash, op="match", arg="parent_hash")
        self.paused.refuse(holder, len(hs), "match")
        holders = self.holder_ids
        read = self.index.lookup_to_pin(hs, parent, holders.next_id(holder)) if len(hs) else None  # one host read
        if read is not None:
            hit, (unheld, other, joined) = read
            if len(hit):
                self.orders.stamp_access(hit)
                self.references.pin_distinct(hit, holders.give(holder), unheld, other, joined)
                holders.add(holder, len(hit))
        else:
            hit = self.index.lookup(hs, parent)  # empty, or a hash lies far from its home: the exact lookup
            if len(hit):
                self.references.pin(hit, holders.give(holder))
                holders.add(holder, len(hit))
        self.counters.count_match(len(hs), len(hit))
        return hit

    def match_request(
        self, block_hashes: IntsLike, *, num_tokens: SupportsIndex, block_size: SupportsIndex, holder: Hashable = None
    ) -> list[int]:
        """``match`` for a request of ``num_tokens`` tokens: its last token is never a hit (REQ-701)."""
        hs = hash_array(block_hashes, op="match_request")
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
        """kvref's own hashing on the host (:func:`kvref.contract.hashing.hash_token_blocks`, HASH-201..211)."""
        from kvref.contract.hashing import hash_token_blocks

        return hash_token_blocks(token_ids, block_size, adapter=adapter, cache_salt=cache_salt, multimodal=multimodal)

    def take_events(self) -> list[KVEvent]:
        """Events since the last call, oldest first, and forget them (PFX-315)."""
        return self.index.take_events()

    # ------------------------------------------------------------- batched calls

    def allocate_many(self, counts: IntsLike, *, holders: Sequence[Hashable]) -> list[list[int]]:
        """Admit the longest prefix of the batch that fits, in order, in one pass (POOL-116)."""
        return self.batches.allocate_many(counts, holders=holders)

    def allocate_many_ids(self, counts: IntsLike, *, holders: Sequence[Hashable]) -> tuple[Array, list[int]]:
        """``allocate_many`` (POOL-116) as one device array of the admitted entries' ids and host offsets."""
        return self.batches.allocate_many_ids(counts, holders=holders)

    def free_many(self, block_lists: Sequence[IntsLike], *, holders: Sequence[Hashable]) -> None:
        """``free(block_lists[i], holder=holders[i])`` for each ``i`` in order, atomically (POOL-117)."""
        self.batches.free_many(block_lists, holders=holders)

    def free_many_ids(self, block_ids: IntsLike, offsets: IntsLike, *, holders: Sequence[Hashable]) -> None:
        """``free_many`` (POOL-117) of entries laid end to end, as ``allocate_many_ids`` returns them."""
        self.batches.free_many_ids(block_ids, offsets, holders=holders)

    def match_many(self, hash_lists: Sequence[IntsLike], *, holders: Sequence[Hashable]) -> list[list[int]]:
        """``match(hash_lists[i], holder=holders[i])`` for each ``i`` in order (PFX-320)."""
        return self.batches.match_many(hash_lists, holders=holders)

    # ------------------------------------------------------------ starting over

    def evict(self, count: SupportsIndex) -> bool:
        """Evict the ``count`` cached blocks an allocation lacking ``count`` free blocks would (EVICT-412);
        False, evicting nothing, when fewer than ``count`` can be evicted (POOL-106)."""
        n = as_count(count, op="evict")
        return n == 0 or self.supply.evict(n)

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
        counts (POOL-111), so a handle from before the clear is stale after it.
        """
        self._drop_cache()
        self.blocks.clear()
        self.references.clear()
        self.holder_ids.clear()
        self.paused.clear()

    def _drop_cache(self) -> None:
        """Forget every registration, free the cached blocks, count the reset, emit all-cleared."""
        blocks, ops = self.blocks, self.ops
        cached = self.orders.cached_blocks()
        hashed = ops.nonzero(blocks.hash >= 0)
        for array in (blocks.hash, blocks.entry, blocks.registered, blocks.released):
            ops.fill_at(array, hashed, -1)
        blocks.push_free(cached)
        self.orders.clear()
        self.counters.resets += 1
        self.index.clear()

    # ---------------------------------------------------------- views of the state

    def check_invariants(self) -> None:
        """Verify every invariant of the spec over the arrays; raise InvariantViolation naming the rule
        (STATE-002..STATE-007, EVICT-404..EVICT-406)."""
        check_pool_invariants(self.blocks, self.orders, self.index, self.references, self.holder_ids)

    def graph_arrays(self) -> dict[str, Any]:
        """The arrays a captured CUDA graph may read, by the names of spec 09's table (CONF-908).

        Each keeps its address for the pool's lifetime (``ops.address``); their contents change
        with every operation, so a graph replayed between operations reads the current state.
        ``stack[:num_free]`` is the free stack; ``num_free`` itself is a host counter.
        """
        blocks, index = self.blocks, self.index
        arrays = {
            "ref": blocks.ref,
            "gen": blocks.gen,
            "bhash": blocks.hash,
            "stack": blocks.stack,
            "index.keys": index.index.keys,
            "index.values": index.index.values,
            "ehash": index.hash_of,
            "ehead": index.head,
            "eparent": index.parent_hash,
        }
        return {name: self.ops.export(array) for name, array in arrays.items()}

    def snapshot(self) -> dict[str, Any]:
        """A deep, comparable copy of the whole observable state, eviction orders included (ERR-501)."""
        ops, blocks = self.ops, self.blocks
        keys, values = self.references.shared.items()
        order = ops.argsort(keys)
        return {
            "free": ops.tolist(blocks.free_blocks()),
            "ref": ops.tolist(blocks.ref),
            "gen": ops.tolist(blocks.gen),
            "owner": ops.tolist(blocks.owner),
            "shared": list(zip(ops.tolist(keys[order]), ops.tolist(values[order]), strict=True)),
            "hash": ops.tolist(blocks.hash),
            "held": dict(self.holder_ids.held),
            "paused": set(self.paused.holders),
            "entries": self.index.snapshot(),
            "evictable": self.orders.eviction_order(),
            "access": self.orders.access_order() if self.policy.by_access else [],
            "registered": ops.tolist(self.orders.registration_order()),
            "events": list(self.index.events),
            "stats": self.stats,
            "counts": (blocks.num_free, self.orders.num_cached),
        }

    def __repr__(self) -> str:
        return (
            f"ArrayBlockPool(name={self.name!r}, device={self.device!r}, num_blocks={self._n}, "
            f"policy={self.policy.value!r}, free={self.num_free}, in_use={self.num_in_use}, cached={self.num_cached})"
        )
