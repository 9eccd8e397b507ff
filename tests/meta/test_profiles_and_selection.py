"""Renaming versus exact-order, and a backend that cannot load stopping the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.meta.test_planted_bugs import run_suite


@pytest.mark.rule("POOL-115")
def test_other_ids_pass_through_the_renaming_but_not_under_exact_order(tmp_path: Path) -> None:
    code, output, _ = run_suite(
        "tests.meta.bugs:QueueOrder", tmp_path / "renaming", "--no-shrink", "--", "-k", "Stateful"
    )
    assert code == 0, f"a pool that only picks other ids failed the renaming profile:\n{output[-3000:]}"
    code, output, results = run_suite(
        "tests.meta.bugs:QueueOrderExact", tmp_path / "exact", "--no-shrink", "--", "-k", "Stateful"
    )
    assert code != 0, "exact-order profile accepted ids that differ from the oracle's"
    assert "exact-order profile" in output and results["implementation"]["profile"] == "exact-order"


@pytest.mark.rule("CONF-902")
def test_a_backend_that_cannot_load_stops_the_run_with_the_reason(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "kvref", "conformance", "--backend", "no_such_backend_pkg:Nope"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    assert "cannot load backend 'no_such_backend_pkg:Nope'" in run.stderr + run.stdout
    assert "passed" not in run.stdout, "the suite ran on something else instead of stopping"
