"""kvref report over benchmark runs: cost per block and the ratio against the oracle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvref.cli import main
from kvref.report import load_benchmarks, render_benchmarks


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
