"""The array core's registrations: register and unregister hashes in the entry tables (PFX-301..PFX-306, PFX-317).

``register`` detects bad input with array operations over the whole call, and
:func:`kvref.contract.checks.explain_register` names the first offending position in the shared
order of checks (ERR-509). Unregistering keeps each entry's copies, oldest copy and resident
children, and frees an entry when its hash has neither copies nor children (STATE-007).
"""

from __future__ import annotations

from typing import SupportsIndex

import numpy as np

from kvref.contract.checks import explain_register
from kvref.contract.errors import HashConflictError, InvalidValueError, UnknownHashError
from kvref.contract.events import BlockRemoved, BlockStored
from kvref.contract.policies import EvictionPolicy
from kvref.contract.validate import IntsLike, as_hash
from kvref_arraypool.host_flags import any_true, count_true, positions
from kvref_arraypool.host_sets import count_distinct, sorted_counts, sorted_distinct
from kvref_arraypool.inputs import hash_array, index_array
from kvref_arraypool.ops import Array
from kvref_arraypool.state import ArrayPoolState

__all__ = ["Registration"]

_FIFO = EvictionPolicy.FIFO


class Registration(ArrayPoolState):
    """``register`` and the unregistering that eviction, ``ref-zero`` and ``reset`` share."""

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
        parent_entry, parent_depth = self._parent_entry(parent, op) if parent >= 0 else (-1, -1)
        if m == 0:
            return
        if m > 1 and (len(set(items)) if items is not None else count_distinct(host)) != m:
            shown = items if items is not None else host.tolist()
            raise HashConflictError("PFX-303", f"{op}: a block occurs twice in {shown}; a block has one hash")
        prev_host = np.concatenate([np.array([parent], dtype=np.int64), hs[:-1]])
        hashes = ops.asarray(hs)
        repeated = m > 1 and count_distinct(hs) != m
        suspicious = repeated or not self._in_range(host) or any_true(hs == prev_host)
        read = None
        if not suspicious:  # one host read: hashes far from home, the verdict, which are new, which resident
            entries, far = self._index.find_near(hashes)
            resident = self._resident(entries)
            bad = self._register_refusals(host, prev_host, entries, resident)
            flags = ops.to_host(ops.concat([far, bad, entries < 0, resident]))
            if not any_true(flags[:m]):
                suspicious, read = any_true(flags[m : 2 * m]), flags[2 * m :]
        if read is None:  # the exact probe: a hash sat far from home, or the call needs a close look
            entries = self._entries_of(hashes)
            resident = self._resident(entries)
            if not suspicious:
                suspicious = ops.any(self._register_refusals(host, prev_host, entries, resident))
        if suspicious:
            explain_register(
                self, items if items is not None else host.tolist(), hs.tolist(), None if parent < 0 else parent, op
            )
        self._apply_register(ops.asarray(host), hs, prev_host, entries, resident, parent_entry, parent_depth, read)

    def _parent_entry(self, parent: int, op: str) -> tuple[int, int]:
        """The entry of resident hash ``parent`` and its depth, in one host read (PFX-304 if not resident)."""
        ops = self.ops
        key = ops.asarray(np.array([parent], dtype=np.int64))
        entry, far = self._index.find_near(key)  # probed near home, with no read of its own
        while True:
            parts = [entry, ops.cast(self._resident(entry), "int64"), self._edepth[ops.where(entry >= 0, entry, 0)]]
            read = ops.to_host(ops.concat(parts if far is None else [*parts, ops.cast(far, "int64")]))
            if far is None or not read[3]:
                break
            entry, far = self._entries_of(key), None  # far from home: the exact probe
        if not read[1]:
            raise UnknownHashError(
                "PFX-304", f"{op}: parent hash {parent:#x} is not resident; register the prefix first"
            )
        return int(read[0]), int(read[2])

    def _register_refusals(self, host: np.ndarray, prev_host: np.ndarray, entries: Array, resident: Array) -> Array:
        """Per position, whether ``register`` must look closer: the block reserved, free or hashed
        already, its hash resident under another parent, or a cycle risk (checked by the explanation)."""
        ops = self.ops
        ids = ops.asarray(host)
        safe = ops.where(entries >= 0, entries, 0)
        return (
            self._is_reserved[ids]
            | (self._ref[ids] == 0)
            | (self._bhash[ids] >= 0)
            | (resident & (self._eparent[safe] != ops.asarray(prev_host)))
            | (~resident & (entries >= 0) & (self._echildren[safe] > 0))
        )

    def _apply_register(
        self,
        ids: Array,
        hs: np.ndarray,
        prev_host: np.ndarray,
        entries: Array,
        resident: Array,
        parent_entry: int,
        parent_depth: int,
        read: np.ndarray | None = None,
    ) -> None:
        """Register checked blocks under ``parent_entry`` (of depth ``parent_depth``; -1: the root);
        ``read``: which hashes have no entry and which are resident (host flags, ``2 * len(hs)``),
        where the check read them."""
        ops = self.ops
        m = len(hs)
        hs_dev = ops.asarray(hs)
        # Which hashes have no entry yet and which are resident: one host read; the rest indexes by host positions.
        flags = ops.to_host(ops.concat([entries < 0, resident])) if read is None else read
        absent_at, resident_here = positions(flags[:m]), flags[m:]
        k = len(absent_at)
        if k:
            absent = ops.asarray(absent_at)
            new = ops.copy(self._estack[self._nefree - k : self._nefree])
            self._nefree -= k
            self._index.insert(hs_dev[absent], new)
            self._ehash[new] = hs_dev[absent]
            ops.fill_at(self._echildren, new, 0)
            entries = ops.copy(entries)
            entries[absent] = new
        # Parent entry of each position: the given parent's for the first, the previous hash's after.
        pe = ops.concat([ops.full(1, parent_entry), entries[:-1]])
        base = parent_depth + 1 if parent_entry >= 0 else 0
        fresh_at = positions(~resident_here)
        fresh = ops.asarray(fresh_at)
        fe = entries[fresh]
        ops.fill_at(self._ecopies, fe, 1)
        self._ehead[fe] = ids[fresh]
        self._eparent[fe] = ops.asarray(prev_host[fresh_at])
        self._epentry[fe] = pe[fresh]
        self._edepth[fe] = ops.asarray(base + fresh_at)
        # Every position after the first has a parent entry (the previous hash's); the first, the given parent's.
        with_parent = fresh_at[(fresh_at > 0) | (parent_entry >= 0)]
        ops.scatter_add(self._echildren, pe[ops.asarray(with_parent)], 1)
        self._ecopies[entries[ops.asarray(positions(resident_here))]] += 1
        self._bhash[ids] = hs_dev
        self._bentry[ids] = entries
        stamps = self._stamps(m)
        self._regstamp[ids] = stamps
        if self._policy is _FIFO:
            self._fifo_order.push(ids, stamps)
        if self._events_on:
            for i in fresh_at.tolist():
                p = int(prev_host[i])
                self._events.append(BlockStored(int(hs[i]), None if p < 0 else p))

    def _unregister(self, victims: Array) -> None:
        """Remove the hash registration of ``victims`` (in order); a hash leaves with its last copy.

        Three host reads: the victims' entries and which were cached; after the copies drop, each
        entry's copies left, whether its head copy left and its parent; then which entries are dead.
        """
        ops = self.ops
        m = len(victims)
        first = ops.to_host(ops.concat([self._bentry[victims], ops.cast(self._evstamp[victims] >= 0, "int64")]))
        e_host, cached = first[:m], first[m:]
        self._ncached -= count_true(cached)
        ops.fill_at(self._evstamp, victims, -1)
        ops.fill_at(self._bhash, victims, -1)
        ops.fill_at(self._bentry, victims, -1)
        ops.fill_at(self._regstamp, victims, -1)
        ue_host, cnt = sorted_counts(e_host)
        k = len(ue_host)
        ue = ops.asarray(ue_host)
        self._ecopies[ue] -= ops.asarray(cnt)
        second = ops.to_host(
            ops.concat([self._ecopies[ue], ops.cast(self._bentry[self._ehead[ue]] != ue, "int64"), self._epentry[ue]])
        )
        left, head_gone, parent = second[:k], second[k : 2 * k] != 0, second[2 * k :]
        lost_head = ue_host[(left > 0) & head_gone]
        if len(lost_head):
            self._renew_heads(ops.asarray(lost_head))
        gone_at = positions(left == 0)
        if len(gone_at) == 0:
            self._trim_orders(m)
            return
        gone_host = ue_host[gone_at]
        if self._events_on:  # in the order their last copy left: the last position of each among the victims
            last = np.full(k, -1, dtype=np.int64)
            np.maximum.at(last, np.searchsorted(ue_host, e_host), np.arange(m, dtype=np.int64))
            order = np.argsort(last[gone_at], kind="stable")
            for h in ops.tolist(self._ehash[ops.asarray(gone_host[order])]):
                self._events.append(BlockRemoved(h))
        gpe_host = parent[gone_at]
        gpe_host = gpe_host[gpe_host >= 0]
        if len(gpe_host):
            ops.scatter_add(self._echildren, ops.asarray(gpe_host), -1)
        candidates_host = sorted_distinct(np.concatenate([gone_host, gpe_host]))
        candidates = ops.asarray(candidates_host)
        idle = ops.to_host((self._ecopies[candidates] == 0) & (self._echildren[candidates] == 0))
        dead_host = candidates_host[idle]
        if len(dead_host):
            dead = ops.asarray(dead_host)
            self._index.delete(self._ehash[dead])
            ops.fill_at(self._ehash, dead, -1)
            ops.fill_at(self._ehead, dead, -1)
            self._estack[self._nefree : self._nefree + len(dead_host)] = dead
            self._nefree += len(dead_host)
        self._trim_orders(m)

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

    def _trim_orders(self, left: int) -> None:
        """Advance the orders' heads past the ``left`` blocks that just left them."""
        self._lru_order.trim(left)
        if self._policy is _FIFO:
            self._fifo_order.trim(left)
