"""The array core's state, declared once, and what reads it plainly (chapters 00-05, 09).

:class:`ArrayPoolState` allocates every array the mixins of :mod:`kvref_arraypool` share, maps
holders to small integer ids on the host, answers the per-block queries and declares the
internal methods the mixins call on one another (:class:`~kvref_arraypool.mixin_calls.MixinCalls`:
each raises NotImplementedError there and is defined by exactly one mixin).

State (``n`` blocks, ``E = 2n + 2`` hash entries):

* per block: ``ref`` (references), ``gen`` (POOL-111), ``owner`` (:data:`NOBODY`; ``h >= 0``: holder id ``h``
  holds every reference; :data:`SHARED`: per-holder counts in ``shared``, :mod:`.holder_counts`), ``bhash`` and
  ``bentry`` (the hash and its entry, or -1), ``regstamp`` (registration stamp: copy age and fifo order), ``evstamp``
  (release stamp while cached, else -1: lru order), ``access`` (last access, read by lru-leaf-access only: EVICT-411);
* the free stack ``stack[:nfree]`` (top at the end) with ``nfree`` kept on the host, so the
  free count is read without a device sync;
* hash entries: ``index`` (hash -> entry id, open addressing), and per entry its hash, parent
  hash, parent entry, depth, number of copies, number of resident child hashes and oldest copy
  (``head``). An entry lives while its hash is resident or has resident children (STATE-007);
* the orders: ``lru_order`` (release order of cached blocks) and ``fifo_order`` (registration order), append-only
  arrays with lazy deletion (:mod:`kvref_arraypool.queue`). Holders have small integer ids, mapped on the host.

CUDA graphs (CONF-908): ``ref``, ``gen``, ``bhash``, ``stack`` and the prefix ``index`` arrays are allocated once and
never reallocated, so kernels captured in a CUDA graph may read them at fixed addresses between calls.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import SupportsIndex

import numpy as np

from kvref.contract.checks import HashEntry
from kvref.contract.errors import BlockIdError, InvalidTypeError, OutOfBlocksError
from kvref.contract.events import KVEvent, PrefixCacheStats
from kvref.contract.pausing import PausedHolders
from kvref.contract.policies import EvictionPolicy, as_policy
from kvref.contract.protocol import BlockState
from kvref.contract.shape import PoolShape
from kvref.contract.validate import IntsLike, as_count, as_holder, as_int, as_pool_shape
from kvref_arraypool.holder_counts import HID_BITS, HID_MASK, HolderCounts
from kvref_arraypool.host_flags import all_true, any_true, positions
from kvref_arraypool.mixin_calls import MixinCalls
from kvref_arraypool.ops import Array, ArrayOps
from kvref_arraypool.queue import StampQueue
from kvref_arraypool.table import HashTable

__all__ = ["HID_BITS", "HID_MASK", "NOBODY", "SHARED", "ArrayPoolState"]

#: ``owner[b]`` of a block no holder holds.
NOBODY = -1
#: ``owner[b]`` of a block several holders hold: their counts are in the ``shared`` table.
SHARED = -2


class ArrayPoolState(PoolShape, PausedHolders, MixinCalls):
    """The array core's arrays and host counters, sizes, holder ids and per-block queries.

    ``ops`` chooses the array library and device. Other arguments are the oracle's: ``num_blocks`` blocks of which
    ``reserved_ids`` are never handed out (POOL-102), eviction ``policy`` (chapter 04), ``paused_limit`` (POOL-113)
    and ``enable_events`` (PFX-315).
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
        self._stack = ops.zeros(n)
        self._nfree = 0
        self._refill_stack()

        self._ref = ops.zeros(n)
        self._gen = ops.zeros(n)
        self._owner = ops.full(n, NOBODY)
        self._bhash = ops.full(n, -1)
        self._bentry = ops.full(n, -1)
        self._regstamp = ops.full(n, -1)
        self._evstamp = ops.full(n, -1)
        self._access = ops.full(n, -1)
        self._access_clock = 0
        self._mark = ops.full(n, -1)
        self._positions = ops.arange(n)

        self._n_entries = n_entries = 2 * n + 2
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
        self._shared = HolderCounts(ops, n)

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

    # ----------------------------------------------------------- holders

    def _hid(self, holder: Hashable) -> int:
        hid = self._hids.get(holder)
        if hid is None:
            hid = self._hids[holder] = self._hid_to_be(holder)
            if self._spare_hids:
                self._holder_of[self._spare_hids.pop()] = holder
            else:
                self._holder_of.append(holder)
        return hid

    def _hid_to_be(self, holder: Hashable) -> int:
        """The id ``holder`` has, or the one :meth:`_hid` would give it next, without giving it."""
        hid = self._hids.get(holder)
        if hid is None:
            hid = self._spare_hids[-1] if self._spare_hids else len(self._holder_of)
            if hid > HID_MASK >> 1:  # pragma: no cover - 2**31 holders at once
                raise OutOfBlocksError("POOL-105", f"{self.name}: more than 2**31 holders hold references")
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
        if owner == NOBODY:
            return {}
        if owner >= 0:
            return {self._holder_of[owner]: int(self._ref[b])}
        return {self._holder_of[h]: c for h, c in self._shared.holders_of(b)}

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

    def hash_entry(self, block_hash: int) -> HashEntry | None:
        """What the prefix index knows of ``block_hash``: resident, its parent, whether it has
        resident children; None without an entry (the explainers' view, :mod:`kvref.contract.checks`)."""
        e = int(self._index.find(self.ops.asarray(np.array([block_hash], dtype=np.int64)))[0])
        if e < 0:
            return None
        p = int(self._eparent[e])
        return HashEntry(int(self._ecopies[e]) > 0, None if p < 0 else p, int(self._echildren[e]) > 0)

    @property
    def stats(self) -> PrefixCacheStats:
        """Cumulative hit statistics (PFX-318, PFX-319)."""
        return PrefixCacheStats(self._requests, self._queries, self._hits, self._evictions, self._resets)

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

    def _part(self, blocks: Array, which: np.ndarray) -> Array:
        """The entries of ``blocks`` where the host flags ``which`` are set, in order (no device read)."""
        if all_true(which):
            return blocks
        if not any_true(which):
            return self.ops.zeros(0)
        return blocks[self.ops.asarray(positions(which))]

    def _in_range(self, host_ids: np.ndarray) -> bool:
        return len(host_ids) == 0 or int(host_ids.astype(np.int64, copy=False).view(np.uint64).max()) < self._n

    def _refill_stack(self) -> None:
        """Every usable block free, in a new pool's order: the lowest ids on top (POOL-115)."""
        free = np.arange(self._n - 1, -1, -1, dtype=np.int64)
        free = free[~self._host_reserved[::-1]]
        self._stack[: len(free)] = self.ops.asarray(free)
        self._nfree = len(free)

    def _push_free(self, blocks: Array) -> None:
        m = len(blocks)
        if m:
            self._stack[self._nfree : self._nfree + m] = blocks
            self._nfree += m

    def _stamps(self, m: int) -> Array:
        start = self._clock
        self._clock += m
        return self.ops.arange(start, start + m)

    def _stamp_access(self, ids: Array, sizes: Sequence[int] | None = None) -> None:
        """Mark the blocks one call handed out or pinned as accessed now (EVICT-411): ascending id
        within a call; ``sizes`` splits a batched call into its single calls, in turn. A block named
        twice keeps its latest mark (a scatter-max, as marks only grow)."""
        m = len(ids)
        if not self._policy.by_access or m == 0:
            return
        ops = self.ops
        key = ids
        if sizes is not None and len(sizes) > 1:
            calls = np.repeat(np.arange(len(sizes), dtype=np.int64), np.asarray(sizes, dtype=np.int64))
            key = ops.asarray(calls) * self._n + ids
        start = self._access_clock
        ops.scatter_max(self._access, ids[ops.argsort(key)], ops.arange(start, start + m))
        self._access_clock = start + m

    def _entries_of(self, hashes: Array) -> Array:
        return self._index.find(hashes)

    def _resident(self, entries: Array) -> Array:
        found = entries >= 0
        return found & (self._ecopies[self.ops.where(found, entries, 0)] > 0)

    def _chained(self, entries: Array, prev: Array) -> tuple[Array, Array]:
        """The hashes' ``entries`` made safe to index (0 where absent), and whether each is resident
        under the hash before it (``prev``; -1 at a chain's root): the positions a lookup may hit."""
        safe = self.ops.where(entries >= 0, entries, 0)
        return safe, (entries >= 0) & (self._ecopies[safe] > 0) & (self._eparent[safe] == prev)
