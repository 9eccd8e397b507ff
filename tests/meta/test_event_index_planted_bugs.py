"""Meta-tests of chapter 03's event index: the suite catches every planted index bug and names its rule.

Each bug is a backend (``tests.meta.event_index_bugs:X``) run through ``kvref conformance ... -k
EventIndex`` under the `ci` profile in a subprocess, as any backend would be.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.meta.event_index_bugs import EVENT_INDEX_BUGS
from tests.meta.test_planted_bugs import named_rules, run_each_bug


@pytest.fixture(scope="module")
def index_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, dict[str, Any]]]:
    """Every planted event-index bug through the event-index suite."""
    base = tmp_path_factory.mktemp("event-index")
    return run_each_bug("tests.meta.event_index_bugs", EVENT_INDEX_BUGS, base, "--no-shrink", "--", "-k", "EventIndex")


@pytest.mark.rule("ERR-502")
@pytest.mark.parametrize(("bug", "rule_id"), sorted(EVENT_INDEX_BUGS.items()))
def test_the_event_index_suite_catches_the_planted_index_bug(
    index_runs: dict[str, tuple[int, str, dict[str, Any]]], bug: str, rule_id: str
) -> None:
    code, output, results = index_runs[bug]
    assert code != 0, f"the event-index suite passed on {bug}, which breaks {rule_id}:\n{output[-2000:]}"
    named = named_rules(results)
    assert rule_id in named, f"the suite caught {bug} but named {sorted(named)}, not {rule_id}"
