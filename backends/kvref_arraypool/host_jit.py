"""The hash tables' probes compiled for the CPU with numba, where it is installed (the ``jit`` extra).

On NumPy arrays a vectorized probe round costs a dozen array calls of ~1 us each whatever the
batch, so finding 256 keys took some 18 us and inserting them 25 us; a compiled loop over the same
arrays takes ~1 us and ~2 us. :func:`host_kernels` gives the compiled loops, or None where numba
is missing or ``KVREF_HOST_JIT=0`` is set (the tables then probe in vectorized rounds, as on a
GPU). Kernels are compiled on first use and cached on disk (``cache=True``), so a process pays
some 0.3 s the first time it builds a pool on the host, and a fresh checkout ~1 s more once.

The probes are those of :class:`~kvref_arraypool.table.HashTable` exactly: the same home slot
(murmur3's fmix64 steps in int64, arithmetic shifts, wrapping products), linear probing, ``EMPTY``
ending a search, ``TOMB`` skipped by a search and taken by an insert (the compiled delete leaves
none: later keys of the run move back instead). So a table written by one path is read by any other.

numba keys a cached kernel to its own source file only, so the kernels of ``host_jit_pool.py``,
which inline helpers of ``host_jit_kernels.py``, would keep a stale copy of a helper edited
alone: :func:`host_kernels` drops their cache files when the helpers' file is not the one they
were compiled with (a digest kept beside the cache).

The per-holder counts' kernels change pairs one by one in batch order, as
:class:`~kvref_arraypool.holder_counts.HolderCounts`' ``add_one`` and ``sub_one`` do.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["HostKernels", "drop_stale_pool_caches", "host_kernels"]


@dataclass(frozen=True)
class HostKernels:
    """The compiled loops (``kvref_arraypool.host_jit_kernels``); every array is int64.

    A table is passed as its keys, values and ``mask`` (the capacity less one). ``find_slots(tkeys,
    mask, keys, out)``: each key's slot, or -1. ``find_values(tkeys, tvalues, mask, keys, default,
    out)``: each key's value, or ``default``. ``insert(tkeys, tvalues, mask, keys, values)``:
    distinct absent keys, each in the first open slot from its home, in batch order; returns how
    many deleted slots they took. ``delete(tkeys, tvalues, mask, keys)``: distinct present keys
    leave with no tombstone (backward-shift deletion); returns how many it found. ``counts_get``,
    ``counts_add`` and ``counts_sub`` take a :class:`~kvref_arraypool.holder_counts.HolderCounts`'
    arrays, its table's, and the pairs: ``get`` writes each pair's references to ``out``; ``add``
    returns (keys added to the table, deleted slots they took); ``sub`` returns the table keys it
    deleted. ``release_distinct`` and ``pin_distinct`` (:mod:`kvref_arraypool.host_jit_pool`) are a
    pool's ``free`` of distinct blocks and its pin of distinct blocks for one holder; ``register``
    and ``unregister`` its registration of blocks' hashes and their removal.
    """

    find_slots: Any
    find_values: Any
    insert: Any
    delete: Any
    counts_get: Any
    counts_add: Any
    counts_sub: Any
    release_distinct: Any
    pin_distinct: Any
    unregister: Any
    register: Any


@cache
def host_kernels() -> HostKernels | None:
    """The compiled loops (compiled once per process), or None without numba or with ``KVREF_HOST_JIT=0``."""
    if os.environ.get("KVREF_HOST_JIT", "1") == "0":
        return None
    try:
        import numba  # noqa: F401  # the kernels' modules compile with it
    except ImportError:  # numba is not installed: the tables probe in vectorized rounds
        return None
    drop_stale_pool_caches()
    from kvref_arraypool import host_jit_kernels as compiled
    from kvref_arraypool import host_jit_pool as pool

    kernels = HostKernels(
        find_slots=compiled.find_slots,
        find_values=compiled.find_values,
        insert=compiled.insert,
        delete=compiled.delete,
        counts_get=compiled.counts_get,
        counts_add=compiled.counts_add,
        counts_sub=compiled.counts_sub,
        release_distinct=pool.release_distinct,
        pin_distinct=pool.pin_distinct,
        unregister=pool.unregister,
        register=pool.register,
    )
    _warm(kernels)
    return kernels


def drop_stale_pool_caches(here: Path = Path(__file__).parent) -> None:
    """Remove the cached kernels of ``host_jit_pool.py`` when ``host_jit_kernels.py``, whose helpers
    they inline, differs from the file they were compiled with; numba then compiles them afresh.
    Where the package's ``__pycache__`` cannot be written, numba caches elsewhere and nothing is done."""
    cache = here / "__pycache__"
    digest = hashlib.sha256((here / "host_jit_kernels.py").read_bytes()).hexdigest()
    stamp = cache / "host_jit_kernels.digest"
    try:
        if stamp.read_text(encoding="ascii") == digest:
            return
    except OSError:  # no stamp yet: caches from before it may be stale too
        pass
    try:
        for old in cache.glob("host_jit_pool.*.nb[ic]"):
            old.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest, encoding="ascii")
    except OSError:  # not writable: numba caches elsewhere
        pass


def _warm(k: HostKernels) -> None:
    """Call every kernel once on empty batches, with the argument types the pool passes, so that
    numba compiles them (or loads them from its cache) now, when the first pool is built, and not
    inside the first calls a replay or a benchmark times."""
    import numpy as np

    a, t, none = np.full(16, -1, dtype=np.int64), np.zeros(16, dtype=np.int64), np.zeros(0, dtype=np.int64)
    flags, no_flags = np.zeros(16, dtype=np.bool_), np.zeros(0, dtype=np.bool_)
    counts = (a, t, a.copy(), t.copy(), t.copy(), a.copy(), t.copy(), 15)
    k.find_slots(a, 15, none, none.copy())
    k.find_values(a, t, 15, none, -1, none.copy())
    k.insert(a, t, 15, none, none)
    k.delete(a, t, 15, none)
    k.counts_get(*counts, none, none, none.copy())
    k.counts_add(*counts, none, none, none)
    k.counts_sub(*counts, none, none, none)
    k.release_distinct(none, none, 16, a, t, a.copy(), a.copy(), a.copy(), t, 0, t.copy(), t.copy(), 0, 0, *counts)
    k.pin_distinct(none, 0, 16, flags, t, a, a.copy(), a.copy(), a.copy(), *counts, 0)
    k.unregister(
        none,
        a,
        a.copy(),
        a.copy(),
        a.copy(),
        t,
        a.copy(),
        a.copy(),
        a.copy(),
        t.copy(),
        t.copy(),
        0,
        a.copy(),
        t.copy(),
        15,
        a.copy(),
        t.copy(),
        t.copy(),
    )
    k.register(
        none,
        none,
        -1,
        -1,
        16,
        flags,
        t,
        a,
        a.copy(),
        a.copy(),
        a.copy(),
        t.copy(),
        15,
        t.copy(),
        a.copy(),
        t.copy(),
        a.copy(),
        a.copy(),
        t.copy(),
        a.copy(),
        t.copy(),
        0,
        0,
        a.copy(),
        none.copy(),
        no_flags,
    )
