"""Verdict files: one implementation's verdict on every rule its run judged, as plain stable data.

A verdict file (``<dir>/<name>-<device>@<version>.json``) is what a conformance run says of each
rule the suite's tests cite, one of:

- ``pass``: every test of the rule that ran passed (``tests`` lists them);
- ``deviation``: a test of the rule is a known deviation of this implementation (``reasons``: the
  deviations file's reason and upstream link), and none failed;
- ``fail``: a test of the rule failed (``tests`` lists the failing ones);
- ``not applicable``: every test of the rule needs a capability the implementation does not
  declare (``reasons``: which);
- ``not run``: no test of the rule ran for another reason: a failed prerequisite, a device the
  machine lacks (``reasons``).

The file holds no time, machine or speed, so the same run makes the same file: a committed one is
checked by rerunning (``nox -s conformance`` does for the oracle, torch and CuPy). ``kvref report
--verdicts DIR`` renders a directory of them as one rule-by-implementation matrix.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = ["VERDICTS", "test_id", "verdict_document", "verdict_file_name", "write_verdicts"]

#: The verdicts, from the one that decides a rule first to the last.
VERDICTS = ("fail", "deviation", "pass", "not applicable", "not run")

_DEVIATION = re.compile(r"known deviation: (?P<test>[^:]+(?:::[^:]+)*): (?P<reason>.*) \((?P<link>\S+)\)$", re.S)


def verdict_file_name(implementation: dict[str, Any]) -> str:
    """``<name>-<device>@<version>.json``, with anything but letters, digits and ``._+@-`` made ``_``."""
    stem = f"{implementation['name']}-{implementation['device']}@{implementation['version']}"
    return re.sub(r"[^A-Za-z0-9_.+@-]+", "_", stem) + ".json"


def test_id(nodeid: str) -> str:
    """A test's id as a verdict file names it: pytest's node id without the directory of its file,
    which depends on where the suite is installed (a checkout, a virtual environment's site-packages)."""
    path, sep, rest = nodeid.partition("::")
    return f"{path.rsplit('/', 1)[-1]}{sep}{rest}"


def _reason(test: dict[str, Any]) -> dict[str, str]:
    """Why a test did not pass: a deviation's reason and link, or a skip's reason."""
    text = str(test.get("reason", ""))
    found = _DEVIATION.match(text)
    if found:
        return {"reason": found["reason"], "link": found["link"]}
    return {"reason": text.removeprefix("Skipped: ")}


def _verdict(rule: str, tests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The verdict on ``rule`` from its tests (``{nodeid: {"outcome", "reason"?}}``).

    A known deviation whose reason names rules other than ``rule`` (a state machine cites many
    rules, its deviation concerns one) is that test not running to its end for ``rule``: it makes
    ``rule`` neither a deviation nor a pass.
    """
    tests = dict(tests)
    for nodeid, test in tests.items():
        if test["outcome"] == "xfailed":
            named = sorted(set(re.findall(r"\b[A-Z]+-\d{3}\b", _reason(test)["reason"])))
            if named and rule not in named:
                stopped = f"its test stopped at a known deviation of {', '.join(named)}"
                tests[nodeid] = {**test, "outcome": "blocked", "reason": stopped}
    by_outcome: dict[str, list[str]] = {}
    for nodeid, test in sorted(tests.items()):
        by_outcome.setdefault(test["outcome"], []).append(nodeid)

    def reasons(outcome: str) -> list[dict[str, str]]:
        seen: list[dict[str, str]] = []
        for nodeid in by_outcome.get(outcome, []):
            reason = _reason(tests[nodeid])
            if reason not in seen:
                seen.append(reason)
        return seen

    if "failed" in by_outcome:
        return {"verdict": "fail", "tests": by_outcome["failed"]}
    if "xfailed" in by_outcome:
        return {"verdict": "deviation", "tests": by_outcome["xfailed"], "reasons": reasons("xfailed")}
    if "passed" in by_outcome:
        return {"verdict": "pass", "tests": by_outcome["passed"]}
    lacking = [n for n in by_outcome.get("unsupported", []) if " lacks '" in str(tests[n].get("reason", ""))]
    if lacking and len(lacking) == len(tests):
        return {"verdict": "not applicable", "reasons": reasons("unsupported")}
    return {"verdict": "not run", "reasons": reasons("unsupported") + reasons("blocked")}


def verdict_document(implementation: dict[str, Any], tests: dict[str, dict[str, Any]], profile: str) -> dict[str, Any]:
    """The verdict file of one run: ``implementation`` (name, version, device, profile), each rule's
    verdict from ``tests`` (``{nodeid: {"rules", "outcome", "reason"?}}``), counts per verdict."""
    per_rule: dict[str, dict[str, dict[str, Any]]] = {}
    for nodeid, test in tests.items():
        for rule in test["rules"]:
            per_rule.setdefault(rule, {})[test_id(nodeid)] = test
    rules = {rule: _verdict(rule, per_rule[rule]) for rule in sorted(per_rule)}
    counts = {v: sum(1 for r in rules.values() if r["verdict"] == v) for v in VERDICTS}
    return {
        "format": 1,
        "implementation": {k: implementation[k] for k in ("name", "version", "device", "profile")},
        "hypothesis_profile": profile,
        "counts": counts,
        "rules": rules,
    }


def write_verdicts(directory: Path, documents: list[dict[str, Any]]) -> list[Path]:
    """Write each verdict document as ``directory/<verdict_file_name>``; return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for doc in documents:
        path = directory / verdict_file_name(doc["implementation"])
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        paths.append(path)
    return paths
