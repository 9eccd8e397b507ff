"""Benchmarks of the oracle's hot paths (pytest-benchmark; `nox -s bench` runs them measured).

In the normal test run they execute once each (``--benchmark-disable``) so they cannot rot.
Every benchmark reports blocks per round in ``extra_info`` so the report can give the cost per
block. The reference figure from the foundation issue: vLLM's ``BlockPool``, allocate 16 blocks
and free them reversed, 6.4 us per round (0.4 us a block) on this machine class; the oracle must
stay within 1.5x of it.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvref.hashing import hash_token_blocks
from kvref.oracle import OracleBlockPool

pytestmark = pytest.mark.benchmark_suite

POOL_BLOCKS = 100_000


def test_allocate_16_then_free_reversed(benchmark: Any) -> None:
    pool = OracleBlockPool(POOL_BLOCKS)

    def step() -> None:
        ids = pool.allocate(16)
        pool.free(ids[::-1])

    benchmark.extra_info["blocks_per_round"] = 16
    benchmark(step)
    pool.check_invariants()


def test_allocate_16_then_free_reversed_with_holder_and_generations(benchmark: Any) -> None:
    pool = OracleBlockPool(POOL_BLOCKS)

    def step() -> None:
        ids = pool.allocate(16, holder="req-1")
        pool.free(ids[::-1], holder="req-1", generations=[pool.generation(b) for b in ids[::-1]])

    benchmark.extra_info["blocks_per_round"] = 16
    benchmark(step)


@pytest.mark.parametrize("policy", ["lru", "lru-leaf", "fifo"])
def test_match_16_cached_blocks_then_release(benchmark: Any, policy: str) -> None:
    pool = OracleBlockPool(1024, policy=policy)
    hashes = list(range(1, 17))
    ids = pool.allocate(16)
    pool.register(ids, hashes)
    pool.free(ids[::-1])

    def step() -> None:
        hit = pool.match(hashes, holder="r")
        pool.free(hit[::-1], holder="r")

    benchmark.extra_info["blocks_per_round"] = 16
    benchmark(step)
    assert pool.stats.hits == pool.stats.queries


@pytest.mark.parametrize("policy", ["lru", "lru-leaf", "fifo", "ref-zero"])
def test_request_cycle_with_eviction(benchmark: Any, policy: str) -> None:
    """Each round caches 16 new blocks in a full pool, so every allocation evicts 16."""
    pool = OracleBlockPool(257, policy=policy)
    counter = iter(range(1, 10**9))

    def step() -> None:
        ids = pool.allocate(16, holder="r")
        start = next(counter) * 16
        pool.register(ids, list(range(start, start + 16)))
        pool.free(ids[::-1], holder="r")

    for _ in range(16):
        step()  # fill the cache
    benchmark.extra_info["blocks_per_round"] = 16
    benchmark(step)
    pool.check_invariants()


@pytest.mark.parametrize("batch", [1, 16, 256])
def test_allocate_many_then_free_many(benchmark: Any, batch: int) -> None:
    pool = OracleBlockPool(POOL_BLOCKS)
    holders = list(range(batch))
    counts = [16] * batch

    def step() -> None:
        got = pool.allocate_many(counts, holders=holders)
        pool.free_many([g[::-1] for g in got], holders=holders)

    benchmark.extra_info["blocks_per_round"] = 16 * batch
    benchmark(step)


def test_hash_16_blocks_of_16_tokens(benchmark: Any) -> None:
    tokens = list(range(256))
    benchmark.extra_info["blocks_per_round"] = 16
    result = benchmark(hash_token_blocks, tokens, 16)
    assert len(result) == 16
