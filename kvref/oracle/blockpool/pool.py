"""The oracle: a strict, plain, pure-Python block pool with a hash prefix cache.

:class:`OracleBlockPool` implements every rule of spec chapters 00-05 and is what other
implementations are compared with. It checks every precondition before it changes anything
(ERR-501), keeps explicit state that :meth:`OracleBlockPool.check_invariants` can read, and stays
fast: the hot paths (``allocate`` from the free stack, ``free``, ``acquire``, ``lookup``) are a
few list and dict operations per block.

State, per block id ``b`` (lists indexed by id):
  ``_ref[b]``      references from all holders;
  ``_holders[b]``  ``{holder: references}`` while in use, else None;
  ``_gen[b]``      allocations so far (POOL-111);
  ``_hash[b]``     the hash ``b`` is registered under, or None.
The free blocks are a stack (``_free``). The cache is ``_copies`` (hash -> blocks registered under
it, oldest first), ``_parent`` (resident hash -> parent hash, None for the root) and
``_children`` (hash -> number of resident hashes whose parent it is). Evictable blocks are in
``_evictable`` in release order; under ``fifo`` ``_registered`` keeps registration order.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from itertools import islice
from typing import Any, SupportsIndex

from kvref.contract.errors import (
    BlockIdError,
    BlockStateError,
    CacheInUseError,
    HashConflictError,
    InvalidTypeError,
    InvalidValueError,
    InvariantViolation,
    NotHeldError,
    OutOfBlocksError,
    PausedHolderError,
    ReservedBlockError,
    StaleBlockError,
)
from kvref.contract.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, PrefixCacheStats
from kvref.contract.pausing import PausedHolders
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
    as_holder_list,
    as_int,
    as_list,
    as_pool_shape,
    register_arguments,
    request_prefix_limit,
)

__all__ = ["OracleBlockPool"]

_LRU = EvictionPolicy.LRU
_LRU_LEAF = EvictionPolicy.LRU_LEAF
_REF_ZERO = EvictionPolicy.REF_ZERO
_FIFO = EvictionPolicy.FIFO


def take_free(free: list[int], n: int) -> list[int]:
    """Pop the top ``n`` blocks of the free stack ``free``, topmost first: what ``allocate`` hands out."""
    if not n:
        return []
    taken = free[-n:]
    del free[-n:]
    taken.reverse()
    return taken


class OracleBlockPool(PoolShape, PausedHolders):
    """Block pool and hash prefix cache, the reference semantics of kvref (chapters 00-05).

    ``num_blocks`` blocks, of which ``reserved_ids`` (default ``(0,)``, the null block) are never
    handed out (POOL-102). ``policy`` is one of ``lru``, ``lru-leaf``, ``ref-zero``, ``fifo``
    (chapter 04). ``paused_limit`` is the soft limit on references held by paused holders
    (POOL-113). ``enable_events`` turns on KV events (PFX-315).
    """

    name = "oracle"

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
        self._policy = as_policy(policy)
        self._n = n
        self._reserved = reserved
        self._is_reserved = bytearray(n)
        for r in reserved:
            self._is_reserved[r] = 1
        self._paused_limit = as_count(paused_limit, op=op, arg="paused_limit")
        self._events_on = enable_events

        self._ref = [0] * n
        self._gen = [0] * n
        self._holders: list[dict[Hashable, int] | None] = [None] * n
        self._hash: list[int | None] = [None] * n
        # Stack: the end is the top; the lowest ids come out first on a new pool.
        self._free: list[int] = [b for b in range(n - 1, -1, -1) if not self._is_reserved[b]]
        self._held: dict[Hashable, int] = {}
        self._paused: set[Hashable] = set()

        self._copies: dict[int, list[int]] = {}
        self._parent: dict[int, int | None] = {}
        self._children: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._hashed_in_use: set[int] = set()  # hashed blocks with references (for lru-leaf)
        self._registered: OrderedDict[int, None] = OrderedDict()
        self._events: list[KVEvent] = []
        self._requests = self._queries = self._hits = self._evictions = self._resets = 0

    # ------------------------------------------------------------------ sizes

    @property
    def num_free(self) -> int:
        """Blocks neither in use nor cached."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Hashed blocks with no reference, waiting to be reused or evicted."""
        return len(self._evictable)

    @property
    def num_in_use(self) -> int:
        """Blocks with at least one reference (STATE-003)."""
        return self.num_usable - len(self._free) - len(self._evictable)

    @property
    def num_available(self) -> int:
        """The largest count ``allocate`` grants now: free plus reclaimable (POOL-106)."""
        return len(self._free) + self._reclaimable()

    @property
    def policy(self) -> EvictionPolicy:
        """The eviction policy (chapter 04)."""
        return self._policy

    def capabilities(self) -> frozenset[str]:
        """Every capability of the protocol: the whole spec, and the fused replay (TRACE-1019)."""
        return STANDARD_CAPABILITIES | {"replay"}

    # ------------------------------------------------------------ block queries

    def _check_id(self, value: object, op: str) -> int:
        b = as_int(value, op=op, arg="block_id")
        if not 0 <= b < self._n:
            raise BlockIdError("POOL-103", f"{op}: block id {b} outside [0, {self._n})")
        return b

    def ref_count(self, block_id: SupportsIndex) -> int:
        """References on ``block_id`` from all holders (STATE-002)."""
        return self._ref[self._check_id(block_id, "ref_count")]

    def holders(self, block_id: SupportsIndex) -> dict[Hashable, int]:
        """A copy of ``{holder: references}`` on ``block_id`` (STATE-002)."""
        held = self._holders[self._check_id(block_id, "holders")]
        return dict(held) if held else {}

    def generation(self, block_id: SupportsIndex) -> int:
        """How many times ``block_id`` has been allocated (POOL-111)."""
        return self._gen[self._check_id(block_id, "generation")]

    def block_hash(self, block_id: SupportsIndex) -> int | None:
        """The hash ``block_id`` is registered under, or None (PFX-301)."""
        return self._hash[self._check_id(block_id, "block_hash")]

    def block_state(self, block_id: SupportsIndex) -> BlockState:
        """The state of ``block_id`` (STATE-001)."""
        b = self._check_id(block_id, "block_state")
        if self._is_reserved[b]:
            return BlockState.RESERVED
        if self._ref[b]:
            return BlockState.IN_USE
        return BlockState.FREE if self._hash[b] is None else BlockState.CACHED

    def holder_references(self, holder: Hashable) -> int:
        """References ``holder`` holds over all blocks."""
        return self._held.get(as_holder(holder, op="holder_references"), 0)

    # --------------------------------------------------------------- allocation

    def allocate(self, count: SupportsIndex, *, holder: Hashable = None) -> list[int]:
        """Take ``count`` unhashed blocks with one reference each for ``holder``, or none.

        Free blocks are taken first; cached blocks are evicted only for the shortfall
        (EVICT-408) and come back without their hash (PFX-312). Raises OutOfBlocksError when
        ``count > num_available`` (POOL-105), PausedHolderError for a paused holder (POOL-114).
        """
        n = as_count(count, op="allocate")
        holder = as_holder(holder, op="allocate")
        if n and holder in self._paused:
            raise PausedHolderError("POOL-114", f"allocate: holder {holder!r} is paused")
        if n == 0:
            return []
        free = self._free
        victims: list[int] = []
        if n > len(free):
            reclaimable = self._reclaimable()
            if n > len(free) + reclaimable:
                raise OutOfBlocksError(
                    "POOL-105",
                    f"allocate: asked for {n} blocks, {len(free) + reclaimable} available "
                    f"({len(free)} free + {reclaimable} evictable) of {self.num_usable} usable; "
                    "nothing was taken",
                )
            victims = self._evict(n - len(free))
        ids = take_free(free, n - len(victims))
        ids.extend(victims)
        ref, gen, holders = self._ref, self._gen, self._holders
        for b in ids:
            ref[b] = 1
            gen[b] += 1
            holders[b] = {holder: 1}
        self._held[holder] = self._held.get(holder, 0) + n
        return ids

    def _gen_list(self, generations: object, ids: list[int], op: str) -> list[int]:
        gens = as_block_id_list(generations, op=op, arg="generations")
        if len(gens) != len(ids):
            raise InvalidValueError(
                "ERR-506",
                f"{op}: {len(gens)} generations for {len(ids)} block ids; they must pair up",
            )
        return gens

    def _explain_unheld(self, b: int, holder: Hashable, op: str, *, rule: str = "POOL-108") -> None:
        """Raise the specific error for a block ``holder`` cannot release or share."""
        if not 0 <= b < self._n:
            raise BlockIdError("POOL-103", f"{op}: block id {b} outside [0, {self._n})")
        if self._is_reserved[b]:
            raise ReservedBlockError("POOL-118", f"{op}: block {b} is reserved and never held")
        state = self.block_state(b)
        if state is not BlockState.IN_USE:
            raise NotHeldError(rule, f"{op}: block {b} is {state.value}; holder {holder!r} holds no reference to it")
        raise NotHeldError(
            rule,
            f"{op}: holder {holder!r} holds no reference to block {b} (its holders: {self._holders[b]!r})",
        )

    def _check_release(self, ids: list[int], holder: Hashable, gens: list[int] | None, op: str) -> None:
        """Every id is a block ``holder`` holds, as often as it occurs (POOL-108, POOL-109)."""
        n, holders = self._n, self._holders
        if gens is not None:
            self._check_generations(ids, gens, op)
        for b in ids:
            if b < 0 or b >= n:
                self._explain_unheld(b, holder, op)
            held = holders[b]
            if held is None or holder not in held:
                self._explain_unheld(b, holder, op)
        if len(ids) > 1 and len(set(ids)) != len(ids):
            for b, times in Counter(ids).items():
                have = holders[b][holder]  # type: ignore[index]
                if times > have:
                    raise NotHeldError(
                        "POOL-109",
                        f"{op}: block {b} occurs {times} times but holder {holder!r} holds {have} reference(s) to it",
                    )

    def _check_generations(self, ids: list[int], gens: list[int], op: str) -> None:
        n, gen = self._n, self._gen
        for b, g in zip(ids, gens, strict=True):
            if 0 <= b < n and not self._is_reserved[b] and gen[b] != g:
                raise StaleBlockError(
                    "POOL-112",
                    f"{op}: stale reference to block {b}: generation {g}, current {gen[b]} "
                    "(the block was freed and handed out again)",
                )

    def free(
        self,
        block_ids: IntsLike,
        *,
        holder: Hashable = None,
        generations: IntsLike | None = None,
    ) -> None:
        """Drop one of ``holder``'s references per occurrence in ``block_ids``, in list order.

        A block whose last reference goes becomes free, or cached if hashed (PFX-311), or is
        dropped from the cache under ``ref-zero`` (EVICT-405). Positions earlier in the list count
        as released earlier (EVICT-401). All-or-nothing (POOL-107..POOL-109, POOL-112).
        """
        ids = as_block_id_list(block_ids, op="free")
        holder = as_holder(holder, op="free")
        gens = None if generations is None else self._gen_list(generations, ids, "free")
        self._check_release(ids, holder, gens, "free")
        self._release(ids, holder)

    def _release(self, ids: list[int], holder: Hashable) -> None:
        ref, holders, hashes, free = self._ref, self._holders, self._hash, self._free
        ref_zero = self._policy is _REF_ZERO
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
                self._hashed_in_use.discard(b)
                if ref_zero:
                    dropped.append(b)
                    free.append(b)
                else:
                    self._evictable[b] = None
        if dropped:
            self._unregister(dropped)
            self._evictions += len(dropped)
        if ids:
            left_held = self._held[holder] - len(ids)
            if left_held:
                self._held[holder] = left_held
            else:
                del self._held[holder]

    def acquire(
        self,
        block_ids: IntsLike,
        *,
        holder: Hashable = None,
        generations: IntsLike | None = None,
    ) -> None:
        """Add one reference for ``holder`` per occurrence; blocks must be in use or cached.

        A cached block so acquired is pinned: it leaves the evictable set (PFX-310, POOL-110).
        """
        ids = as_block_id_list(block_ids, op="acquire")
        holder = as_holder(holder, op="acquire")
        if holder in self._paused and ids:
            raise PausedHolderError("POOL-114", f"acquire: holder {holder!r} is paused")
        gens = None if generations is None else self._gen_list(generations, ids, "acquire")
        if gens is not None:
            self._check_generations(ids, gens, "acquire")
        n, ref, hashes, reserved = self._n, self._ref, self._hash, self._is_reserved
        for b in ids:
            if b < 0 or b >= n:
                raise BlockIdError("POOL-103", f"acquire: block id {b} outside [0, {n})")
            if reserved[b]:
                raise ReservedBlockError("POOL-118", f"acquire: block {b} is reserved and never held")
            if ref[b] == 0 and hashes[b] is None:
                raise BlockStateError(
                    "POOL-119", f"acquire: block {b} is free; only blocks in use or cached can be acquired"
                )
        self._pin(ids, holder)

    def _pin(self, ids: list[int], holder: Hashable) -> None:
        ref, holders, evictable = self._ref, self._holders, self._evictable
        for b in ids:
            r = ref[b]
            if r == 0:
                del evictable[b]
                self._hashed_in_use.add(b)
                holders[b] = {holder: 1}
            else:
                held = holders[b]
                held[holder] = held.get(holder, 0) + 1  # type: ignore[index,union-attr]
            ref[b] = r + 1
        if ids:
            self._held[holder] = self._held.get(holder, 0) + len(ids)

    # --------------------------------------------------------------- batching

    def allocate_many(self, counts: IntsLike, *, holders: Sequence[Hashable]) -> list[list[int]]:
        """Admit the longest prefix of the batch that fits, in order (POOL-116).

        Entry ``i`` asks ``counts[i]`` blocks for ``holders[i]``; admission stops at the first
        entry that does not fit, and later entries are not tried. Bad input anywhere in the batch
        raises before any block is taken (ERR-501).
        """
        op = "allocate_many"
        cs = [
            as_count(c, op=op, arg=f"counts[{i}]") for i, c in enumerate(as_block_id_list(counts, op=op, arg="counts"))
        ]
        hs = as_holder_list(holders, len(cs), op=op)
        for c, h in zip(cs, hs, strict=True):
            if c and h in self._paused:
                raise PausedHolderError("POOL-114", f"{op}: holder {h!r} is paused")
        out: list[list[int]] = []
        for c, h in zip(cs, hs, strict=True):
            try:
                out.append(self.allocate(c, holder=h))
            except OutOfBlocksError:
                break
        return out

    def free_many(self, block_lists: Sequence[IntsLike], *, holders: Sequence[Hashable]) -> None:
        """``free(block_lists[i], holder=holders[i])`` for each ``i`` in order, atomically (POOL-117).

        The whole batch is checked first, duplicates across entries of one holder included, so a
        bad entry anywhere leaves every reference in place.
        """
        op = "free_many"
        entries = as_list(block_lists, op=op, arg="block_lists")
        lists = [as_block_id_list(ids, op=op, arg=f"block_lists[{i}]") for i, ids in enumerate(entries)]
        hs = as_holder_list(holders, len(lists), op=op)
        by_holder: dict[Hashable, list[int]] = {}
        for ids, h in zip(lists, hs, strict=True):
            by_holder.setdefault(h, []).extend(ids)
        for h, ids in by_holder.items():
            self._check_release(ids, h, None, op)
        for ids, h in zip(lists, hs, strict=True):
            self._release(ids, h)

    def match_many(self, hash_lists: Sequence[IntsLike], *, holders: Sequence[Hashable]) -> list[list[int]]:
        """``match(hash_lists[i], holder=holders[i])`` for each ``i`` in order (PFX-320)."""
        op = "match_many"
        entries = as_list(hash_lists, op=op, arg="hash_lists")
        lists = [as_hash_list(hl, op=op, arg=f"hash_lists[{i}]") for i, hl in enumerate(entries)]
        hs = as_holder_list(holders, len(lists), op=op)
        for h, hl in zip(hs, lists, strict=True):
            if h in self._paused and hl:
                raise PausedHolderError("POOL-114", f"{op}: holder {h!r} is paused")
        return [self._match(hl, None, h) for hl, h in zip(lists, hs, strict=True)]

    # ------------------------------------------------------------------- pause

    def _references_of(self, holder: Hashable) -> int:
        return self._held.get(holder, 0)

    # ----------------------------------------------------------- prefix cache

    def register(
        self,
        block_ids: IntsLike,
        block_hashes: IntsLike,
        *,
        parent_hash: SupportsIndex | None = None,
    ) -> None:
        """Cache in-use blocks: ``block_ids[i]`` under ``block_hashes[i]``, chained (PFX-301).

        ``block_hashes[0]``'s parent is ``parent_hash`` (None: the chain's root); each later
        hash's parent is the hash before it. Blocks must be in use (PFX-302) and unhashed
        (PFX-303); the parent must be resident (PFX-304); a resident hash keeps its parent
        (PFX-306). A hash that gains its first copy is reported as stored (PFX-317).
        """
        op = "register"
        ids, hs, parent = register_arguments(
            block_ids, block_hashes, parent_hash, parent_resident=self._copies.__contains__
        )
        prev = parent
        pending: dict[int, int | None] = {}  # hashes this call makes resident -> their parent
        for b, h in zip(ids, hs, strict=True):
            if b < 0 or b >= self._n or self._is_reserved[b]:
                self._explain_unheld(b, None, op, rule="PFX-302")
            if self._ref[b] == 0:
                raise BlockStateError(
                    "PFX-302",
                    f"{op}: block {b} is {self.block_state(b).value}; only blocks in use can be registered",
                )
            if self._hash[b] is not None:
                raise HashConflictError("PFX-303", f"{op}: block {b} is already registered under {self._hash[b]:#x}")
            if h == prev:
                raise HashConflictError("PFX-306", f"{op}: hash {h:#x} cannot be its own parent")
            known = self._parent if h in self._parent else pending
            if h in known and known[h] != prev:
                raise HashConflictError(
                    "PFX-306",
                    f"{op}: hash {h:#x} is resident with parent {known[h]!r}, registration gives parent {prev!r}",
                )
            if h not in known and h in self._children and self._is_ancestor(h, prev, pending):
                raise HashConflictError(
                    "PFX-306", f"{op}: registering {h:#x} under {prev!r} would make it its own ancestor"
                )
            pending.setdefault(h, prev)
            prev = h
        prev = parent
        for b, h in zip(ids, hs, strict=True):
            self._hash[b] = h
            self._hashed_in_use.add(b)
            copies = self._copies.get(h)
            if copies is None:
                self._copies[h] = [b]
                self._parent[h] = prev
                if prev is not None:
                    self._children[prev] = self._children.get(prev, 0) + 1
                if self._events_on:
                    self._events.append(BlockStored(h, prev))
            else:
                copies.append(b)
            if self._policy is _FIFO:
                self._registered[b] = None
            prev = h

    def _is_ancestor(self, h: int, start: int | None, pending: dict[int, int | None]) -> bool:
        """Whether ``h`` lies on the parent chain from ``start`` up (a would-be cycle, PFX-306)."""
        seen: set[int] = set()
        node = start
        while node is not None and node not in seen:
            if node == h:
                return True
            seen.add(node)
            node = self._parent[node] if node in self._parent else pending.get(node)
        return False

    def _unregister(self, blocks: Iterable[int], *, keep_tree: bool = True) -> None:
        """Remove the hash registration of each of ``blocks`` in order; a hash leaves with its last copy.

        The blocks leave the evictable and registration orders too; their caller puts them on
        the free stack or hands them out. Callers pass hashed blocks only. ``keep_tree=False``
        leaves ``_parent`` and ``_children`` to a caller that rebuilds them afterwards (the
        one-call replay); eviction under lru-leaf reads them, so it always keeps them.
        """
        hashes, copies, parents, children = self._hash, self._copies, self._parent, self._children
        evictable, registered = self._evictable, self._registered
        events = self._events if self._events_on else None
        for b in blocks:
            h: int = hashes[b]  # type: ignore[assignment]
            hashes[b] = None
            found = copies[h]
            if len(found) > 1:
                found.remove(b)
            else:
                del copies[h]
                parent = parents.pop(h) if keep_tree else None
                if parent is not None:
                    left = children[parent] - 1
                    if left:
                        children[parent] = left
                    else:
                        del children[parent]
                if events is not None:
                    events.append(BlockRemoved(h))
            evictable.pop(b, None)
            if registered:
                registered.pop(b, None)

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
        return self._lookup(hs, parent, prefer)

    def _lookup(self, hs: list[int], parent: int | None, prefer: Sequence[int] | None = None) -> list[int]:
        out: list[int] = []
        copies, parents = self._copies, self._parent
        for i, h in enumerate(hs):
            found = copies.get(h)
            if found is None or parents[h] != parent:
                break
            if prefer is not None and i < len(prefer) and prefer[i] in found:
                out.append(prefer[i])
            else:
                out.append(found[0])
            parent = h
        return out

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
        if holder in self._paused and hs:
            raise PausedHolderError("POOL-114", f"match: holder {holder!r} is paused")
        return self._match(hs, parent, holder, prefer)

    def _match(
        self, hs: list[int], parent: int | None, holder: Hashable, prefer: Sequence[int] | None = None
    ) -> list[int]:
        hit = self._lookup(hs, parent, prefer)
        self._pin(hit, holder)
        self._requests += 1
        self._queries += len(hs)
        self._hits += len(hit)
        return hit

    def match_request(
        self,
        block_hashes: IntsLike,
        *,
        num_tokens: SupportsIndex,
        block_size: SupportsIndex,
        holder: Hashable = None,
    ) -> list[int]:
        """``match`` for a request of ``num_tokens`` tokens: its last token is never a hit (REQ-701).

        At most ``(num_tokens - 1) // block_size`` blocks are matched, so the engine always has at
        least one token to compute and gets the logits of the last one.
        """
        hs = as_hash_list(block_hashes, op="match_request")
        limit = request_prefix_limit(len(hs), num_tokens, block_size)
        return self.match(hs[:limit], holder=holder)

    def replay_requests(self, block_lists: Sequence[IntsLike]) -> ReplayedBatch:
        """Replay a batch of requests as :func:`kvref.simulation.replay.replay` does, in one call (TRACE-1019).

        Request ``ids`` in turn, by a holder holding nothing else: ``match(ids)``, allocate the
        misses as far as ``num_available`` allows (TRACE-1015), register them after the hit,
        release all tail first (TRACE-1014). The pool ends exactly as those calls leave it, stats
        and events included. The whole batch is checked first: each entry a chain of hashes, all
        of them one prefix tree (TRACE-1006) agreeing with the resident parents (PFX-306);
        otherwise HashConflictError and nothing changes (ERR-501).
        """
        from kvref.oracle.blockpool.replaying import replay_requests

        return replay_requests(self, block_lists)

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

        return hash_token_blocks(
            token_ids,
            block_size,
            adapter=adapter,
            cache_salt=cache_salt,
            multimodal=multimodal,
        )

    def resident_hashes(self) -> frozenset[int]:
        """Hashes with at least one cached copy, in use or evictable (PFX-305)."""
        return frozenset(self._copies)

    def reset(self) -> None:
        """Drop every cached block; refused with CacheInUseError while a block is in use (PFX-313)."""
        in_use = self.num_in_use
        if in_use:
            raise CacheInUseError("PFX-313", f"reset: {in_use} block(s) in use; release every reference first")
        self._drop_cache()

    def _drop_cache(self) -> None:
        """Forget every registration, free the cached blocks, count the reset, emit all-cleared."""
        for b in self._evictable:
            self._hash[b] = None
            self._free.append(b)
        self._evictable.clear()
        self._registered.clear()
        self._copies.clear()
        self._parent.clear()
        self._children.clear()
        self._resets += 1
        if self._events_on:
            self._events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        """Events since the last call, oldest first, and forget them (PFX-315)."""
        events, self._events = self._events, []
        return events

    @property
    def stats(self) -> PrefixCacheStats:
        """Cumulative hit statistics (PFX-318, PFX-319)."""
        return PrefixCacheStats(self._requests, self._queries, self._hits, self._evictions, self._resets)

    # ---------------------------------------------------------------- eviction

    def _reclaimable(self) -> int:
        """How many cached blocks eviction could free now, under the policy (POOL-106)."""
        if self._policy is not _LRU_LEAF:
            return len(self._evictable)
        # A hash with an in-use copy below it must keep one copy: mark the ancestors of every
        # in-use hashed block; each marked hash with no in-use copy of its own keeps one.
        hashes, parents = self._hash, self._parent
        own_use = {hashes[b] for b in self._hashed_in_use}
        busy_below: set[int] = set()
        for h in own_use:
            p = parents[h]  # type: ignore[index]
            while p is not None and p not in busy_below:
                busy_below.add(p)
                p = parents[p]
        return len(self._evictable) - len(busy_below - own_use)

    def _evict(self, k: int, *, keep_tree: bool = True) -> list[int]:
        """Evict ``k`` cached blocks by the policy; they come back unhashed, off every list.

        The caller has checked that ``k`` blocks are reclaimable (POOL-106). ``keep_tree`` is as
        for :meth:`_unregister`; lru-leaf always keeps the tree, which it reads.
        """
        if self._policy is _LRU_LEAF:
            victims = self._evict_leaves(k)
        else:
            if self._policy is _FIFO:
                ref = self._ref
                victims = list(islice((b for b in self._registered if ref[b] == 0), k))
            else:
                victims = list(islice(self._evictable, k))
            self._unregister(victims, keep_tree=keep_tree)
        self._evictions += k
        return victims

    def _evict_leaves(self, k: int) -> list[int]:
        """lru-leaf (EVICT-403): ``k`` times, unregister the least recently released block whose
        removal keeps the resident hashes prefix-closed: one that is not its hash's last copy, or
        whose hash has no resident child.

        Taken one at a time from the front, since removing a hash's last copy can make its parent
        a leaf. A pass over the release order does the same in one go: it counts the copies and
        children its victims take away, so each block is judged as if the victims before it were
        gone, and it starts over only when a victim's parent may be a block it already passed.
        """
        evictable, hashes, copies, children, parents = (
            self._evictable, self._hash, self._copies, self._children, self._parent
        )  # fmt: skip
        victims: list[int] = []
        while len(victims) < k:
            want = k - len(victims)
            taken: dict[int, int] = {}  # hash -> its copies this pass takes, for hashes of several copies
            lost: dict[int, int] = {}  # hash -> resident children this pass removes
            batch: list[int] = []
            passed = False
            for b in evictable:
                h: int = hashes[b]  # type: ignore[assignment]
                copies_of_h = len(copies[h])
                left = copies_of_h - taken.get(h, 0) if copies_of_h > 1 else 1  # this one and later ones
                if left == 1 and h in children and children[h] != lost.get(h, 0):
                    passed = True  # the last copy of a hash with a resident child: not a leaf (yet)
                    continue
                if copies_of_h > 1:
                    taken[h] = copies_of_h - left + 1
                batch.append(b)
                if len(batch) == want:
                    break
                if left == 1:
                    parent = parents[h]
                    if parent is not None:
                        lost[parent] = lost.get(parent, 0) + 1
                        if passed:
                            break  # the parent may be a block passed over: start again
            if not batch:
                raise self._violation("POOL-106", f"no evictable leaf left after {len(victims)} of {k} victims")
            self._unregister(batch)
            victims.extend(batch)
        return victims

    # -------------------------------------------------------------- inspection

    def snapshot(self) -> dict[str, Any]:
        """A deep, comparable copy of the whole state, eviction order included (ERR-501)."""
        return {
            "free": list(self._free),
            "ref": list(self._ref),
            "gen": list(self._gen),
            "holders": [dict(h) if h else None for h in self._holders],
            "hash": list(self._hash),
            "held": dict(self._held),
            "paused": set(self._paused),
            "copies": {h: list(c) for h, c in self._copies.items()},
            "parent": dict(self._parent),
            "children": dict(self._children),
            "evictable": list(self._evictable),
            "registered": list(self._registered),
            "events": list(self._events),
            "stats": self.stats,
        }

    def check_invariants(self) -> None:
        """Verify every invariant of the spec; raise InvariantViolation naming the rule broken."""
        from kvref.oracle.blockpool.invariants import check_pool_invariants

        check_pool_invariants(self)

    def _violation(self, rule: str, message: str) -> InvariantViolation:
        return InvariantViolation(rule, f"check_invariants: {message}")

    def __repr__(self) -> str:
        return (
            f"OracleBlockPool(num_blocks={self._n}, policy={self._policy.value!r}, "
            f"free={self.num_free}, in_use={self.num_in_use}, cached={self.num_cached})"
        )
