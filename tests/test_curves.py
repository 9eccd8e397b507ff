"""The exact LRU hit-rate curve: every capacity in one pass equals a replay at that capacity (TRACE-1023)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvref.cli.main import main
from kvref.config.registry import create_pool
from kvref.simulation.curves import lru_curve
from kvref.simulation.replay import replay
from kvref.simulation.traces import Trace, TraceError, TraceRequest, load_trace
from kvref.simulation.workloads import WORKLOADS, workload_trace

rule = pytest.mark.rule

MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def spread(low: int, high: int, count: int = 16) -> list[int]:
    """``count`` capacities from ``low`` to ``high``, roughly evenly apart on a log scale, both ends in."""
    if high <= low:
        return [low]
    return sorted({round(low * (high / low) ** (i / (count - 1))) for i in range(count)})


def agrees_with_replays(trace: Trace, warmup: float = 0.0) -> None:
    curve = lru_curve(trace, warmup=warmup)
    for capacity in spread(curve.smallest, curve.largest + 3):
        for policy in ("lru", "lru-leaf"):
            replayed = replay(trace, create_pool(capacity + 1, policy=policy), warmup=warmup)
            got = curve.at(capacity)
            assert got == (replayed.block_hits, replayed.token_hits), f"{trace.source} {policy} at {capacity}: {got}"
    assert (curve.blocks, curve.tokens) == (replayed.blocks, replayed.tokens)


@rule("TRACE-1023")
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_the_curve_equals_a_replay_at_16_capacities_of_every_built_in_workload(workload: str) -> None:
    agrees_with_replays(workload_trace(workload, seed=3))


@rule("TRACE-1023", "TRACE-1013")
def test_the_curve_cuts_the_warm_up_as_a_replay_does() -> None:
    agrees_with_replays(workload_trace("chat", seed=1), warmup=0.3)


@rule("TRACE-1023")
@pytest.mark.skipif(not MOONCAKE.exists(), reason="the Mooncake trace lives in ../shared/traces")
def test_the_curve_equals_a_replay_at_16_capacities_of_the_mooncake_conversation_trace() -> None:
    agrees_with_replays(load_trace(MOONCAKE))


@rule("TRACE-1023", "TRACE-1015")
def test_below_the_longest_request_the_curve_refuses_and_says_to_replay() -> None:
    curve = lru_curve(workload_trace("agent"))
    with pytest.raises(TraceError, match=r"\[TRACE-1023\].*below the longest request"):
        curve.at(curve.smallest - 1)


@rule("TRACE-1023", "TRACE-1006")
def test_a_trace_that_is_no_prefix_tree_is_refused() -> None:
    requests = (TraceRequest(0, 32, 1, (1, 2)), TraceRequest(1, 32, 1, (3, 2)))
    with pytest.raises(TraceError, match=r"\[TRACE-1006\]"):
        lru_curve(Trace(requests, 16, "hand-made"))


@rule("TRACE-1023")
def test_replay_curve_prints_doubling_capacities_and_writes_the_whole_curve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    assert main(["replay", "--curve", "--json", "--out", str(tmp_path)]) == 0
    shown = json.loads(capsys.readouterr().out)
    capacities = [p["capacity"] for p in shown["points"]]
    assert capacities[0] == shown["smallest"] and capacities[-1] == shown["largest"], capacities
    written = json.loads((tmp_path / "curve.json").read_text(encoding="utf-8"))
    assert len(written["block_hits"]) == shown["largest"] - shown["smallest"] + 1
    assert (tmp_path / "curve.png").stat().st_size > 1000


@rule("TRACE-1023", "CONF-912")
@pytest.mark.parametrize("clash", [["--capacity", "64"], ["--sweep"], ["--policy", "fifo"], ["--cache", "radix"]])
def test_replay_curve_refuses_what_it_does_not_compute(clash: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--curve", *clash]) == 2
    assert "[TRACE-1023]" in capsys.readouterr().err


@rule("TRACE-1023")
def test_the_peer_check_agrees_on_the_oracle_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    import runpy

    script = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "curve_against_peer.py"))
    assert script["main"](["--backend", "oracle"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 * len(WORKLOADS) and all(line.endswith("agree") for line in lines), lines
