"""Chapter 11's tiers in the serving replay (TIER-1126..TIER-1130): stores, loads and their times, the
crossover, and the command line's refusals."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvref.contract.errors import InvalidValueError
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager
from kvref.simulation.serving import ServingReplay, ServingWorkload, StepModel
from kvref.simulation.serving.results import ServingResult
from kvref.simulation.serving.runner import ServingPoint, WorkloadSpec, run_point
from kvref.simulation.serving.tiers import TierCascade, TierSpec
from kvref.simulation.serving.workload import ServedRequest

from .test_serving_equivalence import workloads

rule = pytest.mark.rule
SIZE = 4


def replay(requests: list[ServedRequest], tiers: TierCascade | None, *, device: int = 4) -> ServingResult:
    workload = ServingWorkload(tuple(requests), SIZE, "hand-made", outputs_hit=True, fixed_block_size=False)
    manager = RequestManager(OracleBlockPool(device + 1), block_size=SIZE, max_model_len=64)
    return ServingReplay(workload, manager, StepModel(), tiers=tiers).run()


def prompt(first: int) -> tuple[int, ...]:
    return tuple(range(first, first + 12))


@rule("TIER-1127", "TIER-1128")
def test_a_request_evicted_from_the_device_loads_its_prefix_from_the_host_and_waits_for_it() -> None:
    host = TierCascade(
        [TierSpec("host", 16, 0.001, 1.0)], block_size=SIZE, kv_bytes_per_token=1000, prefill_ms_per_token=0.02
    )
    requests = [
        ServedRequest(0, 12, 1, prompt_tokens=prompt(100)),
        ServedRequest(1_000_000, 12, 1, prompt_tokens=prompt(200)),  # evicts the first prompt's blocks
        ServedRequest(2_000_000, 12, 1, prompt_tokens=prompt(100)),
    ]
    result = replay(requests, host)
    (line,) = result.tiers.lines  # type: ignore[union-attr]
    # the second prompt evicted the first's tail blocks (lru), its head stays: the third request hits
    # block 0 on the device and loads block 1 from the host (block 2 holds its last token, REQ-701)
    assert result.token_hits == 4 and (line.requests, line.tokens) == (1, 4), f"hits {result.token_hits}, {line}"
    # 1 ms latency + 1 block of 4,000 bytes at 10**6 bytes/s = 5 ms of load, then one step of 4 tokens
    load_us, step_us = 5_000, 5_000 + 4 * 20
    assert result.ttft_ms.p99 == pytest.approx((load_us + step_us) / 1000), (
        f"[TIER-1128] the third request's first token comes after its load and one step: {result.ttft_ms}"
    )
    assert replay(requests, None).prefill_tokens_saved == 4, "without the host only the device's block is saved"
    slow = TierCascade(
        [TierSpec("host", 16, 0.001, 1000.0)], block_size=SIZE, kv_bytes_per_token=1000, prefill_ms_per_token=0.02
    )
    waited = replay(requests, slow)
    held_us = (waited.mean_blocks_in_use * waited.makespan_ms - result.mean_blocks_in_use * result.makespan_ms) * 1000
    assert held_us == pytest.approx(2 * 999_000, rel=1e-6), (
        f"[TRACE-1039] a load 999 ms longer holds its 2 blocks 999 ms longer: {held_us:,.0f} block-us more"
    )
    assert result.prefill_tokens_saved == 8 and line.hurt == 1, "5 ms to load what 0.08 ms recomputes is slower"


@rule("TIER-1126")
def test_computed_blocks_go_to_the_first_tier_and_its_evictions_to_the_next() -> None:
    tiers = TierCascade(
        [TierSpec("host", 2, 10.0), TierSpec("disk", 4, 1.0, 2.0)],
        block_size=SIZE,
        kv_bytes_per_token=10,
        prefill_ms_per_token=0.02,
    )
    tiers.store("a", [1, 2])
    tiers.finish("a")
    tiers.store("b", [3])
    host, disk = tiers.stores
    assert [host.state(k) for k in (1, 2, 3)] == ["ready", "absent", "ready"], "[TIER-1126] lru evicts the tail, 2"
    assert disk.state(2) == "ready" and disk.state(1) == "absent", "[TIER-1126] the host's eviction goes to disk"
    load = tiers.plan_load([1, 2, 3], 0)
    assert load is not None and load.keys == ((1, 3), (2,)), f"each key from the first tier with it: {load}"


@rule("TIER-1129")
def test_the_crossover_is_the_fewest_blocks_whose_load_beats_their_recompute() -> None:
    tiers = TierCascade(
        [TierSpec("slow", 8, 0.001, 100.0), TierSpec("never", 8, 0.0001)],
        block_size=SIZE,
        kv_bytes_per_token=1000,
        prefill_ms_per_token=10.0,
    )
    # slow: 4 ms a block and 100 ms a load against 40 ms a block recomputed: 2 blocks 108 > 80, 3 blocks 112 < 120
    assert tiers.crossover(0) == 3
    assert tiers.crossover(1) is None, "40 ms a block to load, as long as recomputing it: a load never pays"


@rule("TIER-1129")
def test_a_result_with_tiers_survives_its_json() -> None:
    point = ServingPoint(
        WorkloadSpec("builtin", "chat", 16), 60, "lru", belady=False, tiers=(TierSpec("host", 400, 25.0, 0.05),)
    )
    result = run_point(point)
    assert result.tiers is not None and result.tiers.lines[0].requests > 0, "the host served no request"
    assert ServingResult.from_json(json.loads(json.dumps(result.to_json()))) == result
    assert "tiers" not in ServingPoint(point.workload, 60, "lru").key(), "a point without tiers keeps its old key"
    again = ServingPoint(point.workload, 60, "lru", belady=False)
    assert dataclasses.replace(point, tiers=()).key() == again.key()


@rule("TIER-1130")
@pytest.mark.parametrize(
    "text",
    [
        "host:0:25",
        "host:10:0",
        "host:10:nan",
        ":10:1",
        "host:10",
        "host:10:1:-1",
        "host:ten:1",
        "host:1\u0660:1",
        "host:10:1e-320",
        "host:10:1:1e308",
    ],
)
def test_a_bad_tier_is_refused_naming_its_rule(text: str) -> None:
    with pytest.raises(InvalidValueError, match=r"\[TIER-1130\]"):
        TierSpec.parse(text)


@rule("TIER-1130")
def test_the_command_refuses_a_bad_or_repeated_tier_before_any_replay() -> None:
    for extra in (
        ["--tier", "host:0:25"],
        ["--tier", "a:10:1", "--tier", "a:20:2"],
        ["--kv-bytes-per-token", "0"],
        ["--kv-bytes-per-token", "1024"],  # without a tier it would size nothing
    ):
        run = subprocess.run(
            [sys.executable, "-m", "kvref", "serve-replay", "--capacity", "60", "--no-belady", *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode != 0 and "TIER-1130" in run.stderr, f"{extra}: {run.returncode} {run.stderr[-400:]}"
        assert run.stdout == "", f"{extra}: a replay ran: {run.stdout[:200]}"
    engine = [sys.executable, "-m", "kvref", "serve-replay", "--engine", "vllm", "--tier", "host:10:1"]
    run = subprocess.run(engine, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "--tier" in run.stderr and "TRACE-1050" in run.stderr, run.stderr[-400:]


@rule("TIER-1126", "TIER-1127", "TIER-1128")
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(drawn=workloads(), host=st.integers(1, 12), latency=st.sampled_from([0.0, 0.5, 50.0]))
def test_any_workload_with_a_host_tier_finishes_leaving_no_block_or_pin_behind(
    drawn: tuple[ServingWorkload, int, StepModel, str], host: int, latency: float
) -> None:
    workload, capacity, model, policy = drawn
    results = []
    for tiers in (None, [TierSpec("host", host, 1.0, latency)]):
        cascade = None
        if tiers is not None:
            cascade = TierCascade(
                tiers,
                block_size=workload.block_size,
                kv_bytes_per_token=64,
                prefill_ms_per_token=model.prefill_ms_per_token,
            )
        manager = RequestManager(
            OracleBlockPool(capacity + 1, policy=policy),
            block_size=workload.block_size,
            max_model_len=model.max_model_len,
        )
        replay_ = ServingReplay(workload, manager, model, tiers=cascade)
        results.append(replay_.run())
        cascade_stores = cascade.stores if cascade is not None else []
        for store in cascade_stores:
            store.check_invariants()
            assert all(store.pins(key) == 0 for key in store.resident()), "[TIER-1128] a load left a pin behind"
    plain, tiered = results
    assert tiered.counted_requests + tiered.rejected == plain.counted_requests + plain.rejected
    assert sum(p.num_in_use for p in manager.pools) == 0, "a request kept its blocks after the replay"


@rule("TIER-1129", "TIER-1130")
def test_a_sweep_of_device_and_host_sizes_writes_its_grid_and_heat_map(tmp_path: Path) -> None:
    assert [t.blocks for t in TierSpec.parse_sweep("host:100,400:25:0.05")] == [100, 400]
    with pytest.raises(InvalidValueError, match=r"\[TIER-1130\]"):
        TierSpec.parse_sweep("host:100,100:25")
    command = [sys.executable, "-m", "kvref", "serve-replay", "--policy", "lru", "--no-belady", "--workers", "2"]
    run = subprocess.run(
        [*command, "--capacity", "60", "--capacity", "120", "--tier", "host:100,400:25:0.05", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    summary = (tmp_path / "serving.md").read_text(encoding="utf-8")
    assert "## p90 time to first token by device and host blocks" in summary and "| 400 |" in summary, summary[-800:]
    assert (tmp_path / "serving-tiers.png").stat().st_size > 10_000, "no heat map"
    assert "tier blocks" in run.stdout and run.stdout.count(" host ") >= 4, run.stdout[-1500:]
    searching = subprocess.run(
        [*command[:-2], "--target-ttft-p90", "100", "--tier", "host:100,400:25"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert searching.returncode != 0 and "TIER-1130" in searching.stderr, searching.stderr[-400:]


@rule("TIER-1129")
def test_the_tier_report_counts_only_the_requests_after_the_warm_up() -> None:
    point = ServingPoint(
        WorkloadSpec("builtin", "chat", 16), 60, "lru", belady=False, tiers=(TierSpec("host", 400, 25.0),)
    )
    whole, half = run_point(point), run_point(dataclasses.replace(point, warmup=0.5))
    assert whole.tiers is not None and half.tiers is not None
    assert half.tiers.lines[0].requests < whole.tiers.lines[0].requests, (
        f"[TIER-1129] the warm-up's loads were counted: {half.tiers.lines[0]} against {whole.tiers.lines[0]}"
    )
