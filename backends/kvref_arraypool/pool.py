"""The array core: a block pool and hash prefix cache with all state in device arrays (chapters 00-05, 09).

:class:`ArrayBlockPool` implements the same protocol and rules as the oracle
(:class:`kvref.oracle.OracleBlockPool`), over int64 arrays owned by an
:class:`~kvref_arraypool.ops.ArrayOps` (NumPy, CuPy or torch). There is no per-block Python
object and no Python loop over blocks on any path that succeeds: each call is a constant number
of array operations over its batch (plus a few per probe step of the hash tables and per
pointer-doubling round of lru-leaf eviction). Bad input is *detected* with array operations; only
then does a scalar routine walk the batch to name the first offending entry exactly as the
oracle does, so the error class, rule and message agree with the oracle's (ERR-501, ERR-502).

State (``n`` blocks, ``E = 2n + 2`` hash entries):

* per block: ``ref`` (references), ``gen`` (POOL-111), ``owner`` (-1: none; ``h >= 0``: holder
  id ``h`` holds every reference; -2: shared, per-holder counts in ``shared``), ``bhash`` and
  ``bentry`` (the hash and its entry, or -1), ``regstamp`` (registration stamp: copy age and
  fifo order), ``evstamp`` (release stamp while cached, else -1: lru order);
* the free stack ``stack[:nfree]`` (top at the end) with ``nfree`` kept on the host, so the
  free count is read without a device sync;
* hash entries: ``index`` (hash -> entry id, open addressing), and per entry its hash, parent
  hash, parent entry, depth, number of copies, number of resident child hashes and oldest copy
  (``head``). An entry lives while its hash is resident or has resident children (STATE-007);
* the orders: ``lru_order`` (release order of cached blocks) and ``fifo_order`` (registration
  order), append-only arrays with lazy deletion (:mod:`kvref_arraypool.queue`).

Holders are mapped to small integer ids on the host (one dict entry per holder, never per block).

CUDA graphs (CONF-908): ``ref``, ``gen``, ``bhash``, ``stack`` and the prefix ``index`` arrays
are allocated once at construction and never reallocated, so kernels captured in a CUDA graph may
read them at fixed addresses between calls. Every method of this class runs between captures:
allocation sizes, error checks and eviction depend on values read back to the host.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from itertools import accumulate
from typing import Any, SupportsIndex

import numpy as np

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
    ReservedBlockError,
    StaleBlockError,
    UnknownHashError,
)
from kvref.contract.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, PrefixCacheStats
from kvref.contract.pausing import PausedHolders
from kvref.contract.policies import EvictionPolicy, as_policy
from kvref.contract.protocol import STANDARD_CAPABILITIES, BlockState
from kvref.contract.shape import PoolShape
from kvref.contract.validate import (
    IntsLike,
    as_count,
    as_hash,
    as_holder,
    as_holder_list,
    as_int,
    as_list,
    as_pool_shape,
    request_prefix_limit,
)
from kvref_arraypool.inputs import hash_array, index_array
from kvref_arraypool.leaf import leaf_order
from kvref_arraypool.ops import Array, ArrayOps
from kvref_arraypool.queue import StampQueue
from kvref_arraypool.table import HashTable

__all__ = ["ArrayBlockPool"]

_LRU = EvictionPolicy.LRU
_LRU_LEAF = EvictionPolicy.LRU_LEAF
_REF_ZERO = EvictionPolicy.REF_ZERO
_FIFO = EvictionPolicy.FIFO
_SHARED = -2
_NOBODY = -1
_HID_BITS = 32
_HID_MASK = (1 << _HID_BITS) - 1


class ArrayBlockPool(PoolShape, PausedHolders):
    """Block pool and hash prefix cache over device arrays; the oracle's semantics (chapters 00-05).

    ``ops`` chooses the array library and device. Other arguments are the oracle's: ``num_blocks``
    blocks of which ``reserved_ids`` are never handed out (POOL-102), eviction ``policy``
    (chapter 04), ``paused_limit`` (POOL-113) and ``enable_events`` (PFX-315). Block ids are
    handed out in the oracle's order, so the pool also passes the ``exact-order`` profile.
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
        op = name
        n, reserved = as_pool_shape(num_blocks, reserved_ids, op=op)
        if not isinstance(enable_events, bool):
            raise InvalidTypeError("POOL-101", f"{op}: enable_events must be a bool")
        self.name = name
        self.ops = ops
        self._policy = as_policy(policy)
        self._n = n
        self._reserved = reserved
        self._paused_limit = as_count(paused_limit, op=op, arg="paused_limit")
        self._events_on = enable_events

        host_reserved = np.zeros(n, dtype=bool)
        host_reserved[list(reserved)] = True
        self._host_reserved = host_reserved
        self._is_reserved = ops.asarray(host_reserved.copy())
        free = np.arange(n - 1, -1, -1, dtype=np.int64)
        free = free[~host_reserved[::-1]]
        self._stack = ops.zeros(n)
        self._stack[: len(free)] = ops.asarray(free)
        self._nfree = len(free)

        self._ref = ops.zeros(n)
        self._gen = ops.zeros(n)
        self._owner = ops.full(n, _NOBODY)
        self._bhash = ops.full(n, -1)
        self._bentry = ops.full(n, -1)
        self._regstamp = ops.full(n, -1)
        self._evstamp = ops.full(n, -1)
        self._mark = ops.full(n, -1)
        self._positions = ops.arange(n)

        n_entries = 2 * n + 2
        self._n_entries = n_entries
        self._ehash = ops.full(n_entries, -1)
        self._eparent = ops.full(n_entries, -1)
        self._epentry = ops.full(n_entries, -1)
        self._edepth = ops.zeros(n_entries)
        self._ecopies = ops.zeros(n_entries)
        self._echildren = ops.zeros(n_entries)
        self._ehead = ops.full(n_entries, -1)
        self._estack = ops.arange(n_entries)
        self._nefree = n_entries
        self._escratch = ops.zeros(n_entries)
        self._escratch2 = ops.full(n_entries, -1)
        self._index = HashTable(ops, n_entries, growable=False)
        self._shared = HashTable(ops, 64, growable=True)

        self._lru_order = StampQueue(ops, self._evstamp, 2 * n + 64)
        self._fifo_order = StampQueue(ops, self._regstamp, 2 * n + 64)
        self._clock = 0
        self._ncached = 0

        self._hids: dict[Hashable, int] = {}
        self._holder_of: list[Hashable] = []
        self._spare_hids: list[int] = []
        self._held: dict[Hashable, int] = {}
        self._paused: set[Hashable] = set()
        self._events: list[KVEvent] = []
        self._requests = self._queries = self._hits = self._evictions = self._resets = 0

    # ------------------------------------------------------------------ sizes

    @property
    def num_free(self) -> int:
        """Blocks neither in use nor cached; a host counter, no device sync."""
        return self._nfree

    @property
    def num_cached(self) -> int:
        """Hashed blocks with no reference; a host counter, no device sync."""
        return self._ncached

    @property
    def num_in_use(self) -> int:
        """Blocks with at least one reference (STATE-003)."""
        return self.num_usable - self._nfree - self._ncached

    @property
    def num_available(self) -> int:
        """The largest count ``allocate`` grants now: free plus reclaimable (POOL-106)."""
        return self._nfree + self._reclaimable()

    @property
    def policy(self) -> EvictionPolicy:
        """The eviction policy (chapter 04)."""
        return self._policy

    @property
    def device(self) -> str:
        """Where the arrays live."""
        return self.ops.device

    def capabilities(self) -> frozenset[str]:
        """Every capability of the protocol but the fused replay (TRACE-1019): replay goes step by step."""
        return STANDARD_CAPABILITIES

    # ----------------------------------------------------------- holders

    def _hid(self, holder: Hashable) -> int:
        hid = self._hids.get(holder)
        if hid is None:
            if self._spare_hids:
                hid = self._spare_hids.pop()
                self._holder_of[hid] = holder
            else:
                hid = len(self._holder_of)
                if hid > _HID_MASK >> 1:  # pragma: no cover - 2**31 holders at once
                    raise OutOfBlocksError("POOL-105", f"{self.name}: more than 2**31 holders hold references")
                self._holder_of.append(holder)
            self._hids[holder] = hid
        return hid

    def _add_held(self, holder: Hashable, count: int) -> None:
        if count:
            self._held[holder] = self._held.get(holder, 0) + count

    def _drop_held(self, holder: Hashable, count: int) -> None:
        if not count:
            return
        left = self._held[holder] - count
        if left:
            self._held[holder] = left
        else:
            del self._held[holder]
            hid = self._hids.pop(holder)
            self._spare_hids.append(hid)

    def _references_of(self, holder: Hashable) -> int:
        return self._held.get(holder, 0)

    # ------------------------------------------------------------ block queries

    def _check_id(self, value: object, op: str) -> int:
        b = as_int(value, op=op, arg="block_id")
        if not 0 <= b < self._n:
            raise BlockIdError("POOL-103", f"{op}: block id {b} outside [0, {self._n})")
        return b

    def ref_count(self, block_id: SupportsIndex) -> int:
        """References on ``block_id`` from all holders (STATE-002)."""
        return int(self._ref[self._check_id(block_id, "ref_count")])

    def holders(self, block_id: SupportsIndex) -> dict[Hashable, int]:
        """``{holder: references}`` on ``block_id`` (STATE-002)."""
        b = self._check_id(block_id, "holders")
        return self._holders_of(b)

    def _holders_of(self, b: int) -> dict[Hashable, int]:
        owner = int(self._owner[b])
        if owner == _NOBODY:
            return {}
        if owner >= 0:
            return {self._holder_of[owner]: int(self._ref[b])}
        keys, values = self._shared.items()
        mine = (keys >> _HID_BITS) == b
        hids = self.ops.tolist(keys[mine] & _HID_MASK)
        counts = self.ops.tolist(values[mine])
        return {self._holder_of[h]: c for h, c in zip(hids, counts, strict=True)}

    def generation(self, block_id: SupportsIndex) -> int:
        """How many times ``block_id`` has been allocated (POOL-111)."""
        return int(self._gen[self._check_id(block_id, "generation")])

    def block_hash(self, block_id: SupportsIndex) -> int | None:
        """The hash ``block_id`` is registered under, or None (PFX-301)."""
        h = int(self._bhash[self._check_id(block_id, "block_hash")])
        return None if h < 0 else h

    def block_state(self, block_id: SupportsIndex) -> BlockState:
        """The state of ``block_id`` (STATE-001)."""
        return self._state_of(self._check_id(block_id, "block_state"))

    def _state_of(self, b: int) -> BlockState:
        if self._host_reserved[b]:
            return BlockState.RESERVED
        if int(self._ref[b]):
            return BlockState.IN_USE
        return BlockState.FREE if int(self._bhash[b]) < 0 else BlockState.CACHED

    def holder_references(self, holder: Hashable) -> int:
        """References ``holder`` holds over all blocks."""
        return self._held.get(as_holder(holder, op="holder_references"), 0)

    # ---------------------------------------------------------------- helpers

    def _distinct(self, ids: Array) -> bool:
        """Whether device ids (all in range) are pairwise distinct: a scatter and a gather, no sort."""
        m = len(ids)
        if m < 2:
            return True
        if m > self._n:
            return False
        pos = self._positions[:m]
        self._mark[ids] = pos
        return not self.ops.any(self._mark[ids] != pos)

    def _in_range(self, host_ids: np.ndarray) -> bool:
        return len(host_ids) == 0 or (int(host_ids.min()) >= 0 and int(host_ids.max()) < self._n)

    def _push_free(self, blocks: Array) -> None:
        m = len(blocks)
        if m:
            self._stack[self._nfree : self._nfree + m] = blocks
            self._nfree += m

    def _stamps(self, m: int) -> Array:
        start = self._clock
        self._clock += m
        return self.ops.arange(start, start + m)

    # --------------------------------------------------------------- allocation

    def allocate(self, count: SupportsIndex, *, holder: Hashable = None) -> list[int]:
        """Take ``count`` unhashed blocks with one reference each for ``holder``, or none (POOL-104..106).

        Free blocks are taken first (top of the stack first); cached blocks are evicted only for
        the shortfall (EVICT-408) and come back without their hash (PFX-312).
        """
        return self.ops.tolist(self.allocate_ids(count, holder=holder))

    def allocate_ids(self, count: SupportsIndex, *, holder: Hashable = None) -> Array:
        """``allocate``, returning the ids as a device array (int64) instead of a list.

        The form an engine uses to write block tables without a round trip through Python ints.
        """
        n = as_count(count, op="allocate")
        holder = as_holder(holder, op="allocate")
        self._refuse_if_paused(holder, n, "allocate")
        if n == 0:
            return self.ops.zeros(0)
        ids = self._take(n, "allocate")
        self._hand_out(ids, self._hid(holder))
        self._add_held(holder, n)
        return ids

    def _hand_out(self, ids: Array, hids: Array | int) -> None:
        self._ref[ids] = 1
        self._gen[ids] += 1
        self._owner[ids] = hids

    def _take(self, n: int, op: str) -> Array:
        """Pop ``n`` blocks: the free stack top-down, then eviction victims (POOL-105, EVICT-408)."""
        nf = self._nfree
        if n <= nf:
            ids = self.ops.copy(self.ops.flip(self._stack[nf - n : nf]))
            self._nfree = nf - n
            return ids
        short = n - nf
        victims, reclaimable = self._select_victims(short)
        if len(victims) < short:
            raise OutOfBlocksError(
                "POOL-105",
                f"{op}: asked for {n} blocks, {nf + reclaimable} available "
                f"({nf} free + {reclaimable} evictable) of {self.num_usable} usable; nothing was taken",
            )
        ids = self.ops.concat([self.ops.flip(self._stack[:nf]), victims])
        self._nfree = 0
        self._unregister(victims)
        self._evictions += short
        return ids

    # ------------------------------------------------------------------- release

    def free(
        self,
        block_ids: IntsLike,
        *,
        holder: Hashable = None,
        generations: IntsLike | None = None,
    ) -> None:
        """Drop one of ``holder``'s references per occurrence in ``block_ids``, in list order.

        A block whose last reference goes becomes free, or cached if hashed (PFX-311), or is
        dropped under ``ref-zero`` (EVICT-405); earlier positions count as released earlier
        (EVICT-401). All-or-nothing (POOL-107..POOL-109, POOL-112).
        """
        op = "free"
        host, items = index_array(block_ids, op=op)
        holder = as_holder(holder, op=op)
        gens = None if generations is None else self._gen_array(generations, len(host), op)
        if len(host) == 0:
            return
        hid = self._hids.get(holder, -1)
        ids, distinct = self._check_release(host, items, hid, [(holder, hid, host, items)], gens, op)
        self._release(ids, hid, distinct)
        self._drop_held(holder, len(host))

    def _gen_array(self, generations: object, expected: int, op: str) -> np.ndarray:
        gens, _ = index_array(generations, op=op, arg="generations")
        if len(gens) != expected:
            raise InvalidValueError(
                "ERR-506", f"{op}: {len(gens)} generations for {expected} block ids; they must pair up"
            )
        return gens

    def _check_generations(self, host: np.ndarray, gens: np.ndarray, op: str) -> None:
        """POOL-112: every in-range, unreserved block's generation matches the caller's."""
        ok = (host >= 0) & (host < self._n)
        safe = np.where(ok, host, 0)
        ok &= ~self._host_reserved[safe]
        current = self.ops.to_host(self._gen[self.ops.asarray(safe)])
        stale = np.flatnonzero(ok & (current != gens))
        if len(stale):
            i = int(stale[0])
            b, g = int(host[i]), int(gens[i])
            raise StaleBlockError(
                "POOL-112",
                f"{op}: stale reference to block {b}: generation {g}, current {int(current[i])} "
                "(the block was freed and handed out again)",
            )

    def _check_release(
        self,
        host: np.ndarray,
        items: list[int] | None,
        hids: Array | int,
        groups: Sequence[tuple[Hashable, int, np.ndarray, list[int] | None]],
        gens: np.ndarray | None,
        op: str,
    ) -> tuple[Array, bool]:
        """POOL-108/109/112 over a whole batch; returns the ids on the device when all is well.

        ``groups`` lists each holder with its ids in order, for naming the first bad entry.
        """
        if gens is not None:
            self._check_generations(host, gens, op)
        known = all(hid >= 0 for _, hid, g_host, _ in groups if len(g_host))  # an empty list asks nothing
        if known and self._in_range(host):
            ids = self.ops.asarray(host)
            owner = self._owner[ids]
            distinct = self._distinct(ids)
            if distinct and not self.ops.any(owner != hids):
                return ids, True
            if not self.ops.any((owner != hids) & (owner != _SHARED)) and self._counts_cover(ids, hids):
                return ids, distinct
        for holder, _, g_host, g_items in groups:
            self._explain_release(g_items if g_items is not None else g_host.tolist(), holder, op)
        raise InvariantViolation("ERR-508", f"{op}: the batch was refused but no entry is at fault")  # pragma: no cover

    def _pair_counts(self, ids: Array, hids: Array | int) -> tuple[Array, Array, Array]:
        """Distinct (block, holder) pairs as keys, blocks and occurrence counts."""
        keys = (ids << _HID_BITS) | hids
        uk, _, cnt = self.ops.unique(keys)
        return uk, uk >> _HID_BITS, cnt

    def _counts_cover(self, ids: Array, hids: Array | int) -> bool:
        """Each (block, holder) occurs no more often than the holder's references to the block."""
        if isinstance(hids, int) and self._distinct(ids):
            return not self.ops.any(self._have((ids << _HID_BITS) | hids, ids) < 1)
        uk, ub, cnt = self._pair_counts(ids, hids)
        have = self._have(uk, ub)
        return not self.ops.any(have < cnt)

    def _have(self, uk: Array, ub: Array) -> Array:
        """References each distinct (block, holder) pair holds."""
        owner = self._owner[ub]
        sole = owner == (uk & _HID_MASK)
        have = self.ops.where(sole, self._ref[ub], 0)
        shared = self.ops.nonzero(owner == _SHARED)
        if len(shared):
            have[shared] = self._shared.find(uk[shared], 0)
        return have

    def _explain_release(self, ids: list[int], holder: Hashable, op: str, rule: str = "POOL-108") -> None:
        """Raise the oracle's error for the first entry of ``ids`` that ``holder`` cannot release."""
        for b in ids:
            if not 0 <= b < self._n or holder not in self._holders_of(b):
                self._explain_unheld(b, holder, op, rule=rule)
        for b, times in Counter(ids).items():
            have = self._holders_of(b)[holder]
            if times > have:
                raise NotHeldError(
                    "POOL-109",
                    f"{op}: block {b} occurs {times} times but holder {holder!r} holds {have} reference(s) to it",
                )

    def _explain_unheld(self, b: int, holder: Hashable, op: str, *, rule: str = "POOL-108") -> None:
        if not 0 <= b < self._n:
            raise BlockIdError("POOL-103", f"{op}: block id {b} outside [0, {self._n})")
        if self._host_reserved[b]:
            raise ReservedBlockError("POOL-118", f"{op}: block {b} is reserved and never held")
        state = self._state_of(b)
        if state is not BlockState.IN_USE:
            raise NotHeldError(rule, f"{op}: block {b} is {state.value}; holder {holder!r} holds no reference to it")
        raise NotHeldError(
            rule,
            f"{op}: holder {holder!r} holds no reference to block {b} (its holders: {self._holders_of(b)!r})",
        )

    def _release(self, ids: Array, hids: Array | int, distinct: bool) -> None:
        """Drop one reference per position (validated); blocks reaching zero leave in list order.

        ``distinct``: the ids are known to be pairwise distinct (saves a check).
        """
        ops = self.ops
        m = len(ids)
        if distinct and not ops.any(self._owner[ids] < 0):
            left = self._ref[ids] - 1
            self._ref[ids] = left
            zeroed = ids[left == 0]
            self._owner[zeroed] = _NOBODY
        elif distinct and isinstance(hids, int):
            # One holder, distinct blocks: one reference each, some of them shared.
            shared = ids[self._owner[ids] == _SHARED]
            if len(shared):
                slots = self._shared.find_slots((shared << _HID_BITS) | hids)
                left = self._shared.values[slots] - 1
                self._shared.set_at(slots, left)
                self._shared.delete_at(slots[left == 0])
            left = self._ref[ids] - 1
            self._ref[ids] = left
            zeroed = ids[left == 0]
            self._owner[zeroed] = _NOBODY
        else:
            uk, ub, cnt = self._pair_counts(ids, hids)
            shared = self._owner[ub] == _SHARED
            if ops.any(shared):
                slots = self._shared.find_slots(uk[shared])
                left = self._shared.values[slots] - cnt[shared]
                self._shared.set_at(slots, left)
                self._shared.delete_at(slots[left == 0])
            ops.scatter_add(self._ref, ub, -cnt)
            blocks = ops.unique(ub)[0]
            zb = blocks[self._ref[blocks] == 0]
            self._owner[zb] = _NOBODY
            # Zero order: the position of each block's last occurrence.
            self._mark[zb] = -1
            ops.scatter_max(self._mark, ids, ops.arange(m))
            zeroed = zb[ops.argsort(self._mark[zb])]
        self._settle(zeroed)

    def _settle(self, zeroed: Array) -> None:
        """Blocks whose last reference just went, in release order: free, cached or dropped."""
        if len(zeroed) == 0:
            return
        hashed = self._bhash[zeroed] >= 0
        if self._policy is _REF_ZERO:
            dropped = zeroed[hashed]
            if len(dropped):
                self._unregister(dropped)
                self._evictions += len(dropped)
            self._push_free(zeroed)
            return
        self._push_free(zeroed[~hashed])
        cached = zeroed[hashed]
        k = len(cached)
        if k:
            stamps = self._stamps(k)
            self._evstamp[cached] = stamps
            self._lru_order.push(cached, stamps)
            self._ncached += k

    # ------------------------------------------------------------------- acquire

    def acquire(
        self,
        block_ids: IntsLike,
        *,
        holder: Hashable = None,
        generations: IntsLike | None = None,
    ) -> None:
        """Add one reference for ``holder`` per occurrence; blocks must be in use or cached (POOL-110).

        A cached block so acquired is pinned: it leaves the eviction order (PFX-310).
        """
        op = "acquire"
        host, items = index_array(block_ids, op=op)
        holder = as_holder(holder, op=op)
        self._refuse_if_paused(holder, len(host), op)
        gens = None if generations is None else self._gen_array(generations, len(host), op)
        if gens is not None:
            self._check_generations(host, gens, op)
        if len(host) == 0:
            return
        if self._in_range(host):
            ids = self.ops.asarray(host)
            bad = self._is_reserved[ids] | ((self._ref[ids] == 0) & (self._bhash[ids] < 0))
            if not self.ops.any(bad):
                self._pin(ids, self._hid(holder))
                self._add_held(holder, len(host))
                return
        self._explain_acquire(items if items is not None else host.tolist(), op)

    def _explain_acquire(self, ids: list[int], op: str) -> None:
        for b in ids:
            if not 0 <= b < self._n:
                raise BlockIdError("POOL-103", f"{op}: block id {b} outside [0, {self._n})")
            if self._host_reserved[b]:
                raise ReservedBlockError("POOL-118", f"{op}: block {b} is reserved and never held")
            if self._state_of(b) is BlockState.FREE:
                raise BlockStateError(
                    "POOL-119", f"{op}: block {b} is free; only blocks in use or cached can be acquired"
                )

    def _pin(self, ids: Array, hids: Array | int) -> None:
        """Add one reference per position (validated: every block in use or cached).

        A block gaining a second holder becomes shared: its per-holder counts move to ``shared``.
        """
        ops = self.ops
        if len(ids) == 0:
            return
        owner = self._owner[ids]
        distinct = self._distinct(ids)
        if distinct and not ops.any((owner != hids) & (owner != _NOBODY)):
            cached = ids[owner == _NOBODY]
            if len(cached):
                self._evstamp[cached] = -1
                self._ncached -= len(cached)
            self._owner[ids] = hids
            self._ref[ids] += 1
            return
        cnt: Array | int
        if distinct and isinstance(hids, int):
            # One holder, distinct blocks: every pair occurs once, no sort needed.
            ub, current, cnt = ids, owner, 1
            uh: Array | int = hids
            uk = (ids << _HID_BITS) | hids
            stays_sole = (current == _NOBODY) | (current == hids)
            cached = ids[current == _NOBODY]
        else:
            if isinstance(hids, int):
                hids = ops.full(len(ids), hids)
            uk, ub, cnt = self._pair_counts(ids, hids)
            uh = uk & _HID_MASK
            blocks, inverse, holders_per_block = ops.unique(ub)
            current = self._owner[ub]
            stays_sole = (holders_per_block[inverse] == 1) & ((current == _NOBODY) | (current == uh))
            cached = blocks[self._ref[blocks] == 0]
        if len(cached):
            self._evstamp[cached] = -1
            self._ncached -= len(cached)
        to_shared = ~stays_sole
        convert = ub[to_shared & (current >= 0)]
        if len(convert) and not distinct:
            convert = ops.unique(convert)[0]
        if len(convert):
            self._shared.insert((convert << _HID_BITS) | self._owner[convert], self._ref[convert])
        self._owner[ub[to_shared]] = _SHARED
        sk = uk[to_shared]
        sc = cnt if isinstance(cnt, int) else cnt[to_shared]
        slots = self._shared.find_slots(sk)
        present = slots >= 0
        if ops.any(present):
            ps = slots[present]
            self._shared.set_at(ps, self._shared.values[ps] + (sc if isinstance(sc, int) else sc[present]))
        absent = ~present
        if ops.any(absent):
            add = sk[absent]
            self._shared.insert(add, ops.full(len(add), sc) if isinstance(sc, int) else sc[absent])
        self._owner[ub[stays_sole]] = uh if isinstance(uh, int) else uh[stays_sole]
        if isinstance(cnt, int):
            self._ref[ids] += 1
        else:
            ops.scatter_add(self._ref, ub, cnt)

    # --------------------------------------------------------------- batching

    def allocate_many(self, counts: IntsLike, *, holders: Sequence[Hashable]) -> list[list[int]]:
        """Admit the longest prefix of the batch that fits, in order, in one pass (POOL-116).

        Entry ``i`` asks ``counts[i]`` blocks for ``holders[i]``; admission stops at the first
        entry that does not fit. The admitted entries take their blocks from one pop of the free
        stack (and one eviction for the shortfall), in entry order, exactly as single calls would.
        """
        op = "allocate_many"
        host, items = index_array(counts, op=op, arg="counts")
        originals = items if items is not None else host.tolist()  # huge counts are -1 in ``host``
        cs = [as_count(c, op=op, arg=f"counts[{i}]") for i, c in enumerate(originals)]
        hs = as_holder_list(holders, len(cs), op=op)
        for c, h in zip(cs, hs, strict=True):
            self._refuse_if_paused(h, c, op)
        if not cs:
            return []
        total = sum(cs)
        admitted = len(cs)
        if total > self._nfree:
            room = self._nfree + self._reclaimable()
            ends = list(accumulate(cs))
            admitted = next((i for i, end in enumerate(ends) if end > room), len(cs))
            total = ends[admitted - 1] if admitted else 0
        if total == 0:
            return [[] for _ in range(admitted)]
        ids = self._take(total, op)
        hids = self.ops.concat(
            [self.ops.full(c, self._hid(h)) for c, h in zip(cs[:admitted], hs[:admitted], strict=True) if c]
        )
        self._hand_out(ids, hids)
        flat = self.ops.tolist(ids)
        out: list[list[int]] = []
        start = 0
        for c, h in zip(cs[:admitted], hs[:admitted], strict=True):
            out.append(flat[start : start + c])
            start += c
            self._add_held(h, c)
        return out

    def free_many(self, block_lists: Sequence[IntsLike], *, holders: Sequence[Hashable]) -> None:
        """``free(block_lists[i], holder=holders[i])`` for each ``i`` in order, atomically (POOL-117).

        The whole batch is checked first, duplicates across entries of one holder included, so a
        bad entry anywhere leaves every reference in place.
        """
        op = "free_many"
        entries = as_list(block_lists, op=op, arg="block_lists")
        arrays = [index_array(ids, op=op, arg=f"block_lists[{i}]") for i, ids in enumerate(entries)]
        hs = as_holder_list(holders, len(arrays), op=op)
        if not arrays:
            return
        host = np.concatenate([a for a, _ in arrays]) if len(arrays) > 1 else arrays[0][0]
        if len(host) == 0:
            return
        hid_of = [self._hids.get(h, -1) for h in hs]
        hids = self.ops.asarray(np.repeat(np.array(hid_of, dtype=np.int64), [len(a) for a, _ in arrays]))
        by_holder: dict[Hashable, tuple[list[np.ndarray], list[int]]] = {}
        for (a, items), h in zip(arrays, hs, strict=True):
            parts, originals = by_holder.setdefault(h, ([], []))
            parts.append(a)  # values beyond int64 are already -1 here; the originals keep them
            originals.extend(items if items is not None else a.tolist())
        groups = [
            (h, self._hids.get(h, -1), np.concatenate(parts), originals) for h, (parts, originals) in by_holder.items()
        ]
        ids, distinct = self._check_release(host, None, hids, groups, None, op)
        self._release(ids, hids, distinct)
        for (a, _), h in zip(arrays, hs, strict=True):
            self._drop_held(h, len(a))

    def match_many(self, hash_lists: Sequence[IntsLike], *, holders: Sequence[Hashable]) -> list[list[int]]:
        """``match(hash_lists[i], holder=holders[i])`` for each ``i`` in order (PFX-320).

        Lookups change nothing, so all run on the state before the batch; the hits are then
        pinned in one pass.
        """
        op = "match_many"
        entries = as_list(hash_lists, op=op, arg="hash_lists")
        lists = [hash_array(hl, op=op, arg=f"hash_lists[{i}]") for i, hl in enumerate(entries)]
        hs = as_holder_list(holders, len(lists), op=op)
        for h, hl in zip(hs, lists, strict=True):
            self._refuse_if_paused(h, len(hl), op)
        hits = [self._lookup(hl, -1) for hl in lists]
        sizes = [len(x) for x in hits]
        if sum(sizes):
            ids = self.ops.concat(hits)
            hids = self.ops.concat([self.ops.full(k, self._hid(h)) for k, h in zip(sizes, hs, strict=True) if k])
            self._pin(ids, hids)
            for k, h in zip(sizes, hs, strict=True):
                self._add_held(h, k)
        self._requests += len(lists)
        self._queries += sum(len(hl) for hl in lists)
        self._hits += sum(sizes)
        return [self.ops.tolist(x) for x in hits]

    # ----------------------------------------------------------- prefix cache

    def _entries_of(self, hashes: Array) -> Array:
        return self._index.find(hashes)

    def _resident(self, entries: Array) -> Array:
        found = entries >= 0
        return found & (self._ecopies[self.ops.where(found, entries, 0)] > 0)

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
        ops = self.ops
        parent_entry = -1
        if parent >= 0:
            pe = self._entries_of(ops.asarray(np.array([parent], dtype=np.int64)))
            if not self.ops.any(self._resident(pe)):
                raise UnknownHashError(
                    "PFX-304", f"{op}: parent hash {parent:#x} is not resident; register the prefix first"
                )
            parent_entry = int(pe[0])
        if m == 0:
            return
        if m > 1 and (len(set(items)) if items is not None else len(np.unique(host))) != m:
            shown = items if items is not None else host.tolist()
            raise HashConflictError("PFX-303", f"{op}: a block occurs twice in {shown}; a block has one hash")
        prev_host = np.concatenate([np.array([parent], dtype=np.int64), hs[:-1]])
        entries = self._entries_of(ops.asarray(hs))
        resident = self._resident(entries)
        repeated = m > 1 and len(np.unique(hs)) != m
        suspicious = repeated or not self._in_range(host) or bool((hs == prev_host).any())
        if not suspicious:
            ids = ops.asarray(host)
            prev = ops.asarray(prev_host)
            safe = ops.where(entries >= 0, entries, 0)
            bad = (
                self._is_reserved[ids]
                | (self._ref[ids] == 0)
                | (self._bhash[ids] >= 0)
                | (resident & (self._eparent[safe] != prev))
                | (~resident & (entries >= 0) & (self._echildren[safe] > 0))  # cycle risk: checked below
            )
            suspicious = ops.any(bad)
        if suspicious:
            self._explain_register(items if items is not None else host.tolist(), hs.tolist(), parent, op)
        self._apply_register(ops.asarray(host), hs, prev_host, entries, resident, parent_entry)

    def _explain_register(self, ids: list[int], hs: list[int], parent: int, op: str) -> None:
        """The oracle's per-position checks, in its order; raises for the first failure (PFX-302..306)."""
        prev: int | None = None if parent < 0 else parent
        pending: dict[int, int | None] = {}
        for b, h in zip(ids, hs, strict=True):
            if not 0 <= b < self._n or self._host_reserved[b]:
                self._explain_unheld(b, None, op, rule="PFX-302")
            if int(self._ref[b]) == 0:
                raise BlockStateError(
                    "PFX-302", f"{op}: block {b} is {self._state_of(b).value}; only blocks in use can be registered"
                )
            if int(self._bhash[b]) >= 0:
                raise HashConflictError(
                    "PFX-303", f"{op}: block {b} is already registered under {int(self._bhash[b]):#x}"
                )
            if h == prev:
                raise HashConflictError("PFX-306", f"{op}: hash {h:#x} cannot be its own parent")
            info = self._entry_info(h)
            if info is not None and info[0]:
                known_parent: int | None = info[1]
                known = True
            else:
                known = h in pending
                known_parent = pending.get(h)
            if known and known_parent != prev:
                raise HashConflictError(
                    "PFX-306",
                    f"{op}: hash {h:#x} is resident with parent {known_parent!r}, registration gives parent {prev!r}",
                )
            if not known and info is not None and info[2] and self._is_ancestor(h, prev, pending):
                raise HashConflictError(
                    "PFX-306", f"{op}: registering {h:#x} under {prev!r} would make it its own ancestor"
                )
            pending.setdefault(h, prev)
            prev = h

    def _entry_info(self, h: int) -> tuple[bool, int | None, bool] | None:
        """(resident, parent hash, has resident children) of hash ``h``, or None without an entry."""
        e = int(self._entries_of(self.ops.asarray(np.array([h], dtype=np.int64)))[0])
        if e < 0:
            return None
        p = int(self._eparent[e])
        return int(self._ecopies[e]) > 0, (None if p < 0 else p), int(self._echildren[e]) > 0

    def _is_ancestor(self, h: int, start: int | None, pending: dict[int, int | None]) -> bool:
        """Whether ``h`` lies on the parent chain from ``start`` up (a would-be cycle, PFX-306)."""
        seen: set[int] = set()
        node = start
        while node is not None and node not in seen:
            if node == h:
                return True
            seen.add(node)
            info = self._entry_info(node)
            node = info[1] if info is not None and info[0] else pending.get(node)
        return False

    def _apply_register(
        self, ids: Array, hs: np.ndarray, prev_host: np.ndarray, entries: Array, resident: Array, parent_entry: int
    ) -> None:
        ops = self.ops
        m = len(hs)
        hs_dev = ops.asarray(hs)
        absent = ops.nonzero(entries < 0)
        k = len(absent)
        if k:
            new = ops.copy(self._estack[self._nefree - k : self._nefree])
            self._nefree -= k
            self._index.insert(hs_dev[absent], new)
            self._ehash[new] = hs_dev[absent]
            self._echildren[new] = 0
            entries = ops.copy(entries)
            entries[absent] = new
        # Parent entry of each position: the given parent's for the first, the previous hash's after.
        pe = ops.concat([ops.full(1, parent_entry), entries[:-1]])
        base = int(self._edepth[parent_entry]) + 1 if parent_entry >= 0 else 0
        fresh = ~resident
        fe = entries[fresh]
        self._ecopies[fe] = 1
        self._ehead[fe] = ids[fresh]
        self._eparent[fe] = ops.asarray(prev_host)[fresh]
        fpe = pe[fresh]
        self._epentry[fe] = fpe
        self._edepth[fe] = ops.arange(base, base + m)[fresh]
        ops.scatter_add(self._echildren, fpe[fpe >= 0], 1)
        self._ecopies[entries[resident]] += 1
        self._bhash[ids] = hs_dev
        self._bentry[ids] = entries
        stamps = self._stamps(m)
        self._regstamp[ids] = stamps
        if self._policy is _FIFO:
            self._fifo_order.push(ids, stamps)
        if self._events_on:
            new_pos = ops.to_host(ops.nonzero(fresh))
            for i in new_pos.tolist():
                p = int(prev_host[i])
                self._events.append(BlockStored(int(hs[i]), None if p < 0 else p))

    def _unregister(self, victims: Array) -> None:
        """Remove the hash registration of ``victims`` (in order); a hash leaves with its last copy."""
        ops = self.ops
        m = len(victims)
        e = self._bentry[victims]
        cached = self._evstamp[victims] >= 0
        self._ncached -= ops.count(cached)
        self._evstamp[victims] = -1
        self._bhash[victims] = -1
        self._bentry[victims] = -1
        self._regstamp[victims] = -1
        if m == 1:
            ue, inverse, cnt = e, ops.zeros(1), ops.full(1, 1)
        else:
            ue, inverse, cnt = ops.unique(e)
        self._ecopies[ue] -= cnt
        left = self._ecopies[ue]
        lost_head = ue[(left > 0) & (self._bentry[self._ehead[ue]] != ue)]
        if len(lost_head):
            self._renew_heads(lost_head)
        gone_mask = left == 0
        gone = ue[gone_mask]
        if len(gone) == 0:
            self._trim_orders()
            return
        if self._events_on:
            last = ops.full(len(ue), -1)
            ops.scatter_max(last, inverse, ops.arange(m))
            order = ops.argsort(last[gone_mask])
            for h in ops.tolist(self._ehash[gone[order]]):
                self._events.append(BlockRemoved(h))
        gpe = self._epentry[gone]
        gpe = gpe[gpe >= 0]
        ops.scatter_add(self._echildren, gpe, -1)
        candidates = ops.unique(ops.concat([gone, gpe]))[0] if len(gone) + len(gpe) > 1 else gone
        dead = candidates[(self._ecopies[candidates] == 0) & (self._echildren[candidates] == 0)]
        if len(dead):
            self._index.delete(self._ehash[dead])
            self._ehash[dead] = -1
            self._ehead[dead] = -1
            self._estack[self._nefree : self._nefree + len(dead)] = dead
            self._nefree += len(dead)
        self._trim_orders()

    def _renew_heads(self, entries: Array) -> None:
        """Oldest remaining copy of each entry, by registration stamp (rare: hashes with several copies)."""
        ops = self.ops
        copies = ops.nonzero(ops.isin(self._bentry, entries))
        ce = self._bentry[copies]
        cs = self._regstamp[copies]
        oldest = ops.full(self._n_entries, 1 << 62)
        ops.scatter_min(oldest, ce, cs)
        first = cs == oldest[ce]
        self._ehead[ce[first]] = copies[first]

    def _trim_orders(self) -> None:
        self._lru_order.trim()
        if self._policy is _FIFO:
            self._fifo_order.trim()

    def _lookup(self, hs: np.ndarray, parent: int) -> Array:
        """Blocks of the longest resident prefix of a chain (oldest copy of each hash); pure."""
        ops = self.ops
        m = len(hs)
        if m == 0:
            return ops.zeros(0)
        entries = self._entries_of(ops.asarray(hs))
        safe = ops.where(entries >= 0, entries, 0)
        prev = ops.asarray(np.concatenate([np.array([parent], dtype=np.int64), hs[:-1]]))
        ok = (entries >= 0) & (self._ecopies[safe] > 0) & (self._eparent[safe] == prev)
        misses = ops.nonzero(~ok)
        length = int(misses[0]) if len(misses) else m
        return self._ehead[safe[:length]]

    def lookup(self, block_hashes: IntsLike, *, parent_hash: SupportsIndex | None = None) -> list[int]:
        """Blocks of the longest resident prefix of the chain; changes nothing (PFX-307, PFX-308, PFX-321).

        Among several copies of a hash the oldest registered is returned.
        """
        hs = hash_array(block_hashes, op="lookup")
        parent = -1 if parent_hash is None else as_hash(parent_hash, op="lookup", arg="parent_hash")
        return self.ops.tolist(self._lookup(hs, parent))

    def match(
        self, block_hashes: IntsLike, *, holder: Hashable = None, parent_hash: SupportsIndex | None = None
    ) -> list[int]:
        """``lookup``, acquire the hit for ``holder`` and count it in the stats (PFX-309, PFX-318)."""
        return self.ops.tolist(self.match_ids(block_hashes, holder=holder, parent_hash=parent_hash))

    def match_ids(
        self, block_hashes: IntsLike, *, holder: Hashable = None, parent_hash: SupportsIndex | None = None
    ) -> Array:
        """``match``, returning the hit as a device array (int64) instead of a list."""
        hs = hash_array(block_hashes, op="match")
        holder = as_holder(holder, op="match")
        parent = -1 if parent_hash is None else as_hash(parent_hash, op="match", arg="parent_hash")
        self._refuse_if_paused(holder, len(hs), "match")
        hit = self._lookup(hs, parent)
        k = len(hit)
        if k:
            self._pin(hit, self._hid(holder))
            self._add_held(holder, k)
        self._requests += 1
        self._queries += len(hs)
        self._hits += k
        return hit

    def match_request(
        self,
        block_hashes: IntsLike,
        *,
        num_tokens: SupportsIndex,
        block_size: SupportsIndex,
        holder: Hashable = None,
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

    def resident_hashes(self) -> frozenset[int]:
        """Hashes with at least one cached copy, in use or evictable (PFX-305)."""
        keys, entries = self._index.items()
        return frozenset(self.ops.tolist(keys[self._ecopies[entries] > 0]))

    def reset(self) -> None:
        """Drop every cached block; refused with CacheInUseError while a block is in use (PFX-313)."""
        in_use = self.num_in_use
        if in_use:
            raise CacheInUseError("PFX-313", f"reset: {in_use} block(s) in use; release every reference first")
        cached = self._lru_order.oldest(self._ncached) if self._ncached else self.ops.zeros(0)
        hashed = self.ops.nonzero(self._bhash >= 0)
        for array in (self._bhash, self._bentry, self._regstamp, self._evstamp):
            array[hashed] = -1
        self._push_free(cached)
        self._ncached = 0
        self._lru_order.clear()
        self._fifo_order.clear()
        self._index.clear()
        for array in (self._ehash, self._eparent, self._epentry, self._ehead):
            array[:] = -1
        self._ecopies[:] = 0
        self._echildren[:] = 0
        self._estack[:] = self.ops.arange(self._n_entries)
        self._nefree = self._n_entries
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

    def _leaf_window(self, m: int | None) -> tuple[Array, int, bool]:
        """Blocks of the ``m`` oldest cached blocks in lru-leaf order, how many are evictable, and
        whether the window was every cached block."""
        blocks, stamps, exhausted = self._lru_order.live_prefix(m)
        order, finite = leaf_order(
            self.ops,
            blocks,
            stamps,
            entry_of=self._bentry,
            copies=self._ecopies,
            children=self._echildren,
            parent_entry=self._epentry,
            depth=self._edepth,
            scratch=self._escratch,
            scratch2=self._escratch2,
        )
        return blocks[order[:finite]], finite, exhausted

    def _reclaimable(self) -> int:
        """How many cached blocks eviction could free now, under the policy (POOL-106)."""
        if self._policy is not _LRU_LEAF or self._ncached == 0:
            return self._ncached
        return self._leaf_window(None)[1]

    def _select_victims(self, k: int) -> tuple[Array, int]:
        """The first ``k`` blocks the policy evicts (fewer if fewer can go), and the reclaimable count."""
        if self._policy is _LRU_LEAF:
            window = max(2 * k, 64)
            while True:
                victims, finite, exhausted = self._leaf_window(window)
                if finite >= k:
                    return victims[:k], finite
                if exhausted:
                    return victims, finite
                window *= 4
        if k > self._ncached:
            return self.ops.zeros(0), self._ncached
        if self._policy is _FIFO:
            ref = self._ref
            return self._fifo_order.oldest(k, lambda qb: ref[qb] == 0), self._ncached
        return self._lru_order.oldest(k), self._ncached

    # -------------------------------------------------------------- inspection

    def eviction_order(self) -> list[int]:
        """Cached blocks in release order (lru order), oldest first."""
        return self.ops.tolist(self._lru_order.oldest(self._ncached)) if self._ncached else []

    def snapshot(self) -> dict[str, Any]:
        """A deep, comparable copy of the whole observable state, eviction orders included (ERR-501)."""
        ops = self.ops
        keys, values = self._shared.items()
        order = ops.argsort(keys)
        index_keys, index_entries = self._index.items()
        iorder = ops.argsort(index_keys)
        index_keys, index_entries = index_keys[iorder], index_entries[iorder]
        fifo = self._fifo_order.oldest(self._n) if self._policy is _FIFO else ops.zeros(0)
        return {
            "free": ops.tolist(self._stack[: self._nfree]),
            "ref": ops.tolist(self._ref),
            "gen": ops.tolist(self._gen),
            "owner": ops.tolist(self._owner),
            "shared": list(zip(ops.tolist(keys[order]), ops.tolist(values[order]), strict=True)),
            "hash": ops.tolist(self._bhash),
            "held": dict(self._held),
            "paused": set(self._paused),
            "entries": {
                "hash": ops.tolist(index_keys),
                "copies": ops.tolist(self._ecopies[index_entries]),
                "parent": ops.tolist(self._eparent[index_entries]),
                "children": ops.tolist(self._echildren[index_entries]),
                "head": ops.tolist(self._ehead[index_entries]),
            },
            "evictable": self.eviction_order(),
            "registered": ops.tolist(fifo),
            "events": list(self._events),
            "stats": self.stats,
            "counts": (self._nfree, self._ncached),
        }

    def check_invariants(self) -> None:
        """Verify every invariant of the spec over the arrays; raise InvariantViolation naming the rule."""
        from kvref_arraypool.invariants import check_array_invariants

        check_array_invariants(self)

    def __repr__(self) -> str:
        return (
            f"ArrayBlockPool(name={self.name!r}, device={self.device!r}, num_blocks={self._n}, "
            f"policy={self._policy.value!r}, free={self.num_free}, in_use={self.num_in_use}, cached={self.num_cached})"
        )
