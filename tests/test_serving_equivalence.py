"""Chapter 10, serving replay: shortcuts equal stepping one by one; the same counts on every backend."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvref.config.registry import backend_statuses
from kvref.contract.hashing import hash_token_blocks
from kvref.contract.manager import FULL_ATTENTION, CacheGroup
from kvref.contract.requests import Request
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager
from kvref.simulation.serving import ServedRequest, ServingReplay, ServingWorkload, StepModel
from kvref.simulation.serving.runner import ServingPoint, WorkloadSpec, run_point

rule = pytest.mark.rule


@st.composite
def workloads(draw: st.DrawFn) -> tuple[ServingWorkload, int, StepModel, str]:
    """Small workloads that share prefixes, arrive in bursts (some exactly when a step starts) and grow
    past block boundaries; token-level or named by block ids; some too big to fit."""
    size = draw(st.sampled_from([1, 2, 4, 8]))
    named = draw(st.booleans())
    whole = draw(st.booleans())  # prompts of whole blocks
    systems = [[s * 100 + i for i in range(draw(st.integers(0, 3)) * size)] for s in range(3)]
    step_ms = draw(st.sampled_from([0.0, 0.5, 1.0, 5.0]))
    flat = draw(st.booleans())  # per-token costs of 0: every step lasts step_ms, arrivals land on step starts
    requests: list[ServedRequest] = []
    at = 0
    for n in range(draw(st.integers(1, 12))):
        at += draw(st.sampled_from([0, 0, 500, 1_000, 3_000, 20_000]))
        tail = draw(st.integers(1, 20))
        if whole:
            tail = max(size, tail - tail % size)
        prompt = [*draw(st.sampled_from(systems)), *[10_000 + n * 50 + i for i in range(tail)]]
        output = [20_000 + n * 50 + i for i in range(draw(st.integers(0, 3 * size + 2)))]
        if requests and not named and draw(st.booleans()):  # the next turn: re-sends a prompt and its output
            last = requests[-1]
            turn = range(30_000 + 50 * n, 30_003 + 50 * n)
            prompt = [*(last.prompt_tokens or ()), *(last.output_tokens or ()), *turn]
        if named:
            ids = tuple(hash_token_blocks(prompt, size)) + ((7_000_000 + n,) if len(prompt) % size else ())
            requests.append(ServedRequest(at, len(prompt), len(output), block_ids=ids))
        else:
            requests.append(
                ServedRequest(at, len(prompt), len(output), prompt_tokens=tuple(prompt), output_tokens=tuple(output))
            )
    w = ServingWorkload(tuple(requests), size, "drawn", outputs_hit=not named, fixed_block_size=named)
    model = StepModel(
        max_num_batched_tokens=draw(st.sampled_from([1, 2, 3, 8, 16, 64, 8192])),
        max_num_seqs=draw(st.sampled_from([1, 2, 3, 256])),
        max_model_len=draw(st.sampled_from([24, 4096])),
        step_ms=step_ms,
        prefill_ms_per_token=0.0 if flat else 0.02,
        decode_ms_per_token=0.0 if flat else 0.1,
        preemption=draw(st.sampled_from(["recompute", "pause"])),
    )
    capacity = draw(st.integers(3, 40))
    policy = draw(st.sampled_from(["lru", "lru-leaf", "fifo", "ref-zero"]))
    return w, capacity, model, policy


def run(
    w: ServingWorkload,
    capacity: int,
    model: StepModel,
    policy: str,
    *,
    fast_forward: bool,
    warmup: float = 0.0,
    groups: tuple[CacheGroup, ...] = (FULL_ATTENTION,),
) -> tuple[object, ...]:
    pool = OracleBlockPool(capacity + 1, policy=policy)
    manager = RequestManager(pool, block_size=w.block_size, max_model_len=model.max_model_len, groups=groups)
    result = ServingReplay(w, manager, model, fast_forward=fast_forward, warmup=warmup).run()
    manager.check_invariants()
    assert manager.pool.num_in_use == 0, "every request's blocks are freed by the end"
    return (*result.counts(), result.timeline)


@rule("TRACE-1040")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from([0.0, 0.0, 0.5]), st.sampled_from(["full", "full", "window", "mamba"]))
def test_quiet_stretches_and_skipped_decode_calls_count_exactly_as_stepping_with_every_call(
    case: tuple[ServingWorkload, int, StepModel, str], warmup: float, beside: str
) -> None:
    w, capacity, model, policy = case
    # a window or mamba group frees blocks at tokens that neither open nor fill one
    groups = {
        "full": (FULL_ATTENTION,),
        "window": (FULL_ATTENTION, CacheGroup.window(5)),
        "mamba": (FULL_ATTENTION, CacheGroup.mamba()),
    }[beside]
    quick = run(w, capacity, model, policy, fast_forward=True, warmup=warmup, groups=groups)
    slow = run(w, capacity, model, policy, fast_forward=False, warmup=warmup, groups=groups)
    assert quick == slow, f"with shortcuts {quick}\nstep by step {slow}\n({policy}, {capacity} blocks, {model})"


class CountingManager(RequestManager):
    """The oracle manager, counting allocate_slots calls."""

    allocations = 0

    def allocate_slots(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        self.allocations += 1
        return super().allocate_slots(request, *args, **kwargs)


@rule("TRACE-1040", "TRACE-1035")
def test_a_preempted_request_recomputes_the_outputs_it_had_not_yet_shown_the_manager() -> None:
    # Request 2 re-sends request 1's prompt and output while request 1 still decodes; request 1 is
    # preempted between block boundaries, when its latest outputs are not yet appended (TRACE-1040).
    system = list(range(200, 216))
    second = (*system, *range(10_050, 10_060))
    second_out = tuple(range(20_050, 20_072))

    def req(at: int, prompt: tuple[int, ...], output: tuple[int, ...]) -> ServedRequest:
        return ServedRequest(at, len(prompt), len(output), prompt_tokens=prompt, output_tokens=output)

    w = ServingWorkload(
        (
            req(0, (*system, *range(10_000, 10_008)), (20_000, 20_001)),
            req(5_100, second, second_out),
            req(5_100, (*second, *second_out, 30_100, 30_101), (20_100,)),
            req(8_100, (*range(16), *range(10_150, 10_166)), (20_150, 20_151)),
            req(8_100, (*range(16), *range(10_200, 10_216)), tuple(range(20_200, 20_208))),
        ),
        8,
        "turns",
        outputs_hit=True,
        fixed_block_size=False,
    )
    model = StepModel(max_num_seqs=2, decode_ms_per_token=0.5)
    assert run(w, 9, model, "lru", fast_forward=True) == run(w, 9, model, "lru", fast_forward=False)


@rule("TRACE-1040")
def test_the_shortcuts_make_a_long_decode_cheap() -> None:
    long = ServedRequest(0, 8, 5000, prompt_tokens=tuple(range(8)), output_tokens=tuple(range(100, 5100)))
    w = ServingWorkload((long,), 64, "long", outputs_hit=True, fixed_block_size=False)
    manager = CountingManager(OracleBlockPool(200), block_size=64, max_model_len=8192)
    r = ServingReplay(w, manager, StepModel()).run()
    assert r.steps == 5000, "a step per output token"
    calls = manager.allocations
    assert calls <= 2 * 5000 // 64 + 4, f"{calls} manager calls for 5,000 decode steps: only block boundaries need one"


def small_spec() -> WorkloadSpec:
    return WorkloadSpec("builtin", "chat", 16)


@rule("TRACE-1041")
@pytest.mark.parametrize("backend", [s.name for s in backend_statuses() if s.usable and s.name in ("torch", "cupy")])
def test_every_backend_under_the_manager_counts_as_the_oracle(backend: str) -> None:
    oracle = run_point(ServingPoint(small_spec(), 120, "lru", backend="oracle"))
    other = run_point(ServingPoint(small_spec(), 120, "lru", backend=backend))
    assert other.counts() == oracle.counts(), f"{backend}: {other.counts()}\noracle: {oracle.counts()}"
    assert other.preemptions > 0, "the capacity is small enough that requests are preempted"


@rule("TRACE-1041")
def test_a_replay_is_a_pure_function_of_its_point() -> None:
    point = ServingPoint(small_spec(), 200, "fifo", model=StepModel(preemption="pause"))
    first, second = run_point(point), run_point(dataclasses.replace(point))
    assert first.counts() == second.counts()
    assert first.timeline == second.timeline
