"""The bug corpus: its entries are well formed, and a bug is judged from the suite's own results."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kvref_conformance.corpus import (
    Bug,
    corpus_table,
    judge,
    load_corpus,
    merge_passes,
    named_rules,
    unreported_findings,
    unreported_section,
)

rule = pytest.mark.rule
SPEC_RULES = {r["id"] for r in json.loads(Path("spec/rules.json").read_text(encoding="utf-8"))["rules"]}
PEERS = {"vllm", "vllm-nocache", "sglang", "sglang-paged", "sglang-unified", "sglang-unified-paged", "megatron"}


def bug(**fields: Any) -> Bug:
    base = {
        "id": "b",
        "title": "t",
        "engine": "vllm",
        "backend": "vllm",
        "buggy": "0.23.0",
        "fixed": "0.24.0",
        "rules": ("POOL-106",),
        "upstream": "https://x",
        "evidence": "e",
    }
    return Bug(**{**base, **fields})


def results(
    failures: Sequence[dict[str, Any]] = (), known: Sequence[dict[str, Any]] = (), **outcomes: str
) -> dict[str, Any]:
    """A results document; ``outcomes``: a rule (``POOL_106``) to the outcome of its one test, x.py::T::test_a."""
    rules = {r.replace("_", "-"): {"status": o, "tests": {"x.py::T::test_a": o}} for r, o in outcomes.items()}
    return {"failures": list(failures), "known_failures": list(known), "rules": rules}


def failure(message: str, cited: list[str], seconds: float = 1.0, test: str = "x.py::T::test_a") -> dict[str, Any]:
    replay = f"    assert x\nE       AssertionError: {message}\nE       assert 3 == 2\n"
    return {"test": test, "rules": cited, "replay": replay, "failed_after_seconds": seconds}


@rule("CONF-914")
def test_every_corpus_entry_names_spec_rules_a_peer_and_releases_in_order() -> None:
    bugs = load_corpus()
    assert bugs, "the corpus is empty"
    for found in bugs:
        assert set(found.rules) <= SPEC_RULES, f"{found.id}: rules {found.rules} not all in the spec"
        assert found.backend in PEERS, f"{found.id}: backend {found.backend!r} is not a peer adapter"


@rule("CONF-914")
def test_a_bug_is_caught_by_the_rule_its_failure_names_not_by_the_rules_the_test_cites() -> None:
    named = failure("[POOL-106] num_available 3, the spec has 2", ["STATE-001", "POOL-106", "POOL-107"], 6.0)
    other = failure("[POOL-107] free left 2 references", ["STATE-001", "POOL-106"], 2.0)
    assert named_rules(named) == {"POOL-106"}
    found = judge(bug(), results([other, named]), results(POOL_106="passed"))
    assert found.caught and found.seconds == 6.0 and found.rules == ("POOL-106",) and found.test == "T::test_a"
    assert not judge(bug(), results([other]), None).caught


@rule("CONF-914")
def test_a_failure_whose_message_names_no_rule_counts_for_the_rules_its_test_cites() -> None:
    bare = failure("free([b, b]) left 2 references, expected 1", ["POOL-107"])
    assert judge(bug(rules=("POOL-107",)), results([bare]), None).caught


@rule("CONF-914")
def test_a_crash_on_an_api_the_adapter_does_not_meet_catches_nothing() -> None:
    crash = {
        "test": "x.py::T::test_a",
        "rules": ["POOL-107"],
        "replay": "E       TypeError: alloc() got an unexpected keyword argument 'sort'\n",
        "failed_after_seconds": 1.0,
    }
    assert named_rules(crash) == set()
    assert not judge(bug(rules=("POOL-107",)), results([crash]), None).caught
    fail = {**crash, "replay": "E       Failed: [RADIX-607] free_group_end without a group was accepted\n"}
    assert named_rules(fail) == {"RADIX-607"}


@rule("CONF-914")
def test_a_known_deviation_counts_only_for_its_own_unfixed_bug() -> None:
    reason = "known deviation: T::t: bug (PFX-305): one block per hash (https://x)"
    known = {"test": "x::t", "rules": ["PFX-305"], "reason": reason, "failed_after_seconds": 3}
    unfixed = bug(rules=("PFX-305",), fixed="")
    assert judge(unfixed, results(known=[known]), None).caught
    by_design = {**known, "reason": "known deviation: T::t: by design (PFX-305): debug builds only (https://x)"}
    assert not judge(unfixed, results(known=[by_design]), None).caught
    another = {**known, "reason": "known deviation: T::t: bug (PFX-305): another one (https://y)"}
    assert not judge(unfixed, results(known=[another]), None).caught, "a deviation of another bug counted"
    assert not judge(bug(rules=("PFX-305",)), results(known=[known]), None).caught, "a fixed bug counted a deviation"


@rule("CONF-914")
def test_the_fix_is_clear_where_the_catching_test_passes_and_nothing_of_this_bug_fails() -> None:
    caught = results([failure("[POOL-106] x", ["POOL-106"])])
    assert judge(bug(), caught, results(POOL_106="passed")).fixed_passes is True
    assert judge(bug(), caught, results(POOL_106="unsupported")).fixed_passes is False
    alarm = judge(bug(), caught, results([failure("[POOL-106] y", ["POOL-106"], test="f::t")], POOL_106="failed"))
    assert alarm.fixed_passes is False and alarm.false_alarms == ("f::t",)
    still: dict[str, Any] = {"test": "k::t", "rules": ["POOL-106"], "reason": "bug (POOL-106): still (https://x)"}
    still["failed_after_seconds"] = 1
    assert judge(bug(), caught, results(known=[still], POOL_106="passed")).fixed_passes is False
    other = {**still, "reason": "bug (POOL-106): another bug of the rule (https://y)"}
    assert judge(bug(), caught, results(known=[other], POOL_106="passed")).fixed_passes is True
    assert judge(bug(fixed=""), caught, None).fixed_passes is None


@rule("CONF-914")
def test_a_second_pass_over_a_release_keeps_what_the_first_pass_ran() -> None:
    """The second pass runs a few tests again; a rule's test that only the first ran still counts, so
    the test that caught a bug on its buggy release is seen passing on the fixed one."""
    main = {**results(EVICT_408="passed"), "seconds": 20.0}
    again = {"rules": {"EVICT-408": {"status": "pass", "tests": {"x.py::T::test_b": "passed"}}}}
    merged = merge_passes(main, {**again, "failures": [], "known_failures": [], "seconds": 5.0})
    assert merged["rules"]["EVICT-408"]["tests"] == {"x.py::T::test_a": "passed", "x.py::T::test_b": "passed"}
    failing = {"rules": {"EVICT-408": {"status": "fail", "tests": {"x.py::T::test_a": "failed"}}}}
    late = failure("[EVICT-408] x", ["EVICT-408"], seconds=2.0)
    merged = merge_passes(main, {**failing, "failures": [late], "known_failures": [], "seconds": 5.0})
    assert merged["rules"]["EVICT-408"] == {"status": "fail", "tests": {"x.py::T::test_a": "failed"}}
    assert merged["failures"][0]["failed_after_seconds"] == 22.0 and merged["seconds"] == 25.0
    hidden = {**results(EVICT_408="xfailed"), "seconds": 20.0}  # a known deviation hid it in the first pass
    merged = merge_passes(
        hidden,
        {
            **again,
            "rules": {"EVICT-408": {"status": "pass", "tests": {"x.py::T::test_a": "passed"}}},
            "failures": [],
            "known_failures": [],
            "seconds": 5.0,
        },
    )
    assert merged["rules"]["EVICT-408"]["tests"] == {"x.py::T::test_a": "passed"}


@rule("CONF-914")
def test_the_table_has_a_row_per_bug_and_the_median_time_to_the_first_failure() -> None:
    first, second = bug(id="a"), bug(id="b", fixed="")
    rows = [
        judge(first, results([failure("[POOL-106] x", ["POOL-106"], 2.0)]), results(POOL_106="passed")).as_json(),
        judge(second, results([failure("[POOL-106] x", ["POOL-106"], 5.0)]), None).as_json(),
    ]
    table = corpus_table(rows, {"a": first, "b": second})
    assert table.count("| vllm | [t](https://x) |") == 2
    assert "| 2.0 s |" in table and "no fix released" in table
    assert "2 of 2 bugs caught; median time to the first failure 3.5 s; 1 of 1 fixed releases pass." in table


@rule("CONF-914")
@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ('id = "x"\n', r"lacks \['title'"),
        (
            'id="x"\ntitle="t"\nbackend="vllm"\nbuggy="0.24.0"\nfixed="0.23.0"\nrules=["POOL-106"]\n'
            'upstream="https://x"\nevidence="e"\n',
            "the fixed release 0.23.0 is not after the buggy one 0.24.0",
        ),
        (
            'id="x"\ntitle="t"\nbackend="vllm"\nbuggy="0.23"\nfixed=""\nrules=[]\nupstream="https://x"\nevidence="e"\n',
            "rules must be a non-empty list",
        ),
        (
            'id="x"\ntitle="t"\nbackend="vllm"\nbuggy="0.23"\nfixed=""\nrules=["A-101"]\nupstream="https://x"\n'
            'evidence="e"\nseverity="high"\n',
            r"unknown fields \['severity'\]",
        ),
    ],
    ids=["missing-fields", "fix-before-bug", "no-rules", "unknown-field"],
)
def test_a_malformed_entry_is_refused_naming_the_file_and_the_entry(tmp_path: Path, entry: str, said: str) -> None:
    (tmp_path / "vllm.toml").write_text("[[bug]]\n" + entry, encoding="utf-8")
    with pytest.raises(ValueError, match=r"vllm\.toml: bug 0 \(x\): " + said):
        load_corpus(tmp_path)


@rule("CONF-914")
def test_bugs_kvref_found_are_listed_as_unreported_until_an_upstream_issue_names_them(tmp_path: Path) -> None:
    (tmp_path / "peer.toml").write_text(
        '[[deviation]]\ntest = "TestPool::test_a"\nreason = "bug (POOL-123): a view"\n'
        'link = "https://github.com/o/r/blob/main/x.py"\n'
        '[[deviation]]\ntest = "TestPool::test_b"\nreason = "bug (RADIX-606): double free"\n'
        'link = "https://github.com/o/r/issues/1"\n'
        '[[deviation]]\ntest = "TestPool::test_c"\nreason = "by design (POOL-101): padding"\n'
        'link = "https://github.com/o/r/blob/main/y.py"\n',
        encoding="utf-8",
    )
    found = unreported_findings(tmp_path)
    assert [(backend, d.test) for backend, d in found] == [("peer", "TestPool::test_a")]
    section = unreported_section(found, {"peer": "1.2.3"})
    assert "### peer: `TestPool::test_a`" in section and "POOL-123" in section and "1.2.3" in section
