"""Chapter 10, serving replay: sweeps on every executor, resumable results files, cache sizing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvref.simulation.serving import ServingResult, StepModel
from kvref.simulation.serving import sweep as sweep_module
from kvref.simulation.serving.runner import ServingPoint, WorkloadSpec, run_point
from kvref.simulation.serving.sizing import SizingAnswer, size_cache
from kvref.simulation.serving.sweep import SweepError, grid, read_results, run_sweep

rule = pytest.mark.rule

CHAT = WorkloadSpec("builtin", "chat", 16)
AGENT = WorkloadSpec("builtin", "agent", 8)


def points() -> list[ServingPoint]:
    return grid([CHAT, AGENT], ["lru", "ref-zero"], [100, 400], model=StepModel(), belady=False)


def counts(results: list[ServingResult]) -> list[tuple[object, ...]]:
    return [r.counts() for r in results]


@rule("TRACE-1041")
def test_a_process_pool_sweep_gives_the_sequential_counts_in_the_points_order() -> None:
    sequential = run_sweep(points(), workers=1)
    pooled = run_sweep(points(), workers=2)
    assert counts(pooled) == counts(sequential)
    assert [(r.capacity, r.policy, r.block_size) for r in pooled] == [
        (p.capacity, p.policy, p.workload.block_size) for p in points()
    ], "results come back in the points' order, whatever order they finished in"


@rule("TRACE-1041")
def test_a_sweep_on_a_local_dask_cluster_of_two_worker_processes_gives_the_sequential_counts() -> None:
    distributed = pytest.importorskip("distributed", reason="the sweep extra (dask[distributed]) is not installed")
    sequential = run_sweep(points(), workers=1)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=40
    ) as cluster:
        on_dask = run_sweep(points(), scheduler=cluster.scheduler_address)
    assert counts(on_dask) == counts(sequential)


@rule("TRACE-1043", "TRACE-1049")
def test_finished_points_are_written_at_once_and_a_rerun_replays_only_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "sweep.jsonl"
    good = points()
    broken = ServingPoint(CHAT, 100, "lru", model=StepModel(), belady=False, backend="no-such-backend")
    with pytest.raises(SweepError, match="1 of 9 points failed"):
        run_sweep([*good, broken], results_file=results, workers=1)
    written = read_results(results)
    assert len(written) == len(good), "every point but the broken one is on file"
    ran: list[ServingPoint] = []

    def counting(point: ServingPoint, **kwargs: Any) -> ServingResult:
        ran.append(point)
        return run_point(point, **kwargs)

    monkeypatch.setattr(sweep_module, "run_point", counting)
    extra = ServingPoint(CHAT, 200, "lru", model=StepModel(), belady=False)
    again = run_sweep([*good, extra], results_file=results, workers=1)
    assert ran == [extra], f"the rerun replayed {len(ran)} points; only the new one was missing"
    assert counts(again[:-1]) == counts(run_sweep(good, workers=1)), "points read back count as replayed ones"


@rule("TRACE-1043")
def test_a_torn_last_line_of_an_interrupted_write_is_ignored(tmp_path: Path) -> None:
    results = tmp_path / "sweep.jsonl"
    point = ServingPoint(CHAT, 300, "fifo", belady=False)
    run_sweep([point], results_file=results, workers=1)
    with results.open("a", encoding="utf-8") as fh:
        fh.write('{"key": "half a li')
    assert list(read_results(results)) == [point.key()]
    record = json.loads(results.read_text(encoding="utf-8").splitlines()[0])
    assert record["key"] == point.key() and record["result"]["capacity"] == 300


def fake_replay(hit_rate_at: dict[int, float]) -> Any:
    """A replay whose token hit rate is ``min(1, capacity / 100)``: the answer to 0.37 is 37."""

    def replay_at(capacity: int) -> ServingResult:
        template = run_point(ServingPoint(CHAT, 2000, "lru", belady=False))
        rate = min(1.0, capacity / 100)
        hit_rate_at[capacity] = rate
        tokens = 100_000
        return ServingResult(
            **{**template.__dict__, "capacity": capacity, "tokens": tokens, "token_hits": round(rate * tokens)}
        )

    return replay_at


@rule("TRACE-1042")
def test_the_search_finds_the_smallest_capacity_meeting_the_target_and_replays_its_neighbour() -> None:
    tried: dict[int, float] = {}
    answer = size_cache(fake_replay(tried), measure="token hit rate", target=0.37, low=1, high=512)
    assert answer.capacity == 37, answer.sentence()
    assert {36, 37} <= set(tried), f"37 meets the target and 36 does not; replayed {sorted(tried)}"
    assert len(tried) <= 12, "bisection over 512 capacities takes about log2(512) replays"
    assert [r.capacity for r in answer.tried] == sorted(tried)


@rule("TRACE-1042")
def test_a_range_whose_bottom_meets_the_target_answers_the_bottom() -> None:
    answer = size_cache(fake_replay({}), measure="token hit rate", target=0.05, low=10, high=90)
    assert answer.capacity == 10


@rule("TRACE-1048")
def test_a_range_whose_top_misses_the_target_says_so_with_the_measure_there() -> None:
    answer = size_cache(fake_replay({}), measure="token hit rate", target=0.95, low=1, high=50)
    assert answer.capacity is None
    assert "no capacity in [1, 50] blocks meets token hit rate >= 0.95" in answer.sentence()
    assert "it is 50.00%" in answer.sentence()


@rule("TRACE-1042")
def test_sizing_the_chat_workload_for_a_p90_ttft_on_real_replays() -> None:
    model = StepModel()

    def replay_at(capacity: int) -> ServingResult:
        return run_point(ServingPoint(CHAT, capacity, "lru", model=model, belady=False))

    answer = size_cache(replay_at, measure="p90 TTFT (ms)", target=100.0, low=57, high=400)
    assert answer.capacity is not None, answer.sentence()
    by = {r.capacity: r for r in answer.tried}
    assert by[answer.capacity].ttft_ms.p90 <= 100.0
    assert answer.capacity == 57 or by[answer.capacity - 1].ttft_ms.p90 > 100.0, "the one below misses the target"
    assert isinstance(answer, SizingAnswer)


@rule("TRACE-1043")
def test_a_worker_that_dies_is_reported_with_how_it_ended_and_the_other_points_finish(tmp_path: Path) -> None:
    """A point that ends its worker process breaks the whole pool: the points left without an answer
    run again alone, so only the one that kills its process fails, named with its exit status."""
    results = tmp_path / "sweep.jsonl"
    dying = grid([CHAT], ["lru"], [64, 114, 200, 400], model=StepModel(), belady=False)
    dying = [
        ServingPoint(
            p.workload, p.capacity, p.policy, model=p.model, belady=False, backend="tests.dying_backends:EndsItsProcess"
        )
        for p in dying
    ]
    with pytest.raises(SweepError) as raised:
        run_sweep(dying, results_file=results, workers=2)
    message = str(raised.value)
    assert "1 of 4 points failed" in message and "exited with status 3" in message, message
    assert "BrokenProcessPool" not in message, message
    assert sorted(r.capacity for r in read_results(results).values()) == [64, 200, 400]


@rule("TRACE-1043")
def test_a_point_out_of_memory_is_said_in_words() -> None:
    point = ServingPoint(
        CHAT, 114, "lru", model=StepModel(), belady=False, backend="tests.dying_backends:RunsOutOfMemory"
    )
    with pytest.raises(SweepError, match="ran out of memory"):
        run_sweep([point], workers=1)
