"""The array core's prefix index: hash entries, their open-addressing index, registration and lookups (chapter 03).

A hash entry is the array form of one resident hash (or of a hash kept for its resident
children, STATE-007): its hash, parent hash and parent entry, depth, number of copies, number of
resident child hashes and oldest copy (``head``). ``index`` maps each hash to its entry
(:class:`~kvref_arraypool.table.HashTable`); free entries wait on ``free_entries``.

``register`` is detected with array operations over the whole call (the pool explains a refused
one, ERR-509); a lookup is a constant number of array operations: find every hash's entry, compare
each entry's parent with the hash before it, cut at the first miss, return the oldest copy of each
hit. Unregistering keeps each entry's copies, oldest copy and resident children, and frees an
entry when its hash has neither (STATE-007). The index also keeps the KV events (PFX-315).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kvref.contract.checks import HashEntry
from kvref.contract.errors import UnknownHashError
from kvref.contract.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvref_arraypool.blocks import NOBODY, SHARED, BlockArrays
from kvref_arraypool.host_arrays import any_true, count_distinct, count_true, positions, sorted_counts, sorted_distinct
from kvref_arraypool.ops import Array
from kvref_arraypool.orders import CacheOrders
from kvref_arraypool.table import HashTable

__all__ = ["PrefixIndex"]


class PrefixIndex:
    """Hash entries of a pool's blocks, indexed by hash; registration, unregistration, lookups, events."""

    def __init__(self, blocks: BlockArrays, orders: CacheOrders, *, enable_events: bool) -> None:
        ops = self.ops = blocks.ops
        self.blocks = blocks
        self.orders = orders
        self.num_entries = n = 2 * blocks.n + 2
        self.hash_of = ops.full(n, -1)
        self.parent_hash = ops.full(n, -1)
        self.parent_entry = ops.full(n, -1)
        self.depth = ops.zeros(n)
        self.copies = ops.zeros(n)
        self.children = ops.zeros(n)
        self.head = ops.full(n, -1)
        self.free_entries = ops.arange(n)
        self.num_free_entries = n
        #: Scratch of the lru-leaf order (all 0, all -1 between calls).
        self.scratch = ops.zeros(n)
        self.scratch2 = ops.full(n, -1)
        self.index = HashTable(ops, n, growable=False)
        self.events_on = enable_events
        self.events: list[KVEvent] = []

    # ------------------------------------------------------------------ reads

    def resident(self, entries: Array) -> Array:
        """Per entry (-1: none), whether its hash has a copy."""
        found = entries >= 0
        return found & (self.copies[self.ops.where(found, entries, 0)] > 0)

    def chained(self, entries: Array, prev: Array) -> tuple[Array, Array]:
        """The hashes' ``entries`` made safe to index (0 where absent), and whether each is resident
        under the hash before it (``prev``; -1 at a chain's root): the positions a lookup may hit."""
        safe = self.ops.where(entries >= 0, entries, 0)
        return safe, (entries >= 0) & (self.copies[safe] > 0) & (self.parent_hash[safe] == prev)

    def hash_entry(self, block_hash: int) -> HashEntry | None:
        """What the index knows of ``block_hash``: resident, its parent, whether it has resident
        children; None without an entry (the explainers' view, :mod:`kvref.contract.checks`). A value
        outside [0, 2**63) has none: no hash the index holds is one (HASH-207), and the table's
        negative keys mark its empty and deleted slots."""
        if not 0 <= block_hash < 1 << 63:
            return None
        e = int(self.index.find(self.ops.asarray(np.array([block_hash], dtype=np.int64)))[0])
        if e < 0:
            return None
        p = int(self.parent_hash[e])
        return HashEntry(int(self.copies[e]) > 0, None if p < 0 else p, int(self.children[e]) > 0)

    def resident_hashes(self) -> frozenset[int]:
        """Hashes with at least one copy, in use or evictable (PFX-305)."""
        keys, entries = self.index.items()
        return frozenset(self.ops.tolist(keys[self.copies[entries] > 0]))

    def parent_of(self, parent: int, op: str) -> tuple[int, int]:
        """The entry of resident hash ``parent`` and its depth, in one host read (PFX-304 if not resident)."""
        ops = self.ops
        key = ops.asarray(np.array([parent], dtype=np.int64))
        entry, far = self.index.find_near(key)  # probed near home, with no read of its own
        while True:
            parts = [entry, ops.cast(self.resident(entry), "int64"), self.depth[ops.where(entry >= 0, entry, 0)]]
            read = ops.to_host(ops.concat(parts if far is None else [*parts, ops.cast(far, "int64")]))
            if far is None or not read[3]:
                break
            entry, far = self.index.find(key), None  # far from home: the exact probe
        if not read[1]:
            raise UnknownHashError(
                "PFX-304", f"{op}: parent hash {parent:#x} is not resident; register the prefix first"
            )
        return int(read[0]), int(read[2])

    # ---------------------------------------------------------------- lookups

    def lookup(self, hs: np.ndarray, parent: int) -> Array:
        """Blocks of the longest resident prefix of a chain (oldest copy of each hash); pure."""
        ops = self.ops
        m = len(hs)
        if m == 0:
            return ops.zeros(0)
        prev = ops.asarray(np.concatenate([np.array([parent], dtype=np.int64), hs[:-1]]))
        safe, ok = self.chained(self.index.find(ops.asarray(hs)), prev)
        missed = positions(~ops.to_host(ok))  # one read: where the chain first misses
        length = int(missed[0]) if len(missed) else m
        return self.head[safe[:length]]

    def lookup_to_pin(self, hs: np.ndarray, parent: int, hid: int) -> tuple[Array, np.ndarray] | None:
        """:meth:`lookup` of a non-empty chain for a match, in one host read with the pin's own flags.

        Returns the hit and, per hit, whether it is cached, held alone by a holder other than
        ``hid`` and shared (the pin's flags; a chain's hits are distinct blocks). None where a
        hash's probe ran long (:meth:`HashTable.find_near`): the caller then looks up and pins the
        exact way.
        """
        ops = self.ops
        m = len(hs)
        entries, far = self.index.find_near(ops.asarray(hs))
        prev = ops.asarray(np.concatenate([np.array([parent], dtype=np.int64), hs[:-1]]))
        safe, ok = self.chained(entries, prev)
        heads = self.head[ops.where(ok, safe, 0)]
        owner = self.blocks.owner[ops.where(ok, heads, 0)]
        flags = ops.to_host(ops.concat([far, ok, owner == NOBODY, (owner >= 0) & (owner != hid), owner == SHARED]))
        if any_true(flags[:m]):
            return None
        missed = positions(~flags[m : 2 * m])
        k = int(missed[0]) if len(missed) else m
        pin = np.stack([flags[start : start + k] for start in (2 * m, 3 * m, 4 * m)])
        return heads[:k], pin

    def lookup_many(self, lists: Sequence[np.ndarray]) -> tuple[Array, list[int]]:
        """The hits of every chain from the root, in one pass: their blocks (concatenated) and lengths.

        All chains are looked up together on the state before the batch (PFX-320): one probe of
        the index for every hash, one segmented minimum for the first miss of each chain, one
        gather of the oldest copies. One host read, of the lengths (two where a hash sat far from
        its home slot: :meth:`HashTable.find_near`).
        """
        ops = self.ops
        lengths = np.array([len(hl) for hl in lists], dtype=np.int64)
        total = int(lengths.sum())
        if total == 0:
            return ops.zeros(0), [0] * len(lists)
        flat = np.concatenate(lists)
        starts = np.cumsum(lengths) - lengths
        segment = np.repeat(np.arange(len(lists), dtype=np.int64), lengths)
        position = np.arange(total, dtype=np.int64) - starts[segment]
        prev = np.roll(flat, 1)  # each hash's parent is the hash before it ...
        prev[position == 0] = -1  # ... but every chain starts at the root
        hashes = ops.asarray(flat)
        entries, far = self.index.find_near(hashes)
        seg, pos, parents = ops.asarray(segment), ops.asarray(position), ops.asarray(prev)
        k = len(lists)
        while True:
            safe, ok = self.chained(entries, parents)
            hit_length = ops.asarray(lengths.copy())
            ops.scatter_min(hit_length, seg, ops.where(ok, total, pos))
            read = ops.to_host(ops.concat([hit_length, ops.cast(far, "int64")]) if far is not None else hit_length)
            if far is None or not any_true(read[k:] != 0):
                break
            entries, far = self.index.find(hashes), None  # a hash far from home: the exact probe
        hits = read[:k]
        first = np.repeat(starts - (np.cumsum(hits) - hits), hits)  # each hit's position in ``flat``
        at = first + np.arange(int(hits.sum()), dtype=np.int64)
        return self.head[safe[ops.asarray(at)]], hits.tolist()

    # ------------------------------------------------------------ registration

    def register(
        self,
        host: np.ndarray,
        hs: np.ndarray,
        parent: int,
        parent_entry: int,
        parent_depth: int,
        explain: Callable[[], None],
    ) -> None:
        """Register distinct blocks ``host`` under the chain ``hs`` after ``parent`` (its entry and depth,
        or -1: the root). Where anything in the call may be refused (PFX-302, PFX-303, PFX-305,
        PFX-306, POOL-103, POOL-118 or a cycle), ``explain()`` is called first, and raises the
        refusal if there is one. One host read where every hash sits near its home."""
        ops = self.ops
        m = len(hs)
        prev_host = np.concatenate([np.array([parent], dtype=np.int64), hs[:-1]])
        hashes = ops.asarray(hs)
        repeated = m > 1 and count_distinct(hs) != m
        suspicious = repeated or not self.blocks.in_range(host) or any_true(hs == prev_host)
        read = None
        if not suspicious:  # one host read: hashes far from home, the verdict, which are new, which resident
            entries, far = self.index.find_near(hashes)
            resident = self.resident(entries)
            bad = self._refusals(host, prev_host, entries, resident)
            flags = ops.to_host(ops.concat([far, bad, entries < 0, resident]))
            if not any_true(flags[:m]):
                suspicious, read = any_true(flags[m : 2 * m]), flags[2 * m :]
        if read is None:  # the exact probe: a hash sat far from home, or the call needs a close look
            entries = self.index.find(hashes)
            resident = self.resident(entries)
            if not suspicious:
                suspicious = ops.any(self._refusals(host, prev_host, entries, resident))
        if suspicious:
            explain()
        self._apply(ops.asarray(host), hs, prev_host, entries, resident, parent_entry, parent_depth, read)

    def _refusals(self, host: np.ndarray, prev_host: np.ndarray, entries: Array, resident: Array) -> Array:
        """Per position, whether ``register`` must look closer: the block reserved, free or hashed
        already, its hash resident under another parent, or a cycle risk (checked by the explanation)."""
        ops, blocks = self.ops, self.blocks
        ids = ops.asarray(host)
        safe = ops.where(entries >= 0, entries, 0)
        return (
            blocks.is_reserved[ids]
            | (blocks.ref[ids] == 0)
            | (blocks.hash[ids] >= 0)
            | (resident & (self.parent_hash[safe] != ops.asarray(prev_host)))
            | (~resident & (entries >= 0) & (self.children[safe] > 0))
        )

    def _apply(
        self,
        ids: Array,
        hs: np.ndarray,
        prev_host: np.ndarray,
        entries: Array,
        resident: Array,
        parent_entry: int,
        parent_depth: int,
        read: np.ndarray | None,
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
            new = ops.copy(self.free_entries[self.num_free_entries - k : self.num_free_entries])
            self.num_free_entries -= k
            self.index.insert(hs_dev[absent], new)
            self.hash_of[new] = hs_dev[absent]
            ops.fill_at(self.children, new, 0)
            entries = ops.copy(entries)
            entries[absent] = new
        # Parent entry of each position: the given parent's for the first, the previous hash's after.
        pe = ops.concat([ops.full(1, parent_entry), entries[:-1]])
        base = parent_depth + 1 if parent_entry >= 0 else 0
        fresh_at = positions(~resident_here)
        fresh = ops.asarray(fresh_at)
        fe = entries[fresh]
        ops.fill_at(self.copies, fe, 1)
        self.head[fe] = ids[fresh]
        self.parent_hash[fe] = ops.asarray(prev_host[fresh_at])
        self.parent_entry[fe] = pe[fresh]
        self.depth[fe] = ops.asarray(base + fresh_at)
        # Every position after the first has a parent entry (the previous hash's); the first, the given parent's.
        with_parent = fresh_at[(fresh_at > 0) | (parent_entry >= 0)]
        ops.scatter_add(self.children, pe[ops.asarray(with_parent)], 1)
        self.copies[entries[ops.asarray(positions(resident_here))]] += 1
        self.blocks.hash[ids] = hs_dev
        self.blocks.entry[ids] = entries
        self.orders.register(ids)
        if self.events_on:
            for i in fresh_at.tolist():
                p = int(prev_host[i])
                self.events.append(BlockStored(int(hs[i]), None if p < 0 else p))

    def unregister(self, victims: Array) -> None:
        """Remove the hash registration of ``victims`` (in order); a hash leaves with its last copy.

        Three host reads: the victims' entries and which were cached; after the copies drop, each
        entry's copies left, whether its head copy left and its parent; then which entries are dead.
        """
        ops, blocks = self.ops, self.blocks
        m = len(victims)
        first = ops.to_host(ops.concat([blocks.entry[victims], ops.cast(blocks.released[victims] >= 0, "int64")]))
        e_host, cached = first[:m], first[m:]
        self.orders.num_cached -= count_true(cached)
        for array in (blocks.released, blocks.hash, blocks.entry, blocks.registered):
            ops.fill_at(array, victims, -1)
        ue_host, cnt = sorted_counts(e_host)
        k = len(ue_host)
        ue = ops.asarray(ue_host)
        self.copies[ue] -= ops.asarray(cnt)
        second = ops.to_host(
            ops.concat([self.copies[ue], ops.cast(blocks.entry[self.head[ue]] != ue, "int64"), self.parent_entry[ue]])
        )
        left, head_gone, parent = second[:k], second[k : 2 * k] != 0, second[2 * k :]
        lost_head = ue_host[(left > 0) & head_gone]
        if len(lost_head):
            self._renew_heads(ops.asarray(lost_head))
        gone_at = positions(left == 0)
        if len(gone_at) == 0:
            self.orders.trim(m)
            return
        gone_host = ue_host[gone_at]
        if self.events_on:  # in the order their last copy left: the last position of each among the victims
            last = np.full(k, -1, dtype=np.int64)
            np.maximum.at(last, np.searchsorted(ue_host, e_host), np.arange(m, dtype=np.int64))
            order = np.argsort(last[gone_at], kind="stable")
            for h in ops.tolist(self.hash_of[ops.asarray(gone_host[order])]):
                self.events.append(BlockRemoved(h))
        gpe_host = parent[gone_at]
        gpe_host = gpe_host[gpe_host >= 0]
        if len(gpe_host):
            ops.scatter_add(self.children, ops.asarray(gpe_host), -1)
        candidates_host = sorted_distinct(np.concatenate([gone_host, gpe_host]))
        candidates = ops.asarray(candidates_host)
        idle = ops.to_host((self.copies[candidates] == 0) & (self.children[candidates] == 0))
        dead_host = candidates_host[idle]
        if len(dead_host):
            dead = ops.asarray(dead_host)
            self.index.delete(self.hash_of[dead])
            ops.fill_at(self.hash_of, dead, -1)
            ops.fill_at(self.head, dead, -1)
            self.free_entries[self.num_free_entries : self.num_free_entries + len(dead_host)] = dead
            self.num_free_entries += len(dead_host)
        self.orders.trim(m)

    def _renew_heads(self, entries: Array) -> None:
        """Oldest remaining copy of each entry, by registration stamp (rare: hashes with several copies)."""
        ops, blocks = self.ops, self.blocks
        copies = ops.nonzero(ops.isin(blocks.entry, entries))
        ce = blocks.entry[copies]
        cs = blocks.registered[copies]
        oldest = ops.full(self.num_entries, 1 << 62)
        ops.scatter_min(oldest, ce, cs)
        first = cs == oldest[ce]
        self.head[ce[first]] = copies[first]

    def clear(self) -> None:
        """Forget every hash and entry (the blocks' own fields are the caller's); all-cleared with events on."""
        self.index.clear()
        for array in (self.hash_of, self.parent_hash, self.parent_entry, self.head):
            array[:] = -1
        self.copies[:] = 0
        self.children[:] = 0
        self.free_entries[:] = self.ops.arange(self.num_entries)
        self.num_free_entries = self.num_entries
        if self.events_on:
            self.events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        """Events since the last call, oldest first, and forget them (PFX-315)."""
        events, self.events = self.events, []
        return events

    def snapshot(self) -> dict[str, Any]:
        """The entries by hash, in hash order: copies, parent, resident children, oldest copy."""
        ops = self.ops
        keys, entries = self.index.items()
        order = ops.argsort(keys)
        keys, entries = keys[order], entries[order]
        return {
            "hash": ops.tolist(keys),
            "copies": ops.tolist(self.copies[entries]),
            "parent": ops.tolist(self.parent_hash[entries]),
            "children": ops.tolist(self.children[entries]),
            "head": ops.tolist(self.head[entries]),
        }
