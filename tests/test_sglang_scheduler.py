"""Chapter 10, the serving replay on SGLang's own scheduler (TRACE-1054, TRACE-1055): what it refuses
before any work, and (where SGLang is installed: ``nox -s peer-sglang``) what SGLang's scheduler
decides, read from its own objects, beside kvref's replay on the same arrivals."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys

import pytest

from kvref.contract.errors import InvalidValueError
from kvref.contract.manager import FULL_ATTENTION, CacheGroup
from kvref.simulation.serving import ServedRequest, ServingWorkload, StepModel, serving_workload
from kvref.simulation.serving.comparison import compare_with_engine, engine_replay

rule = pytest.mark.rule
HAS_SGLANG = importlib.util.find_spec("sglang") is not None
needs_sglang = pytest.mark.skipif(not HAS_SGLANG, reason="SGLang is not installed (nox -s peer-sglang runs these)")


def kvref_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvref", *args], capture_output=True, text=True, timeout=300)


def chat(requests: int = 120) -> ServingWorkload:
    workload = serving_workload("chat", seed=3, block_size=16)
    return dataclasses.replace(workload, requests=workload.requests[:requests])


def repeated_prompt(length: int, block_size: int = 16) -> ServingWorkload:
    """Two requests with one prompt of ``length`` tokens, the second arriving long after the first ends."""
    prompt = tuple(range(1000, 1000 + length))
    first = ServedRequest(arrival_us=0, prompt_length=length, output_length=4, prompt_tokens=prompt)
    second = dataclasses.replace(first, arrival_us=10_000_000)
    return ServingWorkload(
        requests=(first, second),
        block_size=block_size,
        source="two equal prompts",
        outputs_hit=False,
        fixed_block_size=False,
    )


# ---------------------------------------------------------------- refused before any work, anywhere


@rule("TRACE-1054")
@pytest.mark.parametrize(
    "flags", [["--sliding-window", "128"], ["--mamba"], ["--events", "e.msgpack"], ["--snapshot", "s.jsonl"]]
)
def test_what_only_vllm_s_replay_takes_is_refused_for_sglang_before_any_work(flags: list[str]) -> None:
    done = kvref_command("serve-replay", "--engine", "sglang", *flags)
    assert done.returncode == 2
    assert "TRACE-1054" in done.stderr
    assert "--engine vllm" in done.stderr
    assert "Traceback" not in done.stderr


@rule("TRACE-1054")
@pytest.mark.parametrize("flags", [["--preemption", "pause"], ["--policy", "lru-leaf"], ["--tier", "host:100:10"]])
def test_what_sglang_s_scheduler_cannot_be_asked_is_refused_before_any_work(flags: list[str]) -> None:
    done = kvref_command("serve-replay", "--engine", "sglang", *flags)
    assert done.returncode == 2
    assert "TRACE-1054" in done.stderr
    assert "SGLang's own scheduler" in done.stderr
    assert "Traceback" not in done.stderr


@rule("TRACE-1054")
@pytest.mark.skipif(HAS_SGLANG, reason="SGLang is installed here")
def test_the_sglang_engine_without_sglang_says_how_to_install_it() -> None:
    done = kvref_command("serve-replay", "--engine", "sglang", "--capacity", "100")
    assert done.returncode == 2
    assert "pip install --no-deps sglang" in done.stderr
    assert "Traceback" not in done.stderr


@rule("TRACE-1054")
def test_a_window_group_on_sglang_is_refused_by_the_replay_itself() -> None:
    with pytest.raises(InvalidValueError, match="TRACE-1054"):
        engine_replay("sglang", chat(4), 100, StepModel(), groups=(FULL_ATTENTION, CacheGroup.window(128)))


@rule("TRACE-1050")
def test_an_engine_kvref_does_not_drive_is_refused() -> None:
    with pytest.raises(InvalidValueError, match="TRACE-1050"):
        engine_replay("trtllm", chat(4), 100, StepModel())


# ---------------------------------------------------------------- SGLang's own scheduler (nox -s peer-sglang)


@needs_sglang
@rule("TRACE-1055")
@pytest.mark.parametrize(("length", "cached"), [(50, 48), (48, 32), (16, 0)])
def test_a_repeated_prompt_hits_the_whole_pages_before_its_last_token_on_sglang_as_on_kvref(
    length: int, cached: int
) -> None:
    comparison = compare_with_engine("sglang", repeated_prompt(length), 100, StepModel())
    assert comparison.requests == 2
    assert comparison.cached_equal == 2, comparison.differences
    assert comparison.engine.token_hits == cached


@needs_sglang
@rule("TRACE-1054")
@rule("TRACE-1055")
@pytest.mark.parametrize("capacity", [60, 5000])
def test_sglang_s_records_add_up_to_its_own_counts(capacity: int) -> None:
    workload = chat()
    replay = engine_replay("sglang", workload, capacity, StepModel())
    result = replay.run()
    records = replay.records()
    assert len(records) == len(workload.requests) - result.rejected
    assert sum(r.cached_tokens for r in records) == result.token_hits
    assert sum(r.preemptions for r in records) == result.preemptions
    steps = [r.first_token_step for r in records]
    assert min(steps) >= 1 and max(steps) <= result.steps
    assert result.peak_blocks_in_use <= capacity
    if capacity == 60:
        assert result.evictions > 0, "a small cache evicts"
    else:
        assert result.evictions == 0, "an ample cache never evicts"


@needs_sglang
@rule("TRACE-1054")
def test_without_prefix_caching_sglang_hits_nothing() -> None:
    result = engine_replay("sglang", chat(60), 200, StepModel(), prefix_caching=False).run()
    assert result.token_hits == 0
    assert result.evictions == 0


@needs_sglang
@rule("TRACE-1056")
def test_compare_on_sglang_prints_the_table_and_exits_0_though_the_models_differ() -> None:
    done = kvref_command("serve-replay", "--engine", "sglang", "--compare", "--capacity", "60")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "against SGLang's scheduler" in done.stdout
    assert "SGLang hits" in done.stdout
    assert "TRACE-1056" in done.stderr  # differences are said, not failed
