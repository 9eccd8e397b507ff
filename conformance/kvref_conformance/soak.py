"""Soak: millions of mixed operations on one pool, invariants checked as they go, memory watched.

``python -m kvref_conformance.soak --backend oracle --ops 10000000`` drives one pool of any
registered backend through a seeded mix of the protocol's calls (allocate, register, match,
acquire, free tail first, evicting allocation, reset when idle), runs ``check_invariants`` every
``--check-every`` operations, and samples the process's resident memory and the size of the
pool's own state (the bytes of its arrays, or the entries of its containers). A pool that leaks
grows one of them; the report says whether both stayed flat after the warm-up (the first tenth).
``nox -s soak`` runs 10**7 operations per policy on the oracle and 10**6 on each device backend;
``tests/test_soak.py`` runs 10**5.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from kvref.config.registry import load_backend
from kvref.contract.errors import OutOfBlocksError

__all__ = ["SoakReport", "resident_bytes", "run_soak", "state_size"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: Holders holding blocks at once in the mix: the workload's own state stays bounded.
MAX_HOLDERS = 256


def resident_bytes() -> int:
    """This process's resident memory now (Linux ``/proc/self/statm``), else its peak."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except OSError:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _size_of(value: Any, depth: int) -> int:
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if hasattr(value, "__len__") and hasattr(value, "__iter__") and not isinstance(value, (str, bytes)):
        try:
            return len(value)
        except TypeError:
            return 0
    if depth and hasattr(value, "__dict__"):
        return sum(_size_of(v, depth - 1) for v in vars(value).values())
    return 0


def state_size(pool: Any) -> int:
    """The size of a pool's own state: bytes of its arrays plus entries of its containers, two levels deep."""
    return sum(_size_of(v, 1) for v in vars(pool).values())


@dataclass
class SoakReport:
    """What one soak did and saw; ``flat`` is the verdict on memory and state after the warm-up."""

    backend: str
    policy: str
    num_blocks: int
    ops: int
    seconds: float
    checks: int
    samples: list[tuple[int, int, int]] = field(default_factory=list)  # (ops done, resident bytes, state size)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def ops_per_second(self) -> float:
        """Operations per second of wall time, checks included."""
        return self.ops / self.seconds if self.seconds else 0.0

    def growth(self) -> tuple[int, int]:
        """How much resident memory and state size grew from the end of the warm-up to their peak after it."""
        warm = [s for s in self.samples if s[0] >= self.ops // 10] or self.samples
        base = warm[0]
        return max(s[1] for s in warm) - base[1], max(s[2] for s in warm) - base[2]

    @property
    def flat(self) -> bool:
        """Resident memory grew by at most 10% + 16 MiB and the state by at most 10% + 64 after the warm-up."""
        warm = [s for s in self.samples if s[0] >= self.ops // 10] or self.samples
        rss, state = self.growth()
        return rss <= warm[0][1] // 10 + (16 << 20) and state <= warm[0][2] // 10 + 64

    def to_json(self) -> dict[str, Any]:
        """Every field, the rate and the verdict."""
        out = asdict(self)
        out.update(ops_per_second=self.ops_per_second, flat=self.flat, growth=self.growth())
        return out


def _operations(pool: Any, rng: random.Random, counts: dict[str, int]) -> list[Callable[[], None]]:
    """The mix: each entry is one protocol call (or a skipped one) on live state kept here."""
    held: dict[int, list[int]] = {}
    chains: list[list[int]] = []
    next_hash = [1]
    next_holder = [0]
    caching = "prefix-cache" in pool.capabilities()

    def bump(name: str) -> None:
        counts[name] = counts.get(name, 0) + 1

    def full() -> bool:
        """At most ``MAX_HOLDERS`` hold blocks at once, so a growing state is the pool's doing."""
        if len(held) < MAX_HOLDERS:
            return False
        free()
        return True

    def allocate() -> None:
        if full():
            return
        n = rng.randint(1, 8)
        holder = next_holder[0]
        next_holder[0] += 1
        try:
            blocks = pool.allocate(n, holder=holder)
        except OutOfBlocksError:
            bump("refused")
            return
        held[holder] = list(blocks)
        bump("allocate")
        if caching and rng.random() < 0.7:  # a new chain, whose blocks are found by match later
            hashes = list(range(next_hash[0], next_hash[0] + n))
            next_hash[0] += n
            pool.register(blocks, hashes)
            chains.append(hashes)
            if len(chains) > 512:
                chains.pop(0)
            bump("register")

    def match() -> None:
        if not (caching and chains) or full():
            return
        holder = next_holder[0]
        next_holder[0] += 1
        hit = pool.match(rng.choice(chains), holder=holder)
        if hit:
            held[holder] = list(hit)
        bump("match")

    def acquire() -> None:
        if not held or full():
            return
        source = rng.choice(list(held))
        blocks = held[source][: rng.randint(1, len(held[source]))]
        holder = next_holder[0]
        next_holder[0] += 1
        pool.acquire(blocks, holder=holder)
        held[holder] = list(blocks)
        bump("acquire")

    def free() -> None:
        if not held:
            return
        holder = rng.choice(list(held))
        pool.free(held.pop(holder)[::-1], holder=holder)
        bump("free")

    def reset() -> None:
        if not held and caching and rng.random() < 0.01:
            pool.reset()
            chains.clear()
            bump("reset")

    return [allocate, allocate, match, acquire, free, free, free, reset]


def run_soak(
    backend: str,
    *,
    ops: int,
    policy: str = "lru",
    num_blocks: int = 4096,
    check_every: int = 100_000,
    samples: int = 50,
    seed: int = 0,
    device: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> SoakReport:
    """Run ``ops`` operations on one fresh pool of ``backend``; check invariants and sample memory as it goes."""
    pool: Any = load_backend(backend).create(num_blocks, policy=policy, device=device)
    rng = random.Random(seed)
    report = SoakReport(backend, policy, num_blocks, ops, 0.0, 0)
    mix = _operations(pool, rng, report.counts)
    sample_every = max(1, ops // samples)
    started = time.perf_counter()
    for done in range(1, ops + 1):
        rng.choice(mix)()
        if done % check_every == 0 or done == ops:
            pool.check_invariants()
            report.checks += 1
        if done % sample_every == 0 or done == ops:
            report.samples.append((done, resident_bytes(), state_size(pool)))
            if progress:
                progress(done)
    report.seconds = time.perf_counter() - started
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m kvref_conformance.soak``: one soak per policy given; a JSON line each; 1 when one is not flat."""
    parser = argparse.ArgumentParser(prog="python -m kvref_conformance.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="oracle")
    parser.add_argument("--policy", action="append", help="repeat for several (default: lru)")
    parser.add_argument("--ops", type=float, default=1e6, help="operations per policy (1e7 is fine)")
    parser.add_argument("--blocks", type=int, default=4096)
    parser.add_argument("--check-every", type=float, default=1e5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device")
    args = parser.parse_args(argv)
    failed = False
    for policy in args.policy or ["lru"]:
        report = run_soak(
            args.backend,
            ops=int(args.ops),
            policy=policy,
            num_blocks=args.blocks,
            check_every=int(args.check_every),
            seed=args.seed,
            device=args.device,
        )
        data = report.to_json()
        data.pop("samples")
        print(json.dumps(data), flush=True)
        rss, state = report.growth()
        print(
            f"{args.backend} {policy}: {report.ops:,} ops in {report.seconds:,.1f} s ({report.ops_per_second:,.0f}/s), "
            f"{report.checks} invariant checks, resident {report.samples[0][1] >> 20} MiB -> "
            f"{report.samples[-1][1] >> 20} MiB (+{rss >> 20} MiB after warm-up), state "
            f"{report.samples[0][2]:,} -> {report.samples[-1][2]:,} (+{state:,}), "
            f"{'flat' if report.flat else 'GROWING'}",
            file=sys.stderr,
            flush=True,
        )
        failed |= not report.flat
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
