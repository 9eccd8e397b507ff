"""The hash table's probes as numba kernels (imported by :mod:`kvref_arraypool.host_jit` only where numba is).

Each kernel is :class:`~kvref_arraypool.table.HashTable`'s probe for a whole batch, key by key in
batch order; every array is int64 and ``mask`` is the table's capacity less one. Compiled on first
call and cached on disk beside this file.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

__all__ = ["delete", "find_slots", "find_values", "insert"]

_MIX = np.int64(0xFF51AFD7ED558CCD - (1 << 64))  # murmur3's fmix64 constant as a signed int64
_EMPTY = -1
_TOMB = -2


@njit(cache=True, inline="always")
def _home(key: Any, mask: Any) -> Any:  # pragma: no cover - compiled
    """``HashTable._home`` of one key: int64 arithmetic shifts and a wrapping product."""
    x = key ^ (key >> 33)
    x = x * _MIX
    x = x ^ (x >> 33)
    return x & mask


@njit(cache=True)
def find_slots(tkeys: Any, mask: Any, keys: Any, out: Any) -> None:  # pragma: no cover - compiled
    """``out[i]``: the slot of ``keys[i]``, or -1 where it is absent."""
    for i in range(keys.shape[0]):
        key = keys[i]
        slot = _home(key, mask)
        out[i] = -1
        for _ in range(mask + 1):
            seen = tkeys[slot]
            if seen == key:
                out[i] = slot
                break
            if seen == _EMPTY:
                break
            slot = (slot + 1) & mask


@njit(cache=True)
def find_values(tkeys: Any, tvalues: Any, mask: Any, keys: Any, default: Any, out: Any) -> None:  # pragma: no cover
    """``out[i]``: the value of ``keys[i]``, or ``default`` where it is absent."""
    for i in range(keys.shape[0]):
        key = keys[i]
        slot = _home(key, mask)
        out[i] = default
        for _ in range(mask + 1):
            seen = tkeys[slot]
            if seen == key:
                out[i] = tvalues[slot]
                break
            if seen == _EMPTY:
                break
            slot = (slot + 1) & mask


@njit(cache=True)
def insert(tkeys: Any, tvalues: Any, mask: Any, keys: Any, values: Any) -> Any:  # pragma: no cover - compiled
    """Distinct absent keys, each in the first open slot (empty or deleted) from its home, in
    batch order; returns how many deleted slots they took (the caller made room: a slot is open)."""
    tombs = 0
    for i in range(keys.shape[0]):
        slot = _home(keys[i], mask)
        while tkeys[slot] >= 0:
            slot = (slot + 1) & mask
        if tkeys[slot] == _TOMB:
            tombs += 1
        tkeys[slot] = keys[i]
        tvalues[slot] = values[i]
    return tombs


@njit(cache=True)
def delete(tkeys: Any, mask: Any, keys: Any) -> Any:  # pragma: no cover - compiled
    """Distinct present keys become deleted slots; returns how many were found (all, when the
    caller's keys were present)."""
    found = 0
    for i in range(keys.shape[0]):
        key = keys[i]
        slot = _home(key, mask)
        for _ in range(mask + 1):
            seen = tkeys[slot]
            if seen == key:
                tkeys[slot] = _TOMB
                found += 1
                break
            if seen == _EMPTY:
                break
            slot = (slot + 1) & mask
    return found
