"""The plugin's mechanisms on a planted bug: known deviations, prerequisite skips, results, report."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvref.reports.summary import load_results, render_matrix
from kvref_conformance.deviations import read_deviations
from tests.meta.test_planted_bugs import run_suite

FREE_DROPS = "TestPool::test_free_drops_one_reference_per_occurrence_including_duplicates_in_one_call"


@pytest.mark.rule("POOL-107")
def test_a_known_deviation_turns_the_failure_into_a_strict_xfail_and_stale_entries_are_reported(
    tmp_path: Path,
) -> None:
    deviations = tmp_path / "scatter.toml"
    deviations.write_text(
        f'[[deviation]]\ntest = "{FREE_DROPS}"\nreason = "scatter release"\nlink = "https://example.org/1"\n\n'
        '[[deviation]]\ntest = "TestPool::test_that_does_not_exist"\nreason = "stale"\nlink = "https://example.org/2"\n'
    )
    code, output, results = run_suite(
        "tests.meta.bugs:ScatterFree",
        tmp_path / "r",
        "--no-shrink",
        "--deviations",
        str(deviations),
        "--",
        "-k",
        "TestPool and free_drops",
    )
    assert code == 0, f"a known deviation still failed the run:\n{output[-2000:]}"
    assert "matches no test: TestPool::test_that_does_not_exist" in output
    assert results["summary"] == {"xfailed": 1}
    assert results["unmatched_deviations"] and results["chapters"]["01-pool"]["status"] == "partial"


@pytest.mark.rule("POOL-107")
def test_a_deviation_reached_by_chance_may_pass_but_a_strict_one_may_not(tmp_path: Path) -> None:
    entry = f'[[deviation]]\ntest = "{FREE_DROPS}"\nreason = "r"\nlink = "https://example.org/1"\n'
    for chance, code_wanted, outcome in ((True, 0, "passed"), (False, 1, "failed")):
        deviations = tmp_path / f"oracle-{chance}.toml"
        deviations.write_text(entry + ("reached_by_chance = true\n" if chance else ""))
        code, output, results = run_suite(
            "oracle", tmp_path / str(chance), "--deviations", str(deviations), "--", "-k", "TestPool and free_drops"
        )
        assert code == code_wanted, (
            f"reached_by_chance = {chance}: exit {code} on the oracle, which passes:\n{output[-1500:]}"
        )
        assert results["summary"] == {outcome: 1}, results["summary"]
    (tmp_path / "bad.toml").write_text(entry + 'reached_by_chance = "yes"\n')
    with pytest.raises(ValueError, match="reached_by_chance 'yes' is not true or false"):
        read_deviations(tmp_path / "bad.toml")


@pytest.mark.rule("POOL-104", "POOL-108")
def test_a_failed_prerequisite_rule_skips_its_dependents_instead_of_cascading(tmp_path: Path) -> None:
    code, output, results = run_suite(
        "tests.meta.bugs:ReservedHandedOut",  # fails allocate's common case: the null block handed out
        tmp_path,
        "--no-shrink",
        "--",
        "-k",
        "TestPool and (allocate_returns_distinct or double_free)",
        "-rs",
    )
    assert code != 0
    assert "prerequisite failed: POOL-104" in output, output[-2000:]
    assert results["summary"] == {"failed": 1, "blocked": 1}


@pytest.mark.rule("POOL-107", "POOL-108")
def test_a_failed_corner_of_a_prerequisite_rule_skips_none_of_its_dependents(tmp_path: Path) -> None:
    code, output, results = run_suite(
        "tests.meta.bugs:ScatterFree",  # fails only the corner: an id listed twice in one free
        tmp_path,
        "--no-shrink",
        "--",
        "-k",
        "TestPool and (free_drops or double_free)",
        "-rs",
    )
    assert code != 0
    assert "prerequisite failed" not in output, output[-2000:]
    assert results["summary"] == {"failed": 1, "passed": 1}


@pytest.mark.rule("POOL-104")
def test_the_report_renders_results_side_by_side(tmp_path: Path) -> None:
    run_suite("tests.meta.bugs:ScatterFree", tmp_path, "--no-shrink", "--", "-k", "TestPool")
    run_suite("oracle", tmp_path, "--", "-k", "TestPool")
    docs = load_results([tmp_path])
    text = render_matrix(docs)
    assert [d["implementation"]["name"] for d in docs] == ["oracle", "tests.meta.bugs:ScatterFree"]
    assert "| 01-pool | pass | **fail**" in text, text
    assert "POOL-107" in text


@pytest.mark.rule("POOL-107")
def test_a_run_spread_over_processes_writes_the_results_a_plain_run_writes(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    chosen = "TestPool or TestSlots or (TestStateful and pool_behaves)"  # rule tests and a state machine's steps
    plain = run_suite("oracle", tmp_path / "plain", "--", "-k", chosen)
    spread = run_suite("oracle", tmp_path / "spread", "--", "-k", chosen, "-n", "2")
    assert "gw1" in spread[1] or "2 workers" in spread[1], f"not spread over processes:\n{spread[1][-1500:]}"
    assert plain[0] == spread[0] == 0, f"the oracle failed: plain {plain[0]}, spread {spread[0]}\n{spread[1][-1500:]}"
    for key in ("summary", "chapters", "rules", "implementation"):
        assert spread[2][key] == plain[2][key], f"under pytest-xdist the results' {key} differ from a plain run's"
    steps = {name: m["steps"] for name, m in spread[2]["state_machines"].items()}
    assert steps and steps == {n: m["steps"] for n, m in plain[2]["state_machines"].items()}, (
        f"state-machine steps under pytest-xdist {steps} are not the plain run's (each worker's must add up)"
    )


@pytest.mark.rule("POOL-107")
def test_a_failure_in_a_run_spread_over_processes_reaches_the_results(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    code, output, results = run_suite(
        "tests.meta.bugs:ScatterFree", tmp_path, "--no-shrink", "--", "-k", "TestPool and free_drops", "-n", "2"
    )
    assert code != 0 and "[gw" in output, f"the planted bug passed, or the run was not spread:\n{output[-1500:]}"
    failed = [f["test"] for f in results["failures"]]
    assert any("free_drops" in t for t in failed), f"the failure a worker saw is not in the results: {failed}"
