"""kvref report over benchmark runs: cost per block and the ratio against the oracle."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest

from kvref.cli import main
from kvref.reports.summary import load_benchmarks, render_benchmarks

#: A run recorded on this machine, as pytest-benchmark and kvref's bench set-up name it.
HERE = {"node": platform.node(), "kvref_platform": platform.platform()}


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
        "machine_info": {"python_version": "3.11.7", "kvref_packages": {"kvref": "0.1.0"}, **HERE},
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
    (tmp_path / "bench.json").write_text(json.dumps({"machine_info": HERE, "benchmarks": benches}), encoding="utf-8")
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


def conformance_file(name: str, device: str, machine: dict[str, str] | None) -> dict[str, object]:
    """A conformance results file of one passing rule, recorded on ``machine`` (None: a file that does not say)."""
    doc: dict[str, object] = {
        "format": 1,
        "implementation": {"name": name, "version": "1", "device": device, "profile": "exact-order"},
        "hypothesis_profile": "ci",
        "summary": {"passed": 1},
        "chapters": {"01-pool": {"status": "pass", "covered": 1, "total": 1, "rules": {"POOL-105": "pass"}}},
        "rules": {"POOL-105": {"status": "pass", "chapter": "01-pool"}},
        "failures": [],
        "state_machines": {f"{name}:pool[lru]": {"seconds": 1.0, "steps": 100, "steps_per_second": 100}},
    }
    if machine is not None:
        doc["machine"] = machine
    return doc


@pytest.mark.rule("CONF-912")
def test_report_leaves_out_another_machines_runs_unless_asked_and_then_never_in_one_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    here = {"node": platform.node(), "platform": platform.platform()}
    gpu = {"node": "gpu-host", "platform": "Linux-gpu"}
    for name, device, machine in (("oracle", "host", here), ("cupy", "cuda:0", gpu), ("torch", "cuda:0", None)):
        (tmp_path / f"{name}.json").write_text(json.dumps(conformance_file(name, device, machine)))
    assert main(["report", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "| chapter | oracle |" in captured.out and "cupy" not in captured.out, captured.out
    assert "left out" in captured.err and "cupy.json" in captured.err and "torch.json" in captured.err
    assert "gpu-host (Linux-gpu)" in captured.err and "an unnamed machine" in captured.err, captured.err
    assert main(["report", str(tmp_path), "--all-machines"]) == 0
    text = capsys.readouterr().out
    headers = [line for line in text.splitlines() if line.startswith("| chapter |")]
    assert headers == ["| chapter | oracle |", "| chapter | torch |", "| chapter | cupy |"], headers
    assert f"# kvref conformance matrix on {platform.node()}" in text and "on gpu-host (Linux-gpu)" in text
