"""Benchmarks of every usable backend on the same workloads (pytest-benchmark; `nox -s bench`).

The device-backends issue's matrix: allocate+free, match, acquire, eviction and batched
admission, at 1, 16, 256 and 4096 blocks a call, in pools of 1e3, 1e5 and 1e6 blocks, for every
usable backend in one run, so ``kvref report`` can put the oracle beside each backend as ratios.
Device backends are driven through their array forms (``allocate_ids``, ``match_ids``, arrays
in, arrays out), as an engine keeping block tables on the device would; the oracle through lists.

In the normal test run (``--benchmark-disable``) each benchmark executes once so it cannot rot,
and the 1e6-block pools are left to ``nox -s bench``. Each benchmark records its workload, batch,
pool size and blocks per round in ``extra_info``, and checks the pool afterwards, so a benchmark
that silently stopped doing its work fails.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import count
from typing import Any

import numpy as np
import pytest

from kvref.contract.hashing import hash_token_blocks

pytestmark = pytest.mark.benchmark_suite

BATCHES = [1, 16, 256, 4096]
POOLS = [1_000, 100_000, 1_000_000]


def describe(
    benchmark: Any, backend: Any, device: str | None, workload: str, *, blocks: int, batch: int, pool: int
) -> None:
    benchmark.extra_info.update(
        backend=backend.name,
        device=backend.device(device),
        workload=workload,
        blocks_per_round=blocks,
        batch=batch,
        pool_blocks=pool,
    )


class Calls:
    """The fastest spelling of each call for a pool: array forms where the pool has them."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.arrays = hasattr(pool, "allocate_ids")
        self.allocate: Callable[..., Any] = pool.allocate_ids if self.arrays else pool.allocate
        self.match: Callable[..., Any] = pool.match_ids if self.arrays else pool.match

    def reverse(self, ids: Any) -> Any:
        if self.arrays and type(ids).__module__.startswith("torch"):
            return ids.flip(0)
        return ids[::-1]

    def hashes(self, start: int, n: int) -> Any:
        if self.arrays:
            import numpy

            return numpy.arange(start, start + n, dtype=numpy.int64)
        return list(range(start, start + n))


def sizes(batch: int, pool_blocks: int, measuring: bool, *, need: int = 1) -> None:
    if need * batch >= pool_blocks:
        pytest.skip(f"{need} x batch {batch} does not fit a pool of {pool_blocks} blocks")
    if pool_blocks > 100_000 and not measuring:
        pytest.skip("1e6-block pools are measured by `nox -s bench` only")


def needs(backend: Any, *capabilities: str) -> None:
    missing = sorted(set(capabilities) - set(backend.capabilities()))
    if missing:
        pytest.skip(f"{backend.name} lacks {missing}")


def create(backend: Any, device: str | None, pool_blocks: int, **kwargs: Any) -> Any:
    return backend.create(pool_blocks, device=device, **kwargs)


@pytest.mark.parametrize("pool_blocks", POOLS)
@pytest.mark.parametrize("batch", BATCHES)
def test_allocate_then_free_reversed(
    benchmark: Any, backend: Any, device: str | None, measuring: bool, batch: int, pool_blocks: int
) -> None:
    sizes(batch, pool_blocks, measuring)
    pool = create(backend, device, pool_blocks)
    calls = Calls(pool)

    def step() -> None:
        ids = calls.allocate(batch)
        pool.free(calls.reverse(ids))

    describe(benchmark, backend, device, "allocate+free", blocks=batch, batch=batch, pool=pool_blocks)
    step()  # once off the clock: first-use costs (a library's lazy set-up) are not timed
    benchmark(step)
    assert pool.num_free == pool_blocks - 1, "every round must give back what it took"


@pytest.mark.parametrize("pool_blocks", POOLS)
@pytest.mark.parametrize("batch", BATCHES)
def test_match_a_cached_chain_then_release(
    benchmark: Any, backend: Any, device: str | None, measuring: bool, batch: int, pool_blocks: int
) -> None:
    sizes(batch, pool_blocks, measuring)
    needs(backend, "prefix-cache")
    pool = create(backend, device, pool_blocks)
    calls = Calls(pool)
    hashes = calls.hashes(1, batch)
    ids = pool.allocate(batch)
    pool.register(ids, hashes)
    pool.free(ids[::-1])

    def step() -> None:
        hit = calls.match(hashes, holder="r")
        pool.free(calls.reverse(hit), holder="r")

    describe(benchmark, backend, device, "match+free", blocks=batch, batch=batch, pool=pool_blocks)
    step()  # once off the clock: first-use costs (a library's lazy set-up) are not timed
    benchmark(step)
    assert pool.stats.hits == pool.stats.queries > 0, "every query of the cached chain must hit"


@pytest.mark.parametrize("pool_blocks", POOLS)
@pytest.mark.parametrize("batch", BATCHES)
def test_acquire_blocks_another_request_holds_then_release(
    benchmark: Any, backend: Any, device: str | None, measuring: bool, batch: int, pool_blocks: int
) -> None:
    sizes(batch, pool_blocks, measuring)
    pool = create(backend, device, pool_blocks)
    calls = Calls(pool)
    owned = calls.allocate(batch, holder="owner")
    back = calls.reverse(owned)

    def step() -> None:
        pool.acquire(owned, holder="reader")
        pool.free(back, holder="reader")

    describe(benchmark, backend, device, "acquire+free", blocks=batch, batch=batch, pool=pool_blocks)
    step()  # once off the clock: first-use costs (a library's lazy set-up) are not timed
    benchmark(step)
    assert pool.holder_references("reader") == 0 and pool.holder_references("owner") == batch


@pytest.mark.parametrize("pool_blocks", POOLS)
@pytest.mark.parametrize("batch", BATCHES)
def test_allocate_into_a_full_cache_evicting_as_many(
    benchmark: Any, backend: Any, device: str | None, measuring: bool, batch: int, pool_blocks: int
) -> None:
    """Every block is cached; each round allocates ``batch`` (evicting as many, lru), registers, releases."""
    sizes(batch, pool_blocks, measuring, need=2)
    needs(backend, "prefix-cache", "policy-lru")
    pool = create(backend, device, pool_blocks)
    calls = Calls(pool)
    ids = pool.allocate(pool.num_usable)
    pool.register(ids, calls.hashes(1, len(ids)))
    pool.free(ids[::-1])
    starts = count(pool_blocks + 1, batch)

    def step() -> None:
        fresh = calls.allocate(batch, holder="r")
        pool.register(fresh, calls.hashes(next(starts), batch))
        pool.free(calls.reverse(fresh), holder="r")

    describe(benchmark, backend, device, "evict[lru]", blocks=batch, batch=batch, pool=pool_blocks)
    before = pool.stats.evictions
    step()  # once off the clock: first-use costs (a library's lazy set-up) are not timed
    benchmark(step)
    assert pool.num_free == 0 and pool.stats.evictions > before, "each round must evict into a full cache"


@pytest.mark.parametrize("pool_blocks", POOLS)
@pytest.mark.parametrize("batch", BATCHES)
def test_admit_a_batch_of_requests_then_free_them(
    benchmark: Any, backend: Any, device: str | None, measuring: bool, batch: int, pool_blocks: int
) -> None:
    """``batch`` blocks a round as requests of 16 blocks (one request of ``batch`` below 16)."""
    sizes(batch, pool_blocks, measuring)
    needs(backend, "batching")
    pool = create(backend, device, pool_blocks)
    per = min(16, batch)
    requests = batch // per
    holders = list(range(requests))
    counts = [per] * requests

    if hasattr(pool, "allocate_many_ids"):  # the array forms: ids end to end, each entry freed last block first
        got, offsets = pool.allocate_many_ids(counts, holders=holders)
        backwards = np.arange(batch).reshape(requests, per)[:, ::-1].reshape(-1)
        reverse = index_like(got, backwards)

        def step() -> None:
            ids, offsets = pool.allocate_many_ids(counts, holders=holders)
            pool.free_many_ids(ids[reverse], offsets, holders=holders)

        pool.free_many_ids(got, offsets, holders=holders)
    else:

        def step() -> None:
            got = pool.allocate_many(counts, holders=holders)
            pool.free_many([g[::-1] for g in got], holders=holders)

    describe(benchmark, backend, device, "admit+free batch", blocks=batch, batch=batch, pool=pool_blocks)
    step()  # once off the clock: first-use costs (a library's lazy set-up) are not timed
    benchmark(step)
    assert pool.num_free == pool_blocks - 1, "every admitted request must be freed"


def index_like(like: Any, values: np.ndarray) -> Any:
    """``values`` as an index for ``like``: a tensor or CuPy array on its device when ``like`` is one."""
    library = type(like).__module__.split(".")[0]
    if library == "torch":
        import torch

        return torch.from_numpy(values.copy()).to(like.device)
    if library == "cupy":
        import cupy

        return cupy.asarray(values)
    return values


def test_hash_16_blocks_of_16_tokens(benchmark: Any) -> None:
    tokens = list(range(256))
    benchmark.extra_info.update(backend="kvref.contract.hashing", workload="hash sha256", blocks_per_round=16)
    result = benchmark(hash_token_blocks, tokens, 16)
    assert len(result) == 16
