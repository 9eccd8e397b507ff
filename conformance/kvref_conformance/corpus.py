"""The bug corpus: bugs the engines really shipped, each judged by the suite on the release that
shipped it and on the release that fixed it.

One file per engine, ``corpus/<engine>.toml`` inside this package, lists its bugs::

    [[bug]]
    id = "paged-free-lists-a-page-twice"       # stable, unique across the corpus
    title = "free() of a page freed before lists it twice, so alloc hands it out twice"
    backend = "sglang-paged"                   # the conformance backend that drives the engine
    buggy = "0.5.9"                            # a release that ships the bug: the suite runs on it
    fixed = "0.5.10"                           # the first release with the fix, "" while none has it
    rules = ["RADIX-606"]                      # the rules the bug breaks
    upstream = "https://github.com/..."        # the engine's issue, pull request or commit
    evidence = "what changed between the releases, in the engine's own files"

The corpus holds no test of its own: ``nox -s corpus`` installs each release and runs the suite on
it as on any implementation (``scripts/bug_corpus.py``); :func:`judge` then reads the two results
files. A bug is caught when a test fails on ``buggy`` naming one of its rules (the rule ids in the
failure's message, or, where the message names none, the rules the test cites), or fails as a known
deviation whose reason calls it a bug and names the rule, for one no release has fixed yet; the
fixed release passes when the bug's rules ran there and no failure names them.
:func:`corpus_table` renders the findings as ``results/bug-corpus.md``.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from kvref_conformance.deviations import DEVIATIONS, Deviation, read_deviations

__all__ = [
    "CORPUS",
    "Bug",
    "Finding",
    "corpus_table",
    "judge",
    "load_corpus",
    "merge_passes",
    "named_rules",
    "read_results",
    "is_bug",
    "unreported_findings",
    "unreported_section",
]

#: The directory of the shipped corpus files.
CORPUS = Path(__file__).parent / "corpus"

_FIELDS = ("id", "title", "backend", "buggy", "fixed", "rules", "upstream", "evidence")


@dataclass(frozen=True)
class Bug:
    """One shipped bug: where it lives, which releases have it and which rules it breaks."""

    id: str
    title: str
    engine: str
    backend: str
    buggy: str
    fixed: str
    rules: tuple[str, ...]
    upstream: str
    evidence: str

    def releases(self) -> list[str]:
        """The releases the suite runs on for this bug: the buggy one, then the fixed one if any."""
        return [self.buggy, self.fixed] if self.fixed else [self.buggy]


def _bug(path: Path, index: int, entry: dict[str, Any]) -> Bug:
    """One entry of a corpus file, checked; a ``ValueError`` names the file, the entry and the field."""
    where = f"{path.name}: bug {index} ({entry.get('id', 'without an id')})"
    missing = [name for name in _FIELDS if name not in entry]
    if missing:
        raise ValueError(f"{where}: lacks {missing}")
    unknown = sorted(set(entry) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown fields {unknown}; the fields are {list(_FIELDS)}")
    rules = entry["rules"]
    if not isinstance(rules, list) or not rules or not all(isinstance(r, str) for r in rules):
        raise ValueError(f"{where}: rules must be a non-empty list of rule ids")
    try:
        buggy = Version(str(entry["buggy"]))
        fixed = Version(str(entry["fixed"])) if entry["fixed"] else None
    except InvalidVersion as exc:
        raise ValueError(f"{where}: {exc}") from None
    if fixed is not None and fixed <= buggy:
        raise ValueError(f"{where}: the fixed release {fixed} is not after the buggy one {buggy}")
    if not str(entry["upstream"]).startswith("https://"):
        raise ValueError(f"{where}: upstream must be a URL")
    return Bug(
        id=str(entry["id"]),
        title=str(entry["title"]),
        engine=path.stem,
        backend=str(entry["backend"]),
        buggy=str(entry["buggy"]),
        fixed=str(entry["fixed"]),
        rules=tuple(rules),
        upstream=str(entry["upstream"]),
        evidence=str(entry["evidence"]),
    )


def load_corpus(directory: Path = CORPUS, engines: Iterable[str] | None = None) -> list[Bug]:
    """Every bug of the corpus files in ``directory`` (of ``engines`` only, if given), checked;
    ids must be unique across the files."""
    wanted = set(engines) if engines is not None else None
    bugs: list[Bug] = []
    for path in sorted(directory.glob("*.toml")):
        if wanted is not None and path.stem not in wanted:
            continue
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not valid TOML: {exc}") from None
        bugs.extend(_bug(path, i, entry) for i, entry in enumerate(data.get("bug", [])))
    seen: set[str] = set()
    for bug in bugs:
        if bug.id in seen:
            raise ValueError(f"bug id {bug.id!r} is used twice in the corpus")
        seen.add(bug.id)
    return bugs


@dataclass(frozen=True)
class Finding:
    """What the suite said of one bug: caught or not, how fast, and whether the fix passes."""

    bug: Bug
    caught: bool
    known: bool
    test: str
    rules: tuple[str, ...]
    seconds: float | None
    replay: str
    fixed_passes: bool | None
    false_alarms: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        """Plain data for ``results/bug-corpus/<engine>.json``."""
        return {
            "bug": self.bug.id,
            "engine": self.bug.engine,
            "backend": self.bug.backend,
            "buggy": self.bug.buggy,
            "fixed": self.bug.fixed,
            "caught": self.caught,
            "known": self.known,
            "test": self.test,
            "rules": list(self.rules),
            "seconds": self.seconds,
            "replay": self.replay,
            "fixed_passes": self.fixed_passes,
            "false_alarms": list(self.false_alarms),
        }


_RULE_ID = re.compile(r"\b[A-Z]+-\d{3,4}\b")
_ERROR_LINE = re.compile(r"^E\s+(?:\w*(?:Error|Exception)|Failed)\b.*$", re.M)
#: The errors through which the suite says a rule is broken: its assertions, ``pytest.fail`` and
#: the errors kvref's contract raises. Another exception (an API the adapter does not meet) names nothing.
_RULING = re.compile(r"^E\s+(?:AssertionError|Failed|\w*KVRef\w*|\w+(?:Value|Type|State|Capacity)Error)\b", re.M)
_BUG = re.compile(r"\bbug\b")


def is_bug(reason: str) -> bool:
    """Whether a known deviation's reason calls it a bug (the word, not inside another)."""
    return bool(_BUG.search(reason)) and not reason.startswith("by design")


def named_rules(failure: dict[str, Any]) -> set[str]:
    """The rules a failure names: the ids in its error's message (the ``E ...Error:`` and ``E Failed:``
    lines of its ``replay``, or a known deviation's ``reason``); where the message names none, the
    rules its test cites, but only when the error is one through which the suite rules (an
    assertion, ``pytest.fail``, a kvref error): a crash on an API the adapter does not meet names nothing."""
    if "replay" not in failure:
        return set(_RULE_ID.findall(str(failure.get("reason", ""))))
    replay = str(failure["replay"])
    named = set(_RULE_ID.findall("\n".join(_ERROR_LINE.findall(replay))))
    if named:
        return named
    return set(failure["rules"]) if _RULING.search(replay) else set()


def _naming(failures: Iterable[dict[str, Any]], rules: tuple[str, ...]) -> list[dict[str, Any]]:
    return [f for f in failures if named_rules(f) & set(rules)]


def _is_this_bug(bug: Bug, known: dict[str, Any]) -> bool:
    """Whether a foreseen failure is ``bug``'s own deviation: a bug linking its upstream reference."""
    return is_bug(str(known["reason"])) and bug.upstream in str(known["reason"])


def judge(bug: Bug, buggy_results: dict[str, Any], fixed_results: dict[str, Any] | None) -> Finding:
    """Judge ``bug`` from the conformance results file of its buggy release and, when it has one,
    of its fixed release (``None`` where no release has the fix).

    A known deviation counts only for a bug no release has fixed, and only the deviation that is
    this bug: its reason calls it a bug, names one of the bug's rules and links the bug's upstream
    reference. The fix is clear when the test that caught the bug passes on the fixed release and
    no failure names the bug's rules there, nor does the bug's own deviation still fail.
    """
    own = [t for t in buggy_results.get("known_failures", []) if not bug.fixed and _is_this_bug(bug, t)]
    failures = _naming(buggy_results["failures"], bug.rules) + _naming(own, bug.rules)
    failures.sort(key=lambda t: t["failed_after_seconds"])
    first = failures[0] if failures else None
    false_alarms: tuple[str, ...] = ()
    fixed_passes = None
    if fixed_results is not None:
        still = fixed_results["failures"] + [t for t in fixed_results.get("known_failures", []) if _is_this_bug(bug, t)]
        false_alarms = tuple(t["test"] for t in _naming(still, bug.rules))
        passed = first is not None and any(
            rule["tests"].get(first["test"]) == "passed" for rule in fixed_results["rules"].values()
        )
        fixed_passes = passed and not false_alarms
    return Finding(
        bug=bug,
        caught=first is not None,
        known=first is not None and "replay" not in first,
        test=first["test"].split("::", 1)[-1] if first else "",
        rules=tuple(sorted(named_rules(first) & set(bug.rules))) if first else (),
        seconds=first["failed_after_seconds"] if first else None,
        replay=str(first.get("replay", first.get("reason", ""))) if first else "",
        fixed_passes=fixed_passes,
        false_alarms=false_alarms,
    )


def merge_passes(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """One results document from two passes over one release, run one after the other: the second
    pass's failures are timed from the start of the first, a rule fails if it failed in either, and
    each rule keeps every test either pass ran. A test both ran failed if it failed in either, else
    passed if it passed in either (the second pass withdraws a capability so that a test a known
    deviation hid in the first can pass), else is as the second pass found it."""
    offset = first["seconds"]
    later, known = (
        [{**f, "failed_after_seconds": round(f["failed_after_seconds"] + offset, 1)} for f in second[key]]
        for key in ("failures", "known_failures")
    )
    rules = dict(first["rules"])
    for rule, said in second["rules"].items():
        statuses = {rules[rule]["status"], said["status"]} if rule in rules else {said["status"]}
        status = next(s for s in ("fail", "pass", "partial", "blocked", "unsupported") if s in statuses)
        tests = dict(rules[rule]["tests"]) if rule in rules else {}
        for test, outcome in said["tests"].items():
            both = (tests.get(test), outcome)
            tests[test] = next((o for o in ("failed", "passed") if o in both), outcome)
        rules[rule] = {**said, "status": status, "tests": tests}
    return {
        **first,
        "rules": rules,
        "failures": first["failures"] + later,
        "known_failures": first["known_failures"] + known,
        "seconds": round(offset + second["seconds"], 1),
    }


def read_results(path: Path) -> dict[str, Any]:
    """A conformance results file (``kvref conformance --results DIR`` writes ``DIR/<backend>.json``)."""
    return dict(json.loads(path.read_text(encoding="utf-8")))


def corpus_table(findings: list[dict[str, Any]], bugs: dict[str, Bug]) -> str:
    """``results/bug-corpus.md``: one row per bug (from :meth:`Finding.as_json`), then the totals and
    the median time to the first failure."""
    lines = [
        "# Bug corpus: bugs the engines shipped, judged by the suite on their releases",
        "",
        "Written by `nox -s corpus` (`scripts/bug_corpus.py`): each bug's buggy release and fixed release",
        "installed and run through the conformance suite under the `ci` profile, unchanged. *caught*: a",
        "failure on the buggy release names one of the bug's rules, or, for a bug no release has fixed, a",
        "known deviation that calls it a bug fails as foreseen. *caught after*: seconds into the run when",
        "that failure was seen. Every bug runs on the real release. The entries:",
        "`conformance/kvref_conformance/corpus/`.",
        "",
        "| engine | bug | buggy release | fixed release | rules | caught | caught after | test that failed | "
        "fixed release passes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for found in findings:
        bug = bugs[found["bug"]]
        seconds = f"{found['seconds']:.1f} s" if found["seconds"] is not None else "-"
        said = ("yes, as a known deviation" if found["known"] else "yes") if found["caught"] else "**no**"
        if found["fixed_passes"] is None:
            fixed = "no fix released"
        elif found["fixed_passes"]:
            fixed = "yes"
        else:
            fixed = "**no**: " + (", ".join(found["false_alarms"]) or "the test that caught it did not pass there")
        lines.append(
            f"| {bug.engine} | [{bug.title}]({bug.upstream}) | {bug.buggy} | {bug.fixed or '-'} | "
            f"{', '.join(bug.rules)} | {said} | {seconds} | "
            f"`{found['test'] or '-'}` | {fixed} |"
        )
    caught = [f for f in findings if f["caught"]]
    times = sorted(f["seconds"] for f in caught)
    median = (times[(len(times) - 1) // 2] + times[len(times) // 2]) / 2 if times else None
    with_fix = [f for f in findings if f["fixed_passes"] is not None]
    lines += [
        "",
        f"{len(caught)} of {len(findings)} bugs caught; median time to the first failure "
        + (f"{median:.1f} s" if median is not None else "-")
        + f"; {sum(1 for f in with_fix if f['fixed_passes'])} of {len(with_fix)} fixed releases pass.",
    ]
    return "\n".join(lines) + "\n"


def unreported_findings(directory: Path = DEVIATIONS) -> list[tuple[str, Deviation]]:
    """``(backend, deviation)`` for each known deviation that is a bug kvref found and no upstream
    issue or pull request names yet: its reason says ``bug`` and its link is the engine's source."""
    found = []
    for path in sorted(directory.glob("*.toml")):
        for deviation in read_deviations(path):
            upstream = "/issues/" in deviation.link or "/pull/" in deviation.link
            if is_bug(deviation.reason) and not upstream:
                found.append((path.stem, deviation))
    return found


def unreported_section(findings: list[tuple[str, Deviation]], versions: dict[str, str]) -> str:
    """The corpus table's last section: each bug kvref found that is not reported upstream, as a
    draft report (what happens, which rule says what should, how to replay it, on which release)."""
    lines = [
        "## Found by kvref, not yet reported upstream",
        "",
        "Known deviations of the peers that are bugs and that no upstream issue or pull request names yet",
        "(`conformance/kvref_conformance/deviations/`). Each is a draft report. The deep runs on the newest",
        "release of each engine (`nox -s deep`, [`deep-runs.md`](deep-runs.md)) record what they find here.",
    ]
    backends_of: dict[tuple[str, str], list[str]] = {}
    for backend, deviation in findings:  # one allocator serves several backends: one report each
        backends_of.setdefault((deviation.test, deviation.reason), []).append(backend)
    seen: set[tuple[str, str]] = set()
    for _, deviation in findings:
        key = (deviation.test, deviation.reason)
        if key in seen:
            continue
        seen.add(key)
        backends = backends_of[key]
        rules = ", ".join(sorted(set(_RULE_ID.findall(deviation.reason)))) or "see the test"
        releases = "; ".join(f"{b} {versions.get(b, 'as its peer session pins')}" for b in backends)
        lines += [
            "",
            f"### {', '.join(backends)}: `{deviation.test}`",
            "",
            f"- **what happens**: {deviation.reason}",
            f"- **what should**: the spec rule(s) {rules} (`kvref spec show RULE` prints the text)",
            f'- **replay**: `kvref conformance --backend {backends[0]} -- -k "{deviation.test.rsplit("::", 1)[-1]}"` '
            "fails with the shrunk example once the deviation is taken out of its file",
            f"- **release**: {releases}; the code: {deviation.link}",
        ]
    return "\n".join(lines) + "\n"
