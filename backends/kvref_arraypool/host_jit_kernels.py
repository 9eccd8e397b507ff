"""The hash table's probes as numba kernels (imported by :mod:`kvref_arraypool.host_jit` only where numba is).

Each kernel is :class:`~kvref_arraypool.table.HashTable`'s probe for a whole batch, key by key in
batch order; every array is int64 and ``mask`` is the table's capacity less one. Compiled on first
call and cached on disk beside this file.

Every kernel is compiled with ``_nrt=False``: none allocates, and with numba's reference counting on,
each array handed to a helper such as :func:`count_pair` is counted in and out on every call, which
made ``counts_add`` of 256 pairs take 18 us instead of 0.6 us (numba 0.68).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

__all__ = [
    "count_pair", "counts_add", "counts_get", "counts_sub", "delete", "erase", "find_slots", "find_values", "home",
    "insert",
    "pair_count", "pair_key", "put_key", "slot_of", "uncount_pair",
]  # fmt: skip

_MIX = np.int64(0xFF51AFD7ED558CCD - (1 << 64))  # murmur3's fmix64 constant as a signed int64
_EMPTY = -1
_TOMB = -2
_HID_BITS = 32  # kvref_arraypool.holder_counts.HID_BITS
_UNUSED = -1  # kvref_arraypool.holder_counts.UNUSED


@njit(cache=True, inline="always", _nrt=False)
def home(key: Any, mask: Any) -> Any:  # pragma: no cover - compiled
    """``HashTable._home`` of one key: int64 arithmetic shifts and a wrapping product."""
    x = key ^ (key >> 33)
    x = x * _MIX
    x = x ^ (x >> 33)
    return x & mask


@njit(cache=True, _nrt=False)
def find_slots(tkeys: Any, mask: Any, keys: Any, out: Any) -> None:  # pragma: no cover - compiled
    """``out[i]``: the slot of ``keys[i]``, or -1 where it is absent."""
    for i in range(keys.shape[0]):
        key = keys[i]
        slot = home(key, mask)
        out[i] = -1
        for _ in range(mask + 1):
            seen = tkeys[slot]
            if seen == key:
                out[i] = slot
                break
            if seen == _EMPTY:
                break
            slot = (slot + 1) & mask


@njit(cache=True, _nrt=False)
def find_values(tkeys: Any, tvalues: Any, mask: Any, keys: Any, default: Any, out: Any) -> None:  # pragma: no cover
    """``out[i]``: the value of ``keys[i]``, or ``default`` where it is absent."""
    for i in range(keys.shape[0]):
        key = keys[i]
        slot = home(key, mask)
        out[i] = default
        for _ in range(mask + 1):
            seen = tkeys[slot]
            if seen == key:
                out[i] = tvalues[slot]
                break
            if seen == _EMPTY:
                break
            slot = (slot + 1) & mask


@njit(cache=True, _nrt=False)
def insert(tkeys: Any, tvalues: Any, mask: Any, keys: Any, values: Any) -> Any:  # pragma: no cover - compiled
    """Distinct absent keys, each in the first open slot (empty or deleted) from its home, in
    batch order; returns how many deleted slots they took (the caller made room: a slot is open)."""
    tombs = 0
    for i in range(keys.shape[0]):
        tombs += put_key(tkeys, tvalues, mask, keys[i], values[i])
    return tombs


@njit(cache=True, _nrt=False)
def delete(tkeys: Any, tvalues: Any, mask: Any, keys: Any) -> Any:  # pragma: no cover - compiled
    """Distinct present keys leave the table with no tombstone (:func:`erase`); returns how many
    were found (all, when the caller's keys were present)."""
    found = 0
    for i in range(keys.shape[0]):
        slot = slot_of(tkeys, mask, keys[i])
        if slot >= 0:
            erase(tkeys, tvalues, mask, slot)
            found += 1
    return found


@njit(cache=True, _nrt=False)  # not inlined by numba (``inline="always"`` made it 2-3x slower): LLVM decides
def erase(tkeys: Any, tvalues: Any, mask: Any, hole: Any) -> None:  # pragma: no cover - compiled
    """Take the key at slot ``hole`` out, leaving no tombstone (backward-shift deletion): each later key
    of its run whose probe from home passed ``hole`` moves back into it, and the run's last hole is
    empty again. So deletes on the host never bring the table nearer a rebuild. Tombstones that
    other paths left are passed over like keys of another home (the load limit keeps an empty slot)."""
    j = (hole + 1) & mask
    while j != hole:  # an empty slot ends the run first (the load limit keeps one)
        key = tkeys[j]
        if key == _EMPTY:
            break
        if key >= 0 and ((j - home(key, mask)) & mask) >= ((j - hole) & mask):  # its probe passed ``hole``
            tkeys[hole] = key
            tvalues[hole] = tvalues[j]
            hole = j
        j = (j + 1) & mask
    tkeys[hole] = _EMPTY


@njit(cache=True, inline="always", _nrt=False)
def slot_of(tkeys: Any, mask: Any, key: Any) -> Any:  # pragma: no cover - compiled
    """``key``'s slot, or -1."""
    slot = home(key, mask)
    for _ in range(mask + 1):
        seen = tkeys[slot]
        if seen == key:
            return slot
        if seen == _EMPTY:
            return -1
        slot = (slot + 1) & mask
    return -1


@njit(cache=True, inline="always", _nrt=False)
def pair_key(b: Any, h: Any) -> Any:  # pragma: no cover - compiled
    """The per-holder counts' table key of pair ``(b, h)``: ``b << HID_BITS | h``."""
    return (b << _HID_BITS) | h


@njit(cache=True, inline="always", _nrt=False)
def put_key(tkeys: Any, tvalues: Any, mask: Any, key: Any, value: Any) -> Any:  # pragma: no cover - compiled
    """An absent ``key`` with ``value`` in the first open slot (empty or deleted) from its home (room
    made by the caller); 1 if that slot was a deleted one, else 0."""
    slot = home(key, mask)
    while tkeys[slot] >= 0:
        slot = (slot + 1) & mask
    tomb = 1 if tkeys[slot] == _TOMB else 0
    tkeys[slot] = key
    tvalues[slot] = value
    return tomb


@njit(cache=True, inline="always", _nrt=False)
def pair_count(hid0: Any, count0: Any, hid1: Any, count1: Any, spilled: Any, tkeys: Any, tvalues: Any, mask: Any,
               b: Any, h: Any) -> Any:  # fmt: skip  # pragma: no cover - compiled
    """``HolderCounts.get_one``: the references of pair ``(b, h)`` (0 when not counted)."""
    if hid0[b] == h:
        return count0[b]
    if hid1[b] == h:
        return count1[b]
    if spilled[b] > 0:
        slot = slot_of(tkeys, mask, pair_key(b, h))
        if slot >= 0:
            return tvalues[slot]
    return 0


@njit(cache=True, _nrt=False)
def counts_get(hid0: Any, count0: Any, hid1: Any, count1: Any, spilled: Any, tkeys: Any, tvalues: Any, mask: Any,
               blocks: Any, hids: Any, out: Any) -> None:  # fmt: skip  # pragma: no cover - compiled
    """``HolderCounts.get``: ``out[i]``, the references of pair ``(blocks[i], hids[i])`` (0 when not counted)."""
    for i in range(blocks.shape[0]):
        out[i] = pair_count(hid0, count0, hid1, count1, spilled, tkeys, tvalues, mask, blocks[i], hids[i])


@njit(cache=True, inline="always", _nrt=False)
def count_pair(hid0: Any, count0: Any, hid1: Any, count1: Any, spilled: Any, tkeys: Any, tvalues: Any, mask: Any,
               b: Any, h: Any, c: Any) -> Any:  # fmt: skip  # pragma: no cover - compiled
    """``HolderCounts.add_one``: ``c`` more references of pair ``(b, h)``, counted inline, else in the
    table if the block has pairs there, else in a free inline slot (0 before 1), else as a new key
    (room made by the caller). Returns (keys added to the table, deleted slots taken): 0 or 1 each."""
    if hid0[b] == h:
        count0[b] += c
        return 0, 0
    if hid1[b] == h:
        count1[b] += c
        return 0, 0
    key = pair_key(b, h)
    if spilled[b] > 0:
        slot = slot_of(tkeys, mask, key)
        if slot >= 0:
            tvalues[slot] += c
            return 0, 0
    if hid0[b] == _UNUSED:
        hid0[b] = h
        count0[b] = c
        return 0, 0
    if hid1[b] == _UNUSED:
        hid1[b] = h
        count1[b] = c
        return 0, 0
    tomb = put_key(tkeys, tvalues, mask, key, c)
    spilled[b] += 1
    return 1, tomb


@njit(cache=True, _nrt=False)
def counts_add(hid0: Any, count0: Any, hid1: Any, count1: Any, spilled: Any, tkeys: Any, tvalues: Any, mask: Any,
               blocks: Any, hids: Any, counts: Any) -> Any:  # fmt: skip  # pragma: no cover - compiled
    """``HolderCounts.add`` pair by pair, as ``add_one`` (:func:`count_pair`). Returns (keys added
    to the table, deleted slots they took)."""
    added = 0
    tombs = 0
    for i in range(blocks.shape[0]):
        a, t = count_pair(hid0, count0, hid1, count1, spilled, tkeys, tvalues, mask, blocks[i], hids[i], counts[i])
        added += a
        tombs += t
    return added, tombs


@njit(cache=True, inline="always", _nrt=False)
def uncount_pair(hid0: Any, count0: Any, hid1: Any, count1: Any, spilled: Any, tkeys: Any, tvalues: Any, mask: Any,
                 b: Any, h: Any, c: Any) -> Any:  # fmt: skip  # pragma: no cover - compiled
    """``HolderCounts.sub_one``: ``c`` fewer references of pair ``(b, h)`` (counted, with at least
    ``c``); a pair left with none is no longer counted (its inline slot unused, its table slot
    deleted). Returns the table keys deleted: 0 or 1."""
    if hid0[b] == h:
        count0[b] -= c
        if count0[b] == 0:
            hid0[b] = _UNUSED
        return 0
    if hid1[b] == h:
        count1[b] -= c
        if count1[b] == 0:
            hid1[b] = _UNUSED
        return 0
    slot = slot_of(tkeys, mask, pair_key(b, h))
    if slot < 0:  # not counted: the caller promised otherwise; nothing to take
        return 0
    tvalues[slot] -= c
    if tvalues[slot] != 0:
        return 0
    tkeys[slot] = _TOMB
    spilled[b] -= 1
    return 1


@njit(cache=True, _nrt=False)
def counts_sub(hid0: Any, count0: Any, hid1: Any, count1: Any, spilled: Any, tkeys: Any, tvalues: Any, mask: Any,
               blocks: Any, hids: Any, counts: Any) -> Any:  # fmt: skip  # pragma: no cover - compiled
    """``HolderCounts.sub`` pair by pair, as ``sub_one`` (:func:`uncount_pair`). Returns how many
    table keys were deleted."""
    deleted = 0
    for i in range(blocks.shape[0]):
        deleted += uncount_pair(
            hid0, count0, hid1, count1, spilled, tkeys, tvalues, mask, blocks[i], hids[i], counts[i]
        )
    return deleted
