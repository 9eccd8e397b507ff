"""Meta-tests of chapter 11: the tier suite catches every planted tier bug and names its rule.

Each bug is a backend (``tests.meta.tier_bugs:X``) run through ``kvref conformance ... -k Tiers``
under the `ci` profile in a subprocess, as any backend would be, as many at a time as there are cores.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.meta.test_planted_bugs import named_rules, run_each_bug
from tests.meta.tier_bugs import TIER_BUGS


@pytest.fixture(scope="module")
def tier_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, dict[str, Any]]]:
    """Every planted tier bug through the tier suite."""
    base = tmp_path_factory.mktemp("tiers")
    return run_each_bug("tests.meta.tier_bugs", TIER_BUGS, base, "--no-shrink", "--", "-k", "Tiers")


@pytest.mark.rule("ERR-502")
@pytest.mark.parametrize(("bug", "rule_id"), sorted(TIER_BUGS.items()))
def test_the_tier_suite_catches_the_planted_tier_bug(
    tier_runs: dict[str, tuple[int, str, dict[str, Any]]], bug: str, rule_id: str
) -> None:
    code, output, results = tier_runs[bug]
    assert code != 0, f"the tier suite passed on {bug}, which breaks {rule_id}:\n{output[-2000:]}"
    named = named_rules(results)
    assert rule_id in named, f"the suite caught {bug} but named {sorted(named)}, not {rule_id}"
