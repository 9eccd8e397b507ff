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


@pytest.mark.rule("CONF-912")
def test_each_profile_gives_shrinking_its_own_budget() -> None:
    from hypothesis.internal.conjecture import engine

    from kvref_conformance.profiles import SHRINK_SECONDS, shrink_within

    before = engine.MAX_SHRINKING_SECONDS
    try:
        assert SHRINK_SECONDS["ci"] <= 10, "the ci profile must give a small adopter its verdict within a minute"
        for profile, seconds in SHRINK_SECONDS.items():
            assert shrink_within(profile) == seconds == engine.MAX_SHRINKING_SECONDS
        assert shrink_within("dev-no-shrink") == SHRINK_SECONDS["dev"]
    finally:
        engine.MAX_SHRINKING_SECONDS = before


@pytest.mark.rule("CONF-912")
def test_a_shrink_stopped_at_the_budget_is_explained_in_kvrefs_words_not_as_a_hypothesis_bug() -> None:
    from kvref_conformance.profiles import shrink_stop_said

    hypothesis_said = (
        "WARNING: Hypothesis has spent more than five minutes working to shrink a failing test case, and "
        "stopped because it is making very slow progress.  When you re-run your tests, shrinking will resume "
        "and may take this long before aborting again.\n\nPLEASE REPORT THIS if you can provide a reproducing "
        "example, so that we can improve shrinking performance for everyone.\n\nother output\n"
    )
    said = shrink_stop_said(hypothesis_said, "ci")
    assert said.startswith("kvref: shrinking stopped at profile ci's budget of 10 s per failure"), said
    assert "five minutes working" not in said and "PLEASE REPORT" not in said and "other output" in said
    assert shrink_stop_said("plain output\n", "ci") == "plain output\n"
