"""kvref report over benchmark runs: cost per block and the ratio against the oracle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvref.cli import main
from kvref.reports.summary import load_benchmarks, render_benchmarks


def bench(name: str, backend: str, median: float, blocks: int) -> dict[str, object]:
    return {
        "name": f"{name}[{backend}]",
        "params": {"backend": backend},
        "extra_info": {"backend": backend, "workload": name, "blocks_per_round": blocks},
        "stats": {"median": median},
    }


@pytest.mark.rule("CONF-906")
def test_benchmarks_render_per_block_costs_and_ratios_against_the_oracle(tmp_path: Path) -> None:
    run = {
        "machine_info": {"python_version": "3.11.7", "kvref_packages": {"kvref": "0.1.0"}},
        "benchmarks": [bench("allocate+free", "oracle", 8e-6, 16), bench("allocate+free", "torch", 2e-6, 16)],
    }
    (tmp_path / "bench.json").write_text(json.dumps(run))
    text = render_benchmarks(load_benchmarks([tmp_path]))
    assert "| allocate+free | 8.00, 0.500, 1.00 | 2.00, 0.125, 0.25 |" in text, text
    out = tmp_path / "report.md"
    assert main(["report", str(tmp_path), "--out", str(out)]) == 0
    assert "kvref benchmarks" in out.read_text()


def matrix_bench(workload: str, backend: str, batch: int, pool: int, us_per_block: float) -> dict[str, object]:
    return {
        "name": f"test_{workload}[{backend}-{batch}-{pool}]",
        "params": {"backend": backend, "batch": batch, "pool_blocks": pool},
        "stats": {"median": us_per_block * batch / 1e6},
        "extra_info": {
            "backend": backend,
            "workload": workload,
            "blocks_per_round": batch,
            "batch": batch,
            "pool_blocks": pool,
        },
    }


@pytest.mark.rule("CONF-906")
def test_report_with_out_plots_each_benchmark_run_and_renders_replay_files(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    benches = [
        matrix_bench(w, b, batch, 1000, cost)
        for w in ("allocate+free", "match+free")
        for b, cost in (("oracle", 0.3), ("cupy", 0.05))
        for batch in (1, 16, 256)
    ]
    (tmp_path / "bench.json").write_text(json.dumps({"machine_info": {}, "benchmarks": benches}), encoding="utf-8")
    replay_dir = tmp_path / "replay"
    assert main(["replay", "--capacity", "32", "--policy", "lru", "--out", str(replay_dir), "--json"]) == 0
    out = tmp_path / "report" / "report.md"
    assert main(["report", str(tmp_path / "bench.json"), str(replay_dir), "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    for png in ("bench-bench-cost.png", "bench-bench-ratio.png"):
        assert (out.parent / png).stat().st_size > 1000, f"kvref report --out did not draw {png}"
        assert f"({png})" in text, f"the report does not link {png}"
    assert "# kvref replays" in text and "| oracle | fused | lru | 32 |" in text, "the replay file is not in the report"


@pytest.mark.rule("ERR-502")
def test_a_long_state_machine_failure_keeps_the_assertion_that_names_the_rule(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from kvref_conformance.results import ResultsRecorder, describe
    from kvref_conformance.target import Target

    program = "\n".join(f"E       state.step_{i}()" for i in range(2000))  # an unshrunk replay, far over the limit
    longrepr = (
        f"    assert evicted == spec\nE       AssertionError: [EVICT-408] evicted 0, the spec evicts 1\n\n"
        f"Failing test case: <state machine>\n{program}\n"
    )
    report = SimpleNamespace(when="call", skipped=False, outcome="failed", failed=True, longrepr=longrepr)
    recorder = ResultsRecorder(tmp_path, "ci")
    recorder.record(describe(Target.from_backend("oracle")), "t::test", ["EVICT-408"], report)
    [failure] = recorder.summarize("oracle")["failures"]
    replay = failure["replay"]
    assert "[EVICT-408] evicted 0" in replay, f"the clipped report lost the assertion message:\n{replay[:500]}"
    assert "Failing test case" in replay and len(replay) <= 6000, f"replay of {len(replay)} chars:\n{replay[:500]}"
