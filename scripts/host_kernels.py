"""The CPU path's compiled kernels against the array path a GPU runs, call by call, on NumPy.

Builds two pools of ``--blocks`` blocks on NumPy, one with numba's kernels (``compiled=True``, the
default where the ``jit`` extra is installed) and one without (the array path, as on a device),
drives both through the same rounds and prints the median microseconds per call:

    python scripts/host_kernels.py [--blocks 100000] [--batches 16,256,1024,4096] [--rounds 200]

Each round of the eviction workload allocates ``batch`` blocks into a full cache (evicting as many),
registers them under fresh hashes and frees them; the acquire workload pins ``batch`` blocks another
holder holds and frees them. Times are per call, so the table says which call the kernels helped.
"""

from __future__ import annotations

import argparse
import statistics
import time
from itertools import count

import numpy as np
from kvref_arraypool.host_jit import host_kernels
from kvref_arraypool.ops import NumpyLikeOps
from kvref_arraypool.pool import ArrayBlockPool


def pool_of(blocks: int, compiled: bool) -> ArrayBlockPool:
    return ArrayBlockPool(blocks, ops=NumpyLikeOps(np, device="host", is_device=False, compiled=compiled))


class Clock:
    """Microseconds per named call, kept after a warm-up (numba compiling or loading its kernels)."""

    def __init__(self, *names: str) -> None:
        self.times: dict[str, list[float]] = {name: [] for name in names}
        self.start = 0.0

    def __enter__(self) -> Clock:
        self.start = time.perf_counter()
        return self

    def stop(self, name: str) -> None:
        now = time.perf_counter()
        self.times[name].append((now - self.start) * 1e6)
        self.start = now

    def __exit__(self, *_: object) -> None:
        pass

    def forget(self) -> None:
        for t in self.times.values():
            t.clear()

    def medians(self) -> dict[str, float]:
        return {name: statistics.median(t) for name, t in self.times.items()}


def eviction(blocks: int, batch: int, rounds: int, compiled: bool) -> dict[str, float]:
    pool = pool_of(blocks, compiled)
    ids = pool.allocate(pool.num_usable)
    pool.register(ids, list(range(1, len(ids) + 1)))
    pool.free(ids[::-1])
    starts = count(blocks + 1, batch)
    clock = Clock("evicting allocate", "register", "free")
    for i in range(rounds + 20):
        first = next(starts)
        hashes = np.arange(first, first + batch, dtype=np.int64)
        with clock:
            fresh = pool.allocate_ids(batch, holder="r")
            clock.stop("evicting allocate")
            pool.register(fresh, hashes)
            clock.stop("register")
            pool.free(fresh[::-1], holder="r")
            clock.stop("free")
        if i < 20:
            clock.forget()
    return clock.medians()


def acquiring(blocks: int, batch: int, rounds: int, compiled: bool) -> dict[str, float]:
    pool = pool_of(blocks, compiled)
    owned = pool.allocate_ids(batch, holder="owner")
    back = owned[::-1]
    clock = Clock("acquire (shared)", "free (shared)")
    for i in range(rounds + 20):
        with clock:
            pool.acquire(owned, holder="reader")
            clock.stop("acquire (shared)")
            pool.free(back, holder="reader")
            clock.stop("free (shared)")
        if i < 20:
            clock.forget()
    return clock.medians()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=100_000)
    parser.add_argument("--batches", default="16,256,1024,4096")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    if host_kernels() is None:
        raise SystemExit("numba is not installed (pip install 'kvref[jit]'), or KVREF_HOST_JIT=0 is set")
    print("| call | batch | array path us | compiled us | ratio |")
    print("|---|---|---|---|---|")
    for batch in (int(b) for b in args.batches.split(",")):
        for workload in (eviction, acquiring):
            plain = workload(args.blocks, batch, args.rounds, False)
            fast = workload(args.blocks, batch, args.rounds, True)
            for name in plain:
                print(f"| {name} | {batch} | {plain[name]:,.1f} | {fast[name]:,.1f} | {fast[name] / plain[name]:.2f} |")


if __name__ == "__main__":
    main()
