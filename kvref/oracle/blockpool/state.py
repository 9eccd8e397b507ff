"""The oracle's state, declared once, and what reads it plainly (chapters 00-05).

:class:`PoolState` builds every field the mixins of :mod:`kvref.oracle.blockpool` share and
answers the queries that only read them. It also declares the internal methods the mixins call
on one another (each raises NotImplementedError here and is defined by exactly one mixin), so
each mixin can be read, and type-checked, on its own.

State, per block id ``b`` (lists indexed by id):
  ``_ref[b]``      references from all holders;
  ``_holders[b]``  ``{holder: references}`` while in use, else None;
  ``_gen[b]``      allocations so far (POOL-111);
  ``_hash[b]``     the hash ``b`` is registered under, or None.
The free blocks are a stack (``_free``). The cache is ``_copies`` (hash -> blocks registered under
it, oldest first), ``_parent`` (resident hash -> parent hash, None for the root) and
``_children`` (hash -> number of resident hashes whose parent it is). Evictable blocks are in
``_evictable`` in release order; under ``fifo`` ``_registered`` keeps registration order; under
``lru-leaf-access`` ``_access[b]`` is the position of ``b``'s last access (EVICT-411).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from typing import SupportsIndex

from kvref.contract.checks import HashEntry
from kvref.contract.errors import BlockIdError, InvalidTypeError, InvariantViolation
from kvref.contract.events import KVEvent, PrefixCacheStats
from kvref.contract.pausing import PausedHolders
from kvref.contract.policies import EvictionPolicy, as_policy
from kvref.contract.protocol import BlockState
from kvref.contract.shape import PoolShape
from kvref.contract.validate import IntsLike, as_count, as_holder, as_int, as_pool_shape

__all__ = ["PoolState"]


class PoolState(PoolShape, PausedHolders):
    """The oracle's fields, its sizes and per-block queries; the base of every oracle mixin.

    ``num_blocks`` blocks, of which ``reserved_ids`` (default ``(0,)``, the null block) are never
    handed out (POOL-102). ``policy`` is one of ``lru``, ``lru-leaf``, ``ref-zero``, ``fifo``,
    ``lru-leaf-access`` (chapter 04). ``paused_limit`` is the soft limit on references held by paused holders
    (POOL-113). ``enable_events`` turns on KV events (PFX-315).
    """

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
        self._access = [-1] * n  # lru-leaf-access: each block's last access, a position in _access_clock
        self._access_clock = 0
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

    def hash_entry(self, block_hash: int) -> HashEntry | None:
        """What the prefix index knows of ``block_hash``: resident, its parent, whether it has
        resident children; None when neither (the explainers' view, :mod:`kvref.contract.checks`)."""
        resident = block_hash in self._parent
        has_children = block_hash in self._children
        if not resident and not has_children:
            return None
        return HashEntry(resident, self._parent.get(block_hash), has_children)

    @property
    def stats(self) -> PrefixCacheStats:
        """Cumulative hit statistics (PFX-318, PFX-319)."""
        return PrefixCacheStats(self._requests, self._queries, self._hits, self._evictions, self._resets)

    def _stamp_access(self, ids: Iterable[int]) -> None:
        """Mark the blocks one call handed out or pinned as accessed now, in ascending id order
        (EVICT-411); only ``lru-leaf-access`` reads the marks."""
        if self._policy.by_access:
            access, clock = self._access, self._access_clock
            for b in sorted(set(ids)):
                access[b] = clock
                clock += 1
            self._access_clock = clock

    def _references_of(self, holder: Hashable) -> int:
        return self._held.get(holder, 0)

    def _violation(self, rule: str, message: str) -> InvariantViolation:
        return InvariantViolation(rule, f"check_invariants: {message}")

    # ------------------------------------------- what the mixins provide one another

    def allocate(self, count: SupportsIndex, *, holder: Hashable = None) -> list[int]:
        """Take ``count`` blocks for ``holder`` (POOL-104..POOL-106); :mod:`.references`."""
        raise NotImplementedError

    def _reclaimable(self) -> int:
        """How many cached blocks eviction could free now, under the policy (POOL-106); :mod:`.eviction`."""
        raise NotImplementedError

    def _evict(self, k: int, *, keep_tree: bool = True) -> list[int]:
        """Evict ``k`` cached blocks by the policy, unhashed and off every list; :mod:`.eviction`."""
        raise NotImplementedError

    def _unregister(self, blocks: Iterable[int], *, keep_tree: bool = True) -> None:
        """Remove the hash registration of each of ``blocks`` in order; :mod:`.prefix`."""
        raise NotImplementedError

    def _pin(self, ids: list[int], holder: Hashable) -> None:
        """Add one reference for ``holder`` per position of checked ``ids``; :mod:`.references`."""
        raise NotImplementedError

    def _release(self, ids: list[int], holder: Hashable) -> None:
        """Drop one of ``holder``'s references per position of checked ``ids``; :mod:`.references`."""
        raise NotImplementedError

    def _check_release(self, ids: list[int], holder: Hashable, gens: list[int] | None, op: str) -> None:
        """Refuse a release ``holder`` cannot make (POOL-108, POOL-109, POOL-112); :mod:`.references`."""
        raise NotImplementedError

    def _match(
        self, hs: list[int], parent: int | None, holder: Hashable, prefer: Sequence[int] | None = None
    ) -> list[int]:
        """Look up, pin and count a checked chain; :mod:`.prefix`."""
        raise NotImplementedError
