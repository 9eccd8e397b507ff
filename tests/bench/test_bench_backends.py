"""Benchmarks of every usable backend on the same workloads (pytest-benchmark; `nox -s bench`).

In the normal test run they execute once each (``--benchmark-disable``) so they cannot rot;
``nox -s bench`` measures them side by side and saves ``results/bench.json``, which
``kvref report`` renders with the cost per block and the ratio against the oracle. Each
benchmark records its workload, batch size, pool size and blocks per round in ``extra_info``.

The foundation issue's reference: vLLM's ``BlockPool``, allocate 16 and free them reversed,
6.4 us a round (0.4 us a block) on this machine class; the oracle must stay within 1.5x.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvref.hashing import hash_token_blocks

pytestmark = pytest.mark.benchmark_suite


def describe(benchmark: Any, backend: Any, workload: str, *, blocks: int, batch: int = 1, pool: int = 0) -> None:
    benchmark.extra_info.update(
        backend=backend.name, device=backend.device(), workload=workload, blocks_per_round=blocks,
        batch=batch, pool_blocks=pool,
    )  # fmt: skip


@pytest.mark.parametrize("pool_blocks", [1_000, 100_000])
def test_allocate_16_then_free_reversed(benchmark: Any, backend: Any, pool_blocks: int) -> None:
    pool = backend.create(pool_blocks)

    def step() -> None:
        ids = pool.allocate(16)
        pool.free(ids[::-1])

    describe(benchmark, backend, "allocate+free", blocks=16, pool=pool_blocks)
    benchmark(step)
    assert pool.num_free == pool_blocks - 1


def test_acquire_and_release_16_shared_blocks(benchmark: Any, backend: Any) -> None:
    pool = backend.create(1_000)
    ids = pool.allocate(16, holder="owner")

    def step() -> None:
        pool.acquire(ids, holder="reader")
        pool.free(ids[::-1], holder="reader")

    describe(benchmark, backend, "acquire+free", blocks=16, pool=1_000)
    benchmark(step)


@pytest.mark.parametrize("policy", ["lru", "lru-leaf", "fifo"])
def test_match_16_cached_blocks_then_release(benchmark: Any, backend: Any, policy: str) -> None:
    pool = backend.create(1_024, policy=policy)
    hashes = list(range(1, 17))
    ids = pool.allocate(16)
    pool.register(ids, hashes)
    pool.free(ids[::-1])

    def step() -> None:
        hit = pool.match(hashes, holder="r")
        pool.free(hit[::-1], holder="r")

    describe(benchmark, backend, f"match[{policy}]", blocks=16, pool=1_024)
    benchmark(step)
    assert pool.stats.hits == pool.stats.queries


@pytest.mark.parametrize("policy", ["lru", "lru-leaf", "fifo", "ref-zero"])
def test_request_cycle_with_eviction(benchmark: Any, backend: Any, policy: str) -> None:
    """Each round caches 16 new blocks in a full pool, so every allocation evicts 16."""
    pool = backend.create(257, policy=policy)
    counter = iter(range(1, 10**9))

    def step() -> None:
        ids = pool.allocate(16, holder="r")
        start = next(counter) * 16
        pool.register(ids, list(range(start, start + 16)))
        pool.free(ids[::-1], holder="r")

    for _ in range(16):
        step()  # fill the cache
    describe(benchmark, backend, f"evict[{policy}]", blocks=16, pool=257)
    benchmark(step)


@pytest.mark.parametrize("batch", [1, 16, 256])
def test_allocate_many_then_free_many(benchmark: Any, backend: Any, batch: int) -> None:
    pool = backend.create(100_000)
    holders = list(range(batch))
    counts = [16] * batch

    def step() -> None:
        got = pool.allocate_many(counts, holders=holders)
        pool.free_many([g[::-1] for g in got], holders=holders)

    describe(benchmark, backend, "admit+free batch", blocks=16 * batch, batch=batch, pool=100_000)
    benchmark(step)


def test_hash_16_blocks_of_16_tokens(benchmark: Any) -> None:
    tokens = list(range(256))
    benchmark.extra_info.update(backend="kvref.hashing", workload="hash sha256", blocks_per_round=16)
    result = benchmark(hash_token_blocks, tokens, 16)
    assert len(result) == 16
