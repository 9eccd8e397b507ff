"""Meta-tests: the conformance suite, `ci` profile, catches every planted bug and names its rule.

Each planted bug (``tests/meta/bugs.py``) is the oracle with one bug a real KV-cache manager has
shipped. The whole suite runs on it exactly as on any backend (``kvref conformance --backend
module:Class --profile ci``), in a subprocess, all bugs side by side on the available cores.
The detection runs skip Hypothesis's shrink phase (``--no-shrink``), which only makes a found
failure smaller; one more run checks that shrinking yields a short replay program. A run must
fail, and one of its failures must name the rule the bug breaks: as a bracketed id in the
failure's message, or as the rule of a test that checks at most three rules.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from kvref_conformance.machines import DifferentialMachine
from tests.meta.bugs import EXPECTED
from tests.meta.id_array_bugs import ID_ARRAY_BUGS

ROOT = Path(__file__).resolve().parents[2]


def run_suite(backend: str, results: Path, *extra: str) -> tuple[int, str, dict[str, Any]]:
    """Run ``kvref conformance`` on ``backend``; return exit code, output and the results file."""
    results.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("KVREF_BACKEND", None)
    command = [
        sys.executable,
        "-m",
        "kvref",
        "conformance",
        "--backend",
        backend,
        "--profile",
        "ci",
        "--results",
        str(results),
        *extra,
    ]
    run = subprocess.run(command, cwd=results, env=env, capture_output=True, text=True, timeout=900)
    files = list(results.glob("*.json"))
    return run.returncode, run.stdout + run.stderr, json.loads(files[0].read_text()) if files else {}


def run_each_bug(
    module: str, bugs: Iterable[str], base: Path, *extra: str
) -> dict[str, tuple[int, str, dict[str, Any]]]:
    """Each of ``bugs`` (a backend ``module:bug``) through :func:`run_suite` with ``extra``, its results under
    ``base/bug``, as many at a time as there are cores; each bug's exit code, output and results file."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        futures = {bug: pool.submit(run_suite, f"{module}:{bug}", base / bug, *extra) for bug in bugs}
        return {bug: future.result() for bug, future in futures.items()}


def named_rules(results: dict[str, Any]) -> set[str]:
    """Rules the failures of a results file name."""
    named: set[str] = set()
    for failure in results.get("failures", []):
        if len(failure["rules"]) <= 3:
            named.update(failure["rules"])
        named.update(re.findall(r"\[([A-Z]+-\d{3,4})\]", failure["replay"]))
    return named


@pytest.fixture(scope="module")
def bug_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, dict[str, Any]]]:
    """Every planted bug through the whole suite, as many at a time as there are cores."""
    return run_each_bug("tests.meta.bugs", EXPECTED, tmp_path_factory.mktemp("planted"), "--no-shrink")


@pytest.mark.rule("ERR-502")
@pytest.mark.parametrize(("bug", "rule_id"), sorted(EXPECTED.items()))
def test_the_ci_profile_catches_the_planted_bug_and_names_its_rule(
    bug_runs: dict[str, tuple[int, str, dict[str, Any]]], bug: str, rule_id: str
) -> None:
    code, output, results = bug_runs[bug]
    assert code != 0, f"the suite passed on {bug}, which breaks {rule_id}:\n{output[-2000:]}"
    named = named_rules(results)
    assert rule_id in named, f"the suite caught {bug} but named {sorted(named)}, not {rule_id}"


@pytest.mark.rule("POOL-123")
@pytest.mark.parametrize(("bug", "rule_id"), sorted(ID_ARRAY_BUGS.items()))
def test_the_machines_driving_the_array_forms_catch_the_planted_bug(tmp_path: Path, bug: str, rule_id: str) -> None:
    target = f"tests.meta.id_array_bugs:{bug}"
    code, output, results = run_suite(target, tmp_path, "--no-shrink", "--", "-k", "Stateful and batched_forms")
    assert code != 0, f"the batched machine passed on {bug}, which breaks {rule_id}:\n{output[-2000:]}"
    named = named_rules(results)
    assert rule_id in named, f"the suite caught {bug} but named {sorted(named)}, not {rule_id}"


@pytest.mark.rule("STATE-002")
def test_a_state_machine_failure_shrinks_to_a_short_replay(tmp_path: Path) -> None:
    code, output, results = run_suite("tests.meta.bugs:ScatterFree", tmp_path, "--", "-k", "Stateful and pool_behaves")
    assert code != 0, f"the pool machine missed ScatterFree:\n{output[-2000:]}"
    [failure] = results["failures"]
    assert 0 <= failure["failed_after_seconds"] <= results["seconds"], "when the failure was seen is not in the run"
    replay = failure["replay"]
    rules = {
        name
        for name in dir(DifferentialMachine)
        if hasattr(getattr(DifferentialMachine, name), "hypothesis_stateful_rule")
    }
    steps = [name for name in re.findall(r"state\.(\w+)\(", replay) if name in rules]
    assert "Failing test case" in replay, f"no replay program in the failure:\n{replay[:3000]}"
    assert 0 < len(steps) <= 8, f"replay of {len(steps)} steps, expected a minimal one:\n{replay[:3000]}"
