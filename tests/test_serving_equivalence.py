"""Chapter 10, serving replay: shortcuts equal stepping one by one; the same counts on every backend."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvref.config.registry import backend_statuses
from kvref.contract.requests import Request
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager
from kvref.simulation.serving import ServedRequest, ServingReplay, ServingWorkload, StepModel
from kvref.simulation.serving.runner import ServingPoint, WorkloadSpec, run_point

rule = pytest.mark.rule


@st.composite
def workloads(draw: st.DrawFn) -> tuple[ServingWorkload, int, StepModel, str]:
    """Small workloads that share prefixes, arrive in bursts and grow past block boundaries."""
    size = draw(st.sampled_from([2, 4, 8]))
    systems = [[s * 100 + i for i in range(draw(st.integers(0, 3 * size)))] for s in range(3)]
    requests = []
    at = 0
    for n in range(draw(st.integers(1, 12))):
        at += draw(st.sampled_from([0, 0, 500, 3_000, 20_000]))
        prompt = [*draw(st.sampled_from(systems)), *[10_000 + n * 50 + i for i in range(draw(st.integers(1, 20)))]]
        output = [20_000 + n * 50 + i for i in range(draw(st.integers(0, 3 * size + 2)))]
        requests.append(
            ServedRequest(at, len(prompt), len(output), prompt_tokens=tuple(prompt), output_tokens=tuple(output))
        )
    w = ServingWorkload(tuple(requests), size, "drawn", outputs_hit=True, fixed_block_size=False)
    model = StepModel(
        max_num_batched_tokens=draw(st.sampled_from([2, 3, 8, 16, 64, 8192])),
        max_num_seqs=draw(st.sampled_from([1, 2, 3, 256])),
        step_ms=draw(st.sampled_from([0.0, 0.5, 5.0])),
        preemption=draw(st.sampled_from(["recompute", "pause"])),
    )
    capacity = draw(st.integers(3, 40))
    policy = draw(st.sampled_from(["lru", "lru-leaf", "fifo", "ref-zero"]))
    return w, capacity, model, policy


def run(w: ServingWorkload, capacity: int, model: StepModel, policy: str, *, fast_forward: bool) -> tuple[object, ...]:
    manager = RequestManager(OracleBlockPool(capacity + 1, policy=policy), block_size=w.block_size, max_model_len=4096)
    result = ServingReplay(w, manager, model, fast_forward=fast_forward).run()
    manager.check_invariants()
    assert manager.pool.num_in_use == 0, "every request's blocks are freed by the end"
    return (*result.counts(), result.timeline)


@rule("TRACE-1040")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_quiet_stretches_and_skipped_decode_calls_count_exactly_as_stepping_with_every_call(
    case: tuple[ServingWorkload, int, StepModel, str],
) -> None:
    w, capacity, model, policy = case
    quick = run(w, capacity, model, policy, fast_forward=True)
    slow = run(w, capacity, model, policy, fast_forward=False)
    assert quick == slow, f"with shortcuts {quick}\nstep by step {slow}\n({policy}, {capacity} blocks, {model})"


class CountingManager(RequestManager):
    """The oracle manager, counting allocate_slots calls."""

    allocations = 0

    def allocate_slots(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        self.allocations += 1
        return super().allocate_slots(request, *args, **kwargs)


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
