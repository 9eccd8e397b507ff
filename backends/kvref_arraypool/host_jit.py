"""The hash table's probes compiled for the CPU with numba, where it is installed (the ``jit`` extra).

On NumPy arrays a vectorized probe round costs a dozen array calls of ~1 us each whatever the
batch, so finding 256 keys took some 18 us and inserting them 25 us; a compiled loop over the same
arrays takes ~1 us and ~2 us. :func:`table_kernels` gives the compiled probes, or None where numba
is missing or ``KVREF_HOST_JIT=0`` is set (the table then probes in vectorized rounds, as on a
GPU). Kernels are compiled on first use and cached on disk (``cache=True``), so a process pays
some 0.3 s the first time it builds a pool on the host, and a fresh checkout ~1 s more once.

The probes are those of :class:`~kvref_arraypool.table.HashTable` exactly: the same home slot
(murmur3's fmix64 steps in int64, arithmetic shifts, wrapping products), linear probing, ``EMPTY``
ending a search, ``TOMB`` skipped by a search and taken by an insert. So a table written by one
path is read by any other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from typing import Any

__all__ = ["TableKernels", "table_kernels"]


@dataclass(frozen=True)
class TableKernels:
    """The compiled probes; every array is int64, ``mask`` is the capacity less one.

    ``find_slots(tkeys, mask, keys, out)``: each key's slot, or -1. ``find_values(tkeys, tvalues,
    mask, keys, default, out)``: each key's value, or ``default``. ``insert(tkeys, tvalues, mask,
    keys, values)``: distinct absent keys, each in the first open slot from its home in batch order;
    returns how many tombstones they took. ``delete(tkeys, mask, keys)``: distinct present keys
    become tombstones; returns how many it found.
    """

    find_slots: Any
    find_values: Any
    insert: Any
    delete: Any


@cache
def table_kernels() -> TableKernels | None:
    """The compiled probes (compiled once per process), or None without numba or with ``KVREF_HOST_JIT=0``."""
    if os.environ.get("KVREF_HOST_JIT", "1") == "0":
        return None
    try:
        from kvref_arraypool import host_jit_kernels as compiled
    except ImportError:  # numba is not installed: the table probes in vectorized rounds
        return None
    return TableKernels(
        find_slots=compiled.find_slots, find_values=compiled.find_values, insert=compiled.insert, delete=compiled.delete
    )
