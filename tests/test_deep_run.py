"""The deep run (``scripts/deep_run.py``, ``nox -s deep``): what it runs, how it stops, what it reports."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any

import pytest

DEEP_RUN = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "deep_run.py"))


def test_every_state_machine_test_of_the_suite_gets_a_run_of_its_own() -> None:
    machines = DEEP_RUN["machine_tests"]()
    for name in (
        "test_the_pool_behaves_like_the_oracle",
        "test_the_prefix_cache_behaves_like_the_oracle",
        "test_scheduler_traffic_matches_the_oracle",
        "test_random_calls_behave_like_the_oracle",
        "test_scheduler_traffic_keeps_slots_honest_and_conserved",
    ):
        assert name in machines
    assert "test_a_failed_store_leaves_nothing_behind" not in machines
    labels, selections = zip(*DEEP_RUN["run_units"](), strict=True)
    assert labels[0] == "every other test" and all(name in selections[0] for name in machines)
    assert list(selections[1:]) == machines


def test_a_run_within_its_share_keeps_the_verdicts_of_its_tests(tmp_path: Path) -> None:
    record = DEEP_RUN["run_unit"](
        "oracle", "one test", "test_a_pool_may_reserve_any_ids_and_never_hands_them_out", 300.0, tmp_path
    )
    assert not record["stopped_at_share"]
    assert record["summary"].get("passed", 0) >= 1 and record["failures"] == []
    assert record["implementation"]["name"] == "oracle" and not list(tmp_path.glob("*.json"))


def test_a_run_still_going_at_the_end_of_its_share_is_stopped_and_says_so(tmp_path: Path) -> None:
    record = DEEP_RUN["run_unit"]("oracle", "a machine", "test_the_prefix_cache_behaves_like_the_oracle", 1.0, tmp_path)
    assert record["stopped_at_share"] and record["failures"] == []
    assert record["seconds"] < 1.0 + DEEP_RUN["GRACE_SECONDS"]


def test_the_report_names_each_new_failure_and_counts_the_known_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failure = {"test": "suite.py::TestPool::test_x", "reason": "[POOL-101] a reserved id was handed out"}
    runs: list[dict[str, Any]] = [
        {
            "tests": "every other test",
            "seconds": 30.0,
            "stopped_at_share": False,
            "summary": {"passed": 9},
            "steps": 0,
            "failures": [failure],
            "known": 2,
        },
        {
            "round": 2,
            "tests": "test_m",
            "seconds": 60.0,
            "stopped_at_share": True,
            "summary": {"passed": 1},
            "steps": 4321,
            "failures": [],
            "known": 0,
        },
    ]
    record = {"backend": "x", "implementation": {"name": "x", "version": "1.2"}, "minutes": 1.5, "runs": runs}
    (tmp_path / "x@1.2.json").write_text(json.dumps(record))
    monkeypatch.setitem(DEEP_RUN["render"].__globals__, "RECORDS", tmp_path)
    text = DEEP_RUN["render"]()
    assert "## x 1.2" in text and "1.5 minutes, 4,321 state-machine steps, 1 new failures." in text
    assert "| 1 | every other test | 30.0 | 9 | 2 | 1 | 0 |  |" in text
    assert "| 2 | test_m | 60.0 | 1 | 0 | 0 | 4,321 | yes |" in text
    assert "`suite.py::TestPool::test_x`: [POOL-101] a reserved id was handed out" in text


def test_a_run_goes_again_in_the_next_round_only_where_it_met_tests_the_backend_offers() -> None:
    explored = DEEP_RUN["explored"]
    assert explored({"summary": {"passed": 1}, "stopped_at_share": False})
    assert explored({"summary": {"stopped before its first test ended": 1}, "stopped_at_share": True})
    assert not explored({"summary": {"unsupported": 4}, "stopped_at_share": False})


def test_a_failure_without_a_reason_is_told_by_its_assertion_and_rules() -> None:
    failure = {
        "test": "t",
        "rules": ["REQ-742"],
        "replay": "x\nE   AssertionError: [REQ-742] request 4 stays paused\ny",
    }
    assert DEEP_RUN["failure_said"](failure) == "AssertionError: [REQ-742] request 4 stays paused (rules REQ-742)"
