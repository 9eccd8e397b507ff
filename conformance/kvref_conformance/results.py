"""Results files: what one run found for each implementation, per rule and per spec chapter.

One JSON file per implementation (``<dir>/<name>.json``): the target (name, version, device,
capabilities, profile), the Hypothesis profile, per rule its tests' outcomes and status, per
chapter a status (``pass``, ``partial``, ``fail``, ``unsupported``), every failure with its
replay (the report text, which for a state machine holds Hypothesis's minimal program), state
machine steps per second, known deviations that matched no test, and how many seconds into the
run each failure, and each failure a known deviation foresaw (``known_failures``), was seen
(``failed_after_seconds``: the time a bug takes to be found). ``kvref report`` renders
a directory of these files as one conformance matrix.
"""

from __future__ import annotations

import json
import platform
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvref_conformance.target import Target

__all__ = ["ResultsRecorder", "chapter_of"]

_CHAPTERS = {
    "STATE": "00-terms",
    "SPEC": "00-terms",
    "POOL": "01-pool",
    "HASH": "02-hashing",
    "PFX": "03-prefix-cache",
    "EVICT": "04-eviction",
    "ERR": "05-errors",
    "RADIX": "06-radix",
    "REQ": "07-request-manager",
    "DATA": "08-data-plane",
    "CONF": "09-backends",
    "TRACE": "10-traces-and-replay",
    "TIER": "11-tiers",
}


def chapter_of(rule_id: str) -> str:
    """The spec chapter a rule id belongs to."""
    return _CHAPTERS.get(rule_id.split("-")[0], "unknown")


def _outcome(report: Any) -> str | None:
    """passed, failed, xfailed, unsupported (capability skip), blocked (prerequisite), or None."""
    if report.when == "call" and not report.skipped:
        if hasattr(report, "wasxfail"):  # a deviation reached by chance that this run did not reach
            return "passed"
        return str(report.outcome)
    if report.skipped:
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if hasattr(report, "wasxfail"):
            return "xfailed"
        return "blocked" if "prerequisite failed" in reason else "unsupported"
    if report.failed:
        return "failed"  # an error in setup or teardown
    return None


def describe(target: Target) -> dict[str, Any]:
    """What a results file says of the implementation: plain data, so it can travel from a pytest-xdist worker."""
    return {
        "name": target.name,
        "version": target.version,
        "device": target.device,
        "capabilities": sorted(target.capabilities),
        "profile": target.profile,
    }


@dataclass
class _TargetResults:
    implementation: dict[str, Any]
    tests: dict[str, dict[str, Any]] = field(default_factory=dict)


class ResultsRecorder:
    """Collects test outcomes per target during a run and writes the results files at the end."""

    def __init__(self, directory: Path, hypothesis_profile: str) -> None:
        self.directory = directory
        self.hypothesis_profile = hypothesis_profile
        self.targets: dict[str, _TargetResults] = {}
        self.steps: dict[str, dict[str, float]] = {}
        self.unmatched: dict[str, list[str]] = {}
        self.started = time.monotonic()

    def record(self, implementation: dict[str, Any], nodeid: str, rules: list[str], report: Any) -> None:
        """Note one report phase of one test of ``implementation`` (:func:`describe`)."""
        outcome = _outcome(report)
        if outcome is None:
            return
        name = implementation["name"]
        entry = self.targets.setdefault(name, _TargetResults(implementation)).tests.setdefault(
            nodeid, {"rules": list(rules), "outcome": outcome}
        )
        if outcome == "failed" or entry["outcome"] == "passed":
            entry["outcome"] = outcome
        if outcome in ("failed", "xfailed"):
            entry.setdefault("failed_after_seconds", round(time.monotonic() - self.started, 1))
        if outcome == "failed":
            text = _clip(str(report.longrepr))
            # the first failure (the test itself) leads; a later one (teardown) is appended
            entry["replay"] = f"{entry['replay']}\n\n[{report.when}] {text}" if "replay" in entry else text
        if outcome == "xfailed":
            entry["reason"] = str(getattr(report, "wasxfail", ""))
        elif outcome in ("unsupported", "blocked") and isinstance(report.longrepr, tuple):
            entry["reason"] = str(report.longrepr[2])  # the skip's reason: the capability lacked, the rule failed

    def add_steps(self, machine: str, steps: int, seconds: float) -> None:
        """Add ``steps`` state-machine steps of ``machine`` run in ``seconds`` (from any worker)."""
        entry = self.steps.setdefault(machine, {"steps": 0, "seconds": 0.0, "steps_per_second": 0})
        entry["steps"] += steps
        entry["seconds"] = round(entry["seconds"] + seconds, 3)
        entry["steps_per_second"] = round(entry["steps"] / entry["seconds"]) if entry["seconds"] else 0

    def summarize(self, name: str) -> dict[str, Any]:
        """The results document of one target."""
        data = self.targets[name]
        rules: dict[str, dict[str, Any]] = {}
        for nodeid, test in data.tests.items():
            for rid in test["rules"]:
                rule = rules.setdefault(rid, {"chapter": chapter_of(rid), "tests": {}})
                rule["tests"][nodeid] = test["outcome"]
        for rule in rules.values():
            rule["status"] = _status(list(rule["tests"].values()))
        chapters: dict[str, dict[str, Any]] = {}
        for rid, rule in sorted(rules.items()):
            chapter = chapters.setdefault(rule["chapter"], {"rules": {}})
            chapter["rules"][rid] = rule["status"]
        for chapter in chapters.values():
            chapter["status"] = _status(list(chapter["rules"].values()))
            chapter["covered"] = sum(1 for s in chapter["rules"].values() if s == "pass")
            chapter["total"] = len(chapter["rules"])

        def listed(outcome: str, said: str) -> list[dict[str, Any]]:
            """The tests with ``outcome``, each with what it said (its ``replay`` or its ``reason``)."""
            return [
                {
                    "test": nodeid,
                    "rules": test["rules"],
                    said: test[said],
                    "failed_after_seconds": test["failed_after_seconds"],
                }
                for nodeid, test in data.tests.items()
                if test["outcome"] == outcome
            ]

        failures, known_failures = listed("failed", "replay"), listed("xfailed", "reason")
        return {
            "format": 1,
            "implementation": data.implementation,
            "hypothesis_profile": self.hypothesis_profile,
            "python": platform.python_version(),
            "machine": {"node": platform.node(), "platform": platform.platform()},
            "summary": _count(data.tests.values()),
            "chapters": chapters,
            "rules": rules,
            "failures": failures,
            "known_failures": known_failures,
            "state_machines": {k: v for k, v in self.steps.items() if k.startswith(f"{name}:")},
            "unmatched_deviations": self.unmatched.get(name, []),
            "seconds": round(time.monotonic() - self.started, 1),
        }

    def write(self, timestamp: float) -> list[Path]:
        """Write one file per target; return their paths."""
        self.directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for name in sorted(self.targets):
            doc = self.summarize(name)
            doc["timestamp"] = round(timestamp)
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
            path = self.directory / f"{safe}.json"
            path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            paths.append(path)
        return paths


def _status(outcomes: list[str]) -> str:
    """The status of a rule from its tests' outcomes, or of a chapter from its rules' statuses.

    fail: something failed; partial: a known deviation, or some parts blocked by a failed
    prerequisite; blocked / unsupported: nothing ran (blocked wins: it hides a failure); pass.
    """
    if any(o in ("failed", "fail") for o in outcomes):
        return "fail"
    if any(o in ("xfailed", "partial") for o in outcomes):
        return "partial"
    ran = [o for o in outcomes if o not in ("unsupported", "blocked")]
    if not ran:
        return "blocked" if "blocked" in outcomes else "unsupported"
    return "partial" if "blocked" in outcomes else "pass"


def _count(tests: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for test in tests:
        out[test["outcome"]] = out.get(test["outcome"], 0) + 1
    return out


def _clip(text: str, limit: int = 6000) -> str:
    """A long report cut to ``limit`` characters: the exception's own lines (what was seen, the rule
    it breaks) first, then the replay program from its start, or else the report's end."""
    if len(text) <= limit:
        return text
    marker = max(text.find("Falsifying example"), text.find("Failing test case"))
    if marker == -1:
        return "..." + text[-limit:]
    error = [line for line in text[:marker].splitlines() if re.match(r"E\s+\w*(Error|Exception)\b", line)]
    head = "\n".join(error)[: limit // 4] + "\n...\n" if error else ""
    return head + text[marker : marker + limit - len(head)]
