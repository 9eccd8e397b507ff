"""Each call of a benchmark round timed apart, with its tail: median, mean and 99th percentile.

A median hides a stall that comes every few dozen rounds (a hash table's rebuild, an order's
compaction); the mean and the 99th percentile show it. Two rounds, on any registered backend:

    python scripts/phase_times.py [--backend cupy] [--blocks 100000] [--batch 4096] [--rounds 300] [--lists]

- ``evict``: allocate ``batch`` blocks into a full cache (evicting as many), register them under
  fresh hashes, free them (the ``evict[lru]`` round of ``tests/bench/test_bench_backends.py``);
- ``admit``: admit ``batch`` blocks as requests of 16 (one call), free them last block first (the
  ``admit+free batch`` round), through the array forms where the pool has them (``--lists``: not).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from itertools import count
from typing import Any

import numpy as np

from kvref.config.registry import load_backend


def summary(times: list[float]) -> str:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{statistics.median(ordered):10.1f} {statistics.fmean(ordered):10.1f} {p99:10.1f}"


def timed(phases: dict[str, Callable[[], Any]], rounds: int, warm: int = 20) -> dict[str, list[float]]:
    """Microseconds of each phase per round, in order, after ``warm`` rounds off the clock."""
    out: dict[str, list[float]] = {name: [] for name in phases}
    for r in range(warm + rounds):
        for name, phase in phases.items():
            start = time.perf_counter()
            phase()
            if r >= warm:
                out[name].append((time.perf_counter() - start) * 1e6)
    return out


def evict_round(pool: Any, batch: int) -> dict[str, Callable[[], Any]]:
    ids = pool.allocate(pool.num_usable)
    pool.register(ids, list(range(1, len(ids) + 1)))
    pool.free(ids[::-1])
    starts = count(pool.num_blocks + 1, batch)
    held: list[Any] = []

    def allocate() -> None:
        fresh = pool.allocate_ids if hasattr(pool, "allocate_ids") else pool.allocate
        held[:] = [fresh(batch, holder="r")]

    def register() -> None:
        start = next(starts)
        pool.register(held[0], np.arange(start, start + batch, dtype=np.int64))

    def free() -> None:
        ids = held[0]
        pool.free(ids.flip(0) if hasattr(ids, "flip") else ids[::-1], holder="r")

    return {"allocate (evicting)": allocate, "register": register, "free": free}


def admit_round(pool: Any, batch: int, lists: bool = False) -> dict[str, Callable[[], Any]]:
    per = min(16, batch)
    requests = batch // per
    counts, holders = [per] * requests, list(range(requests))
    backwards = np.arange(batch).reshape(requests, per)[:, ::-1].reshape(-1).copy()
    got: list[Any] = []
    if hasattr(pool, "allocate_many_ids") and not lists:
        ids, _ = pool.allocate_many_ids(counts, holders=holders)
        reverse = backwards
        if type(ids).__module__.startswith("torch"):
            import torch

            reverse = torch.from_numpy(backwards)
        pool.free_many_ids(ids, _, holders=holders)

        def admit() -> None:
            got[:] = list(pool.allocate_many_ids(counts, holders=holders))

        def free() -> None:
            pool.free_many_ids(got[0][reverse], got[1], holders=holders)

        return {"allocate_many_ids": admit, "free_many_ids": free}

    def admit_lists() -> None:
        got[:] = pool.allocate_many(counts, holders=holders)

    def free_lists() -> None:
        pool.free_many([g[::-1] for g in got], holders=holders)

    return {"allocate_many": admit_lists, "free_many": free_lists}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cupy")
    parser.add_argument("--blocks", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--lists", action="store_true", help="admit through lists, as the oracle does")
    args = parser.parse_args()
    backend: Any = load_backend(args.backend)
    print(f"{args.backend}, {args.blocks:,} blocks, batch {args.batch:,}, {args.rounds} rounds; us per call")
    print(f"{'round':6} {'call':20} {'median':>10} {'mean':>10} {'p99':>10}")

    def admit(pool: Any, batch: int) -> dict[str, Callable[[], Any]]:
        return admit_round(pool, batch, args.lists)

    for name, make in (("evict", evict_round), ("admit", admit)):
        pool = backend.create(args.blocks)
        for phase, times in timed(make(pool, args.batch), args.rounds).items():
            print(f"{name:6} {phase:20} {summary(times)}")


if __name__ == "__main__":
    main()
