"""The spec's own form (SPEC-00x): the linter finds each kind of mistake; the real spec is clean."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvref.cli.speclint import build_index, collect_rule_citations, coverage, lint, parse_spec

rule = pytest.mark.rule
ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec"

HEADER = "# 01 Pool\n\nRule prefix: POOL\nStatus: normative\n\n## Implementation-defined\n\n"


def lint_text(tmp_path: Path, body: str, header: str = HEADER) -> list[str]:
    (tmp_path / "01-pool.md").write_text(header + body)
    return lint(parse_spec(tmp_path))


@rule("SPEC-001", "SPEC-002", "SPEC-003")
def test_the_real_spec_lints_clean_and_rules_json_is_current() -> None:
    chapters = parse_spec(SPEC)
    assert lint(chapters, SPEC / "rules.json") == []
    index = json.loads((SPEC / "rules.json").read_text())
    assert index == json.loads(json.dumps(build_index(chapters))), "spec/rules.json is stale: run `nox -s spec`"


@rule("SPEC-001")
@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ("**POOL-1** Pools MUST work.\n", "malformed"),
        ("**PFX-101** Pools MUST work.\n", "prefix"),
        ("**POOL-201** Pools MUST work.\n", "outside chapter"),
        ("**POOL-101** Pools MUST work.\n\n**POOL-101** Pools MUST NOT fail.\n", "duplicate"),
        ("**POOL-101** Pools MUST work, see POOL-199.\n", "POOL-199"),
    ],
)
def test_the_linter_finds_bad_ids(tmp_path: Path, body: str, complaint: str) -> None:
    problems = lint_text(tmp_path, body)
    assert any(complaint in p for p in problems), f"expected a complaint about {complaint!r}, got {problems}"


@rule("SPEC-002")
@pytest.mark.parametrize("body", ["**POOL-101** Pools work.\n", "**POOL-101** Pools MUST work and MAY rest.\n"])
def test_a_rule_has_exactly_one_rfc_2119_keyword(tmp_path: Path, body: str) -> None:
    assert any("RFC 2119" in p for p in lint_text(tmp_path, body))


@rule("SPEC-002")
def test_a_normative_sentence_without_an_id_is_flagged(tmp_path: Path) -> None:
    problems = lint_text(tmp_path, "Pools MUST work.\n")
    assert any("outside a rule" in p for p in problems), problems


@rule("SPEC-002")
def test_levels_are_read_from_the_keyword(tmp_path: Path) -> None:
    (tmp_path / "01-pool.md").write_text(HEADER + "**POOL-101** Pools SHOULD NOT stall.\n")
    [chapter] = parse_spec(tmp_path)
    assert chapter.rules[0].level == "SHOULD NOT"


@rule("SPEC-003")
def test_a_published_id_may_not_disappear(tmp_path: Path) -> None:
    (tmp_path / "rules.json").write_text(json.dumps({"rules": [{"id": "POOL-102"}]}))
    (tmp_path / "01-pool.md").write_text(HEADER + "**POOL-101** Pools MUST work.\n")
    problems = lint(parse_spec(tmp_path), tmp_path / "rules.json")
    assert any("POOL-102" in p and "never removed" in p for p in problems), problems


@rule("SPEC-001")
def test_a_normative_chapter_needs_an_implementation_defined_section(tmp_path: Path) -> None:
    header = "# 01 Pool\n\nRule prefix: POOL\nStatus: normative\n\n"
    assert any("Implementation-defined" in p for p in lint_text(tmp_path, "**POOL-101** X MUST y.\n", header))


@rule("SPEC-001")
def test_every_must_rule_of_a_normative_chapter_is_cited_by_a_test() -> None:
    chapters = parse_spec(SPEC)
    cited = collect_rule_citations([ROOT / "tests", ROOT / "conformance"])
    report = coverage(chapters, cited)
    assert report.failing() == [], f"untested MUST rules or unknown citations: {report.failing()}"
