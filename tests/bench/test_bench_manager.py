"""Benchmarks of chapter 07's request-level manager beside vLLM's ``KVCacheManager``: a request churn.

Each round is one request's life as vLLM's scheduler drives it: its computed blocks, the
allocation of its prompt (the full-sequence gate on), the statistics call, 16 decode steps (a
token appended, ``allocate_slots`` of one token) and ``free``. Half the prompts open with one of
eight shared 128-token system prompts, the other half are unique; prompts are 256 tokens in
blocks of 16, the pool has 4000 blocks, so the cache fills and evicts as the rounds go on. The
time of a round is the time per request. kvref's oracle manager runs over each usable backend's
pool; where vLLM imports (``nox -s bench-peers``) its own manager runs the same rounds with its
own requests and hasher (SHA-256, as kvref's default), in the same run.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvref.contract.manager import FULL_ATTENTION, CacheGroup
from kvref.contract.requests import Request
from kvref.oracle.manager import RequestManager

BLOCKS = 4000
BLOCK_SIZE = 16
DECODES = 16
SHARED = [[random.Random(s).randrange(30_000) for _ in range(128)] for s in range(8)]


def vllm_usable() -> bool:
    try:
        from kvref_conformance.peers.vllm.backend import backend

        return backend.availability() is None
    except Exception:  # vLLM absent, or a dependency of it
        return False


def prompts() -> Any:
    """Endless 256-token prompts, half of them opening with a shared system prompt."""
    rng = random.Random(7)
    serial = 0
    while True:
        serial += 1
        tail = [30_000 + (serial * 131 + i) % 20_000 for i in range(128)]
        head = rng.choice(SHARED) if rng.random() < 0.5 else [40_000 + (serial * 17 + i) % 20_000 for i in range(128)]
        yield f"r{serial}", head + tail


class KvrefChurn:
    """One request's life through kvref's manager over ``pool``, with the manager's ``groups``."""

    def __init__(self, pool: Any, groups: tuple[CacheGroup, ...] = (FULL_ATTENTION,)) -> None:
        self.manager = RequestManager(pool, block_size=BLOCK_SIZE, max_model_len=4096, groups=groups)
        self.source = prompts()

    def round(self) -> int:
        rid, tokens = next(self.source)
        m, req = self.manager, Request(rid, tokens, block_size=BLOCK_SIZE)
        hits, computed = m.get_computed_blocks(req)
        got = m.allocate_slots(
            req, req.num_tokens - computed, computed, hits if computed else None, full_sequence_must_fit=True
        )
        assert got is not None, "a 17-block request must fit in 4000 blocks"
        m.record_prefix_cache_stats(req, computed)
        req.num_computed_tokens = req.num_tokens
        for t in range(DECODES):
            req.append_output_token_ids([t])
            m.allocate_slots(req, 1)
            req.num_computed_tokens += 1
        m.free(req)
        return computed


class VllmChurn:
    """The same life through vLLM's own manager, with vLLM requests (peers/vllm/manager.py builds it)."""

    def __init__(self, groups: tuple[CacheGroup, ...] = (FULL_ATTENTION,)) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request as VllmRequest

        from kvref_conformance.peers.vllm.manager import VllmRequestManager

        adapter = VllmRequestManager(BLOCKS, block_size=BLOCK_SIZE, max_model_len=4096, groups=groups)
        self.manager, self.hasher = adapter.manager, adapter.block_hasher
        self.request_class, self.params = VllmRequest, SamplingParams(max_tokens=64)
        self.source = prompts()

    def make(self, rid: str, tokens: list[int]) -> Any:
        """A vLLM request as vLLM's engine builds one."""
        return self.request_class(rid, tokens, self.params, None, block_hasher=self.hasher)

    def round(self) -> int:
        from vllm.v1.request import RequestStatus

        rid, tokens = next(self.source)
        m, req = self.manager, self.make(rid, tokens)
        hits, computed, _ = m.get_computed_blocks(req)
        got = m.allocate_slots(req, req.num_tokens - computed, computed, hits, full_sequence_must_fit=True)
        assert got is not None, "a 17-block request must fit in 4000 blocks"
        m.record_prefix_cache_stats(req, computed)
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = req.num_tokens
        for t in range(DECODES):
            req.append_output_token_ids(t)
            m.allocate_slots(req, 1)
            req.num_computed_tokens += 1
        m.free(req)
        return int(computed)


def describe(benchmark: Any, impl: str) -> None:
    """Name the round for ``kvref report``: one request's life, holding 17 blocks (256 + 16 tokens)."""
    benchmark.extra_info.update(
        backend=impl, workload="manager-churn", blocks=BLOCKS, decodes=DECODES, blocks_per_round=17
    )


@pytest.mark.benchmark_suite
def test_manager_request_churn(benchmark: Any, backend: Any, device: str | None) -> None:
    if "prefix-cache" not in backend.capabilities():
        pytest.skip(f"{backend.name} has no prefix cache for the manager to cache in")
    pool = backend.create(BLOCKS, device=device)
    churn = KvrefChurn(pool)
    describe(benchmark, backend.name)
    benchmark(churn.round)
    hit_tokens = sum(churn.round() for _ in range(20))
    assert hit_tokens > 0, "half the prompts share a system prompt: some must hit"


@pytest.mark.benchmark_suite
@pytest.mark.skipif(not vllm_usable(), reason="vLLM is not installed here (nox -s bench-peers installs it)")
def test_vllm_manager_request_churn(benchmark: Any) -> None:
    churn = VllmChurn()
    describe(benchmark, "vllm-KVCacheManager")  # vLLM's own manager, beside kvref's over each pool
    benchmark(churn.round)
    hit_tokens = sum(churn.round() for _ in range(20))
    assert hit_tokens > 0, "half the prompts share a system prompt: some must hit"
