"""Per-holder reference counts of shared blocks: two pairs of a block inline, any more in a hash table (STATE-002).

A block one holder holds keeps its holder in ``owner`` and its count in ``ref`` (see
:mod:`kvref_arraypool.blocks`); a block that gains a second holder becomes shared, and the count of
each (block, holder) pair then lives here. Most shared blocks have two holders (a request, and
another reading its prefix), so a block's first two pairs sit in per-block arrays
(``first_holder`` and ``first_count``, ``second_holder`` and ``second_count``): reading or changing
them is a gather or a scatter, with no probe. A third holder and beyond go to a growable
:class:`~kvref_arraypool.table.HashTable` keyed by ``block << HID_BITS | hid``; ``spilled[b]``
counts block ``b``'s pairs there, so that a block with none never probes it.

Callers guarantee what each method states of its pairs (distinct, present or absent, counts
positive and covered): the pool has validated them. Each method takes device arrays and reads the
host once or twice a call.
"""

from __future__ import annotations

import numpy as np

from kvref_arraypool.host_arrays import all_true, positions
from kvref_arraypool.ops import Array, ArrayOps
from kvref_arraypool.table import HashTable

__all__ = ["HID_BITS", "HID_MASK", "HolderCounts"]

#: A (block, holder) pair packs into one int64 key: ``block << HID_BITS | holder id``.
HID_BITS = 32
HID_MASK = (1 << HID_BITS) - 1
#: The holder id of an inline slot no pair uses.
UNUSED = -1


def _at(values: Array | int, idx: Array | slice) -> Array | int:
    """``values[idx]``, or ``values`` itself when it is one int for every position."""
    return values if isinstance(values, int) else values[idx]


class HolderCounts:
    """``(block, holder id) -> references`` for the shared blocks of a pool of ``n`` blocks."""

    def __init__(self, ops: ArrayOps, n: int) -> None:
        self.ops = ops
        self.first_holder = ops.full(n, UNUSED)
        self.first_count = ops.zeros(n)
        self.second_holder = ops.full(n, UNUSED)
        self.second_count = ops.zeros(n)
        #: The two inline slots, (holder ids, counts) each, in the order pairs take them.
        self.inline = ((self.first_holder, self.first_count), (self.second_holder, self.second_count))
        self.spilled = ops.zeros(n)
        self.table = HashTable(ops, 64, growable=True)
        self._mark = ops.full(n, -1)

    # ------------------------------------------------------------------ reads

    def get(self, blocks: Array, hids: Array | int) -> Array:
        """References of each pair (0 for a pair not counted here)."""
        ops = self.ops
        h0, h1 = self.first_holder[blocks], self.second_holder[blocks]
        out = ops.where(h0 == hids, self.first_count[blocks], ops.where(h1 == hids, self.second_count[blocks], 0))
        if self.table.live:
            look = ops.nonzero((h0 != hids) & (h1 != hids) & (self.spilled[blocks] > 0))
            if len(look):
                out[look] = self.table.find((blocks[look] << HID_BITS) | _at(hids, look), 0)
        return out

    def items(self) -> tuple[Array, Array]:
        """Every counted pair as a key ``block << HID_BITS | hid``, and its count (no set order)."""
        ops = self.ops
        keys, counts = [], []
        for hid, count in self.inline:
            used = ops.nonzero(hid != UNUSED)
            keys.append((used << HID_BITS) | hid[used])
            counts.append(count[used])
        table_keys, table_counts = self.table.items()
        return ops.concat([*keys, table_keys]), ops.concat([*counts, table_counts])

    def holders_of(self, b: int) -> list[tuple[int, int]]:
        """Block ``b``'s pairs as (holder id, count), inline ones first."""
        out = [(int(h[b]), int(c[b])) for h, c in self.inline if h[b] != UNUSED]
        if int(self.spilled[b]):
            keys, values = self.table.items()
            mine = (keys >> HID_BITS) == b
            hids, counts = self.ops.tolist(keys[mine] & HID_MASK), self.ops.tolist(values[mine])
            out.extend(zip(hids, counts, strict=True))
        return out

    def fault(self) -> str | None:
        """What is inconsistent in the layout, or None: a pair counted twice (inline and in the
        table, or in both inline slots), an unused inline slot with a count, ``spilled`` that
        disagrees with the table (STATE-002 checks the counts themselves)."""
        host = self.ops.to_host
        h0, h1, c0, c1 = (
            host(self.first_holder),
            host(self.second_holder),
            host(self.first_count),
            host(self.second_count),
        )
        if ((h0 == UNUSED) & (c0 != 0)).any() or ((h1 == UNUSED) & (c1 != 0)).any():
            return "an unused inline slot holds a count"
        if ((h0 != UNUSED) & (h0 == h1)).any():
            return "a pair is counted in both inline slots of its block"
        keys = host(self.table.items()[0])
        blocks, hids = keys >> HID_BITS, keys & HID_MASK
        if ((h0[blocks] == hids) | (h1[blocks] == hids)).any():
            return "a pair is counted inline and in the table"
        if (np.bincount(blocks, minlength=len(h0)) != host(self.spilled)).any():
            return "spilled counts disagree with the pairs in the table"
        return None

    # ---------------------------------------------------------------- changes

    def add(self, blocks: Array, hids: Array | int, counts: Array | int, *, distinct: bool = False) -> None:
        """Add ``counts`` references to each pair, counted here or not; the pairs are distinct.

        ``distinct``: the blocks are too (each pair then takes a slot from one host read: counted
        inline, or new and where it goes, or new in a block with pairs in the table, to look up).
        """
        ops = self.ops
        n = len(blocks)
        if n == 0:
            return
        h0, h1 = self.first_holder[blocks], self.second_holder[blocks]
        fresh = ops.where(h0 == UNUSED, 2, ops.where(h1 == UNUSED, 3, 4))
        if self.table.live:
            fresh = ops.where(self.spilled[blocks] > 0, 5, fresh)
        code = ops.to_host(ops.where(h0 == hids, 0, ops.where(h1 == hids, 1, fresh)))
        for slot, (_, count) in enumerate(self.inline):
            at = self._positions(code == slot)
            if at is not None:
                count[blocks[at]] += _at(counts, at)
        if not distinct:  # a block may come twice: the new pairs take their slots by rank (_place)
            code = np.where(code >= 2, 5, code)
        self._put_new(blocks, hids, counts, code, 2)
        rest = self._positions(code == 5)
        if rest is None:
            return
        blocks, hids, counts = blocks[rest], _at(hids, rest), _at(counts, rest)
        if self.table.live:  # a pair in the table already: add there
            slots = self.table.find_slots((blocks << HID_BITS) | hids)
            found = ops.to_host(slots >= 0)
            there = self._positions(found)
            if there is not None:
                hit = slots[there]
                self.table.set_at(hit, self.table.values[hit] + _at(counts, there))
            new = self._positions(~found)
            if new is None:
                return
            blocks, hids, counts = blocks[new], _at(hids, new), _at(counts, new)
        self._place(blocks, hids, counts)

    def share(self, blocks: Array, first: Array, first_counts: Array, second: Array | int, second_counts: int) -> None:
        """Count the two pairs of blocks that had one holder until now: ``(first, first_counts)`` and
        ``(second, second_counts)`` per block; the blocks are distinct and none is counted here (a
        block held alone has no pair here, STATE-002), so both pairs go inline with no host read."""
        ops = self.ops
        ops.put(self.first_holder, blocks, first)
        ops.put(self.first_count, blocks, first_counts)
        ops.put(self.second_holder, blocks, second)
        ops.fill_at(self.second_count, blocks, second_counts)

    def _spill(self, blocks: Array, hids: Array | int, counts: Array | int) -> None:
        """Count new pairs in the table."""
        ops = self.ops
        spilt = ops.full(len(blocks), counts) if isinstance(counts, int) else counts
        self.table.insert((blocks << HID_BITS) | hids, spilt)
        ops.scatter_add(self.spilled, blocks, 1)

    def _place(self, blocks: Array, hids: Array | int, counts: Array | int) -> None:
        """Count new pairs: each block's first in a free inline slot (``0`` before ``1``), the
        next in the other if that is free too, any more in the table."""
        ops = self.ops
        f0, f1 = self.first_holder[blocks] == UNUSED, self.second_holder[blocks] == UNUSED
        rank = self._rank(blocks)
        if isinstance(rank, int):  # each block once
            to0, to1 = f0, ~f0 & f1
        else:
            to0 = (rank == 0) & f0
            to1 = ((rank == 0) & ~f0 & f1) | ((rank == 1) & f0 & f1)
        self._put_new(blocks, hids, counts, ops.to_host(ops.where(to0, 0, ops.where(to1, 1, 2))), 0)

    def _put_new(self, blocks: Array, hids: Array | int, counts: Array | int, code: np.ndarray, base: int) -> None:
        """Count new pairs where host ``code`` places them: ``base`` in inline slot 0, ``base + 1`` in
        inline slot 1, ``base + 2`` in the table (any other code: not here)."""
        ops = self.ops
        for slot, (hid, count) in enumerate(self.inline):
            at = self._positions(code == base + slot)
            if at is not None:
                b = blocks[at]
                ops.put(hid, b, _at(hids, at))
                ops.put(count, b, counts if isinstance(counts, int) else counts[at])
        spill = self._positions(code == base + 2)
        if spill is not None:
            self._spill(blocks[spill], _at(hids, spill), _at(counts, spill))

    def _rank(self, blocks: Array) -> Array | int:
        """Each position's rank among the positions of its block, in order; 0 when every block is there once."""
        ops = self.ops
        m = len(blocks)
        pos = ops.arange(m)
        self._mark[blocks] = pos
        if m < 2 or not ops.any(self._mark[blocks] != pos):
            return 0
        order = ops.argsort(blocks)
        ordered = blocks[order]
        starts = ops.concat([ops.full(1, 1), ops.where(ordered[1:] != ordered[:-1], 1, 0)])
        group = ops.cumsum(starts) - 1
        rank = ops.zeros(m)
        rank[order] = pos - ops.nonzero(starts)[group]
        return rank

    def sub(self, blocks: Array, hids: Array | int, counts: Array | int) -> None:
        """Take ``counts`` references from each pair (distinct, counted here with at least that many);
        a pair left with none is no longer counted."""
        ops = self.ops
        n = len(blocks)
        if n == 0:
            return
        h0, h1 = self.first_holder[blocks], self.second_holder[blocks]
        where = ops.to_host(ops.where(h0 == hids, 0, ops.where(h1 == hids, 1, 2)))
        for slot, (hid, count) in enumerate(self.inline):
            at = self._positions(where == slot)
            if at is not None:
                b = blocks[at]
                left = count[b] - _at(counts, at)
                count[b] = left
                hid[b] = ops.where(left == 0, UNUSED, hid[b])
        rest = self._positions(where == 2)
        if rest is not None:
            b = blocks[rest]
            slots = self.table.find_slots((b << HID_BITS) | _at(hids, rest))
            left = self.table.values[slots] - _at(counts, rest)
            self.table.set_at(slots, left)
            gone = ops.to_host(left == 0)
            done = self._positions(gone)
            if done is not None:
                self.table.delete_at(slots[done])
                ops.scatter_add(self.spilled, b[done], -1)

    def clear(self) -> None:
        """Count nothing (the arrays stay)."""
        for hid in (self.first_holder, self.second_holder):
            hid[:] = UNUSED
        for count in (self.first_count, self.second_count, self.spilled):
            count[:] = 0
        self.table.clear()

    def _positions(self, which: np.ndarray) -> Array | slice | None:
        """The positions where host flags ``which`` are set: a device array, every position (a
        slice: no gather), or None where none is."""
        if all_true(which):
            return slice(None)
        at = positions(which)
        return self.ops.asarray(at) if len(at) else None
