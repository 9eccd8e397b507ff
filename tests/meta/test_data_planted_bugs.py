"""Planted data-plane bugs (tests/meta/data_bugs.py): chapter 08's suite and integrity machine catch each one
and name a rule it breaks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.meta.data_bugs import DATA_BUGS
from tests.meta.data_device_bugs import DEVICE_DATA_BUGS
from tests.meta.test_planted_bugs import named_rules, run_suite


@pytest.mark.rule("DATA-802", "DATA-809", "DATA-811", "DATA-822", "DATA-832")
@pytest.mark.parametrize(("bug", "rules"), sorted((b, r) for b, (_, r) in DATA_BUGS.items()))
def test_the_data_plane_suite_catches_the_planted_bug(tmp_path: Path, bug: str, rules: set[str]) -> None:
    code, output, results = run_suite(
        f"tests.meta.data_bugs:{bug}", tmp_path, "--no-shrink", "--", "-k", "DataPlane or DataIntegrity"
    )
    assert code != 0, f"chapter 08's suite passed on {bug}, which breaks {sorted(rules)}:\n{output[-2000:]}"
    named = named_rules(results)
    assert named & rules, f"the suite caught {bug} but named {sorted(named)}, none of {sorted(rules)}"


@pytest.mark.rule("DATA-807", "DATA-809", "DATA-816")
@pytest.mark.parametrize(("bug", "rules"), sorted(DEVICE_DATA_BUGS.items()))
def test_the_device_checks_suite_catches_the_planted_bug(tmp_path: Path, bug: str, rules: set[str]) -> None:
    code, output, results = run_suite(
        f"tests.meta.data_device_bugs:{bug}", tmp_path, "--no-shrink", "--", "-k", "DataDevice"
    )
    assert code != 0, f"the device-checks suite passed on {bug}, which breaks {sorted(rules)}:\n{output[-2000:]}"
    named = named_rules(results)
    assert named & rules, f"the suite caught {bug} but named {sorted(named)}, none of {sorted(rules)}"
