"""Benchmarks of a scheduler's batched steps: 256 requests grown together, beside vLLM's ``KVCacheManager``.

A round is the life of a batch of :data:`BATCH` requests as a GPU engine's scheduler drives it:
the step that admits them all with 256-token prompts (16 blocks of 16 each), :data:`DECODES`
decode steps of one token for every request (the first opens each request's 17th block) and the
release of them all. kvref's batched step (chapter 07's REQ-750..REQ-756, ``create_block_tables``
of each backend with ``block-tables``) does each step in one call over the block array surface;
vLLM's manager (``nox -s bench-peers``) makes one ``allocate_slots`` per request per step, as
its scheduler does, and one ``free`` per request, with caching off (like for like: the array
surface has no prefix cache, and every prompt here is unique) and on (vLLM's default, which also
hashes and caches each full block). The time of a round over :data:`BATCH` is the time per request.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvref.config.registry import backend_statuses, load_backend

BATCH = 256
PROMPT = 256
BLOCK_SIZE = 16
DECODES = 16
BLOCKS = BATCH * (PROMPT // BLOCK_SIZE + 1) + 64


def vllm_usable() -> bool:
    try:
        from kvref_conformance.peers.vllm.backend import backend

        return backend.availability() is None
    except Exception:  # vLLM absent, or a dependency of it
        return False


def table_backends() -> list[str]:
    """Usable kvref backends with batched block tables."""
    return [s.name for s in backend_statuses() if s.usable and "block-tables" in s.capabilities]


def describe(benchmark: Any, impl: str) -> None:
    """Name the round for ``kvref report``: one batch's life, per request 17 blocks and 17 steps."""
    benchmark.extra_info.update(
        backend=impl, workload="batched-steps", batch=BATCH, decodes=DECODES, requests_per_round=BATCH
    )


@pytest.mark.benchmark_suite
@pytest.mark.parametrize("name", table_backends())
def test_batched_steps_of_256_requests(benchmark: Any, request: pytest.FixtureRequest, name: str) -> None:
    device = request.config.getoption("--kvref-bench-device")
    backend: Any = load_backend(name)
    tables = backend.create_block_tables(
        BLOCKS, max_requests=BATCH, block_size=BLOCK_SIZE, max_blocks=PROMPT // BLOCK_SIZE + 2, device=device
    )
    slots = list(range(BATCH))

    def round_() -> None:
        tables.step(slots, [PROMPT] * BATCH)
        for t in range(1, DECODES + 1):
            tables.step(slots, [PROMPT + t] * BATCH)
        tables.release(slots)
        tables.pool.ops.synchronize()

    describe(benchmark, f"{name}-block-tables")
    benchmark(round_)
    tables.pool.check()
    assert tables.pool.available_blocks() == BLOCKS - 1, "every block came back after the rounds"


class VllmBatch:
    """The same batch through vLLM's own manager: one call per request per step, as its scheduler makes."""

    def __init__(self, *, enable_caching: bool) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request as VllmRequest

        from kvref_conformance.peers.vllm.manager import VllmRequestManager

        adapter = VllmRequestManager(BLOCKS, block_size=BLOCK_SIZE, max_model_len=4096, enable_caching=enable_caching)
        self.manager, self.hasher = adapter.manager, adapter.block_hasher
        self.request_class, self.params = VllmRequest, SamplingParams(max_tokens=64)
        self.serial = 0

    def round(self) -> None:
        from vllm.v1.request import RequestStatus

        m, batch = self.manager, []
        for _ in range(BATCH):  # unique prompts: no request hits another's blocks
            self.serial += 1
            tokens = [(self.serial * 7919 + i) % 50_000 for i in range(PROMPT)]
            req = self.request_class(f"r{self.serial}", tokens, self.params, None, block_hasher=self.hasher)
            assert m.allocate_slots(req, PROMPT) is not None, "the batch fits by construction"
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = PROMPT
            batch.append(req)
        for t in range(DECODES):
            for req in batch:
                req.append_output_token_ids(t)
                m.allocate_slots(req, 1)
                req.num_computed_tokens += 1
        for req in batch:
            m.free(req)


@pytest.mark.benchmark_suite
@pytest.mark.skipif(not vllm_usable(), reason="vLLM is not installed here (nox -s bench-peers installs it)")
@pytest.mark.parametrize("caching", [False, True], ids=["caching-off", "caching-on"])
def test_vllm_batched_steps_of_256_requests(benchmark: Any, caching: bool) -> None:
    batch = VllmBatch(enable_caching=caching)
    describe(benchmark, f"vllm-KVCacheManager-{'caching' if caching else 'no-caching'}")
    benchmark(batch.round)
    assert batch.manager.block_pool.get_num_free_blocks() == BLOCKS - 1, "every block came back after the rounds"
