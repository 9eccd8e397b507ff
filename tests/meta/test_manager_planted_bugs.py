"""Meta-tests of chapter 07: the manager suite catches every planted manager bug and names its rule.

Each bug of ``tests/meta/manager_bugs.py`` runs through ``kvref conformance --backend
tests.meta.manager_bugs:X --profile ci -- -k Manager`` in a subprocess, as any backend would, the
bugs side by side on the available cores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.meta.manager_bugs import MANAGER_BUGS
from tests.meta.test_planted_bugs import named_rules, run_each_bug


@pytest.fixture(scope="module")
def manager_bug_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, dict[str, Any]]]:
    """Every planted manager bug through the manager suite."""
    base = tmp_path_factory.mktemp("manager-bugs")
    return run_each_bug("tests.meta.manager_bugs", MANAGER_BUGS, base, "--no-shrink", "--", "-k", "Manager")


@pytest.mark.rule("ERR-502")
@pytest.mark.parametrize(("bug", "rule_id"), sorted(MANAGER_BUGS.items()))
def test_the_manager_suite_catches_the_planted_bug(
    manager_bug_runs: dict[str, tuple[int, str, dict[str, Any]]], bug: str, rule_id: str, tmp_path: Path
) -> None:
    code, output, results = manager_bug_runs[bug]
    assert code != 0, f"the manager suite passed on {bug}, which breaks {rule_id}:\n{output[-2000:]}"
    named = named_rules(results)
    assert rule_id in named, f"the manager suite caught {bug} but named {sorted(named)}, not {rule_id}"
