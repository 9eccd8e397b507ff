"""The spec as data: parse the chapters, lint rule ids, write ``rules.json``, check test coverage.

A rule is a paragraph of a chapter ``spec/NN-name.md`` that starts with ``**PREFIX-NNN**`` and
holds exactly one RFC 2119 keyword (SPEC-001, SPEC-002). ``nox -s spec`` (``kvref spec check``)
runs :func:`lint`, writes the index (:func:`build_index`) and reports coverage: rules no test
cites and tests citing unknown rules (:func:`coverage`).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Chapter",
    "CoverageReport",
    "Rule",
    "build_index",
    "code_rule_refs",
    "coverage",
    "lint",
    "parse_spec",
    "collect_rule_citations",
]

RULE_ID = re.compile(r"\b([A-Z]{2,10})-(\d{3,4})\b")
_RULE_START = re.compile(r"^\*\*(?P<id>[^*]+)\*\*\s+(?P<text>\S.*)$")
_WELL_FORMED = re.compile(r"^[A-Z]{2,10}-\d{3,4}$")
_KEYWORD = re.compile(r"\b(MUST NOT|MUST|SHALL NOT|SHALL|SHOULD NOT|SHOULD|REQUIRED|RECOMMENDED|MAY|OPTIONAL)\b")
_CHAPTER_FILE = re.compile(r"^(\d{2})-[a-z0-9-]+\.md$")
_LEVELS = {
    "SHALL": "MUST",
    "REQUIRED": "MUST",
    "SHALL NOT": "MUST NOT",
    "RECOMMENDED": "SHOULD",
    "OPTIONAL": "MAY",
}


@dataclass(frozen=True)
class Rule:
    """One rule: id, chapter file stem, RFC 2119 level, text and the text's SHA-256."""

    id: str
    chapter: str
    level: str
    text: str

    @property
    def sha256(self) -> str:
        """SHA-256 of the rule text, whitespace-normalized."""
        return hashlib.sha256(" ".join(self.text.split()).encode()).hexdigest()


@dataclass
class Chapter:
    """One chapter file: number, declared prefixes, status, rules and raw problems found."""

    path: Path
    number: int
    prefixes: tuple[str, ...]
    status: str
    text: str
    rules: list[Rule] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def normative(self) -> bool:
        """Whether the chapter's rules are in force (not 'scope only')."""
        return self.status.startswith("normative")


def _paragraphs(text: str) -> Iterable[tuple[int, str]]:
    start, lines = 0, []  # type: tuple[int, list[str]]
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            if not lines:
                start = number
            lines.append(line.strip())
        elif lines:
            yield start, " ".join(lines)
            lines = []
    if lines:
        yield start, " ".join(lines)


def _parse_chapter(path: Path) -> Chapter | None:
    match = _CHAPTER_FILE.match(path.name)
    if match is None:
        return None
    text = path.read_text(encoding="utf-8")
    prefixes_m = re.search(r"^Rule prefix(?:es)?:\s*(.+)$", text, re.M)
    status_m = re.search(r"^Status:\s*(.+)$", text, re.M)
    chapter = Chapter(
        path=path,
        number=int(match.group(1)),
        prefixes=tuple(p.strip() for p in prefixes_m.group(1).split(",")) if prefixes_m else (),
        status=status_m.group(1).strip() if status_m else "",
        text=text,
    )
    where = path.name
    if not prefixes_m:
        chapter.problems.append(f"{where}: no 'Rule prefix:' line")
    if not status_m:
        chapter.problems.append(f"{where}: no 'Status:' line")
    elif chapter.normative and "## Implementation-defined" not in text:
        chapter.problems.append(f"{where}: normative chapter without an '## Implementation-defined' section")
    in_code = False
    for line_no, para in _paragraphs(text):
        if para.startswith("```"):
            in_code = not in_code
        if in_code or para.startswith("|") or para.startswith("#"):
            continue
        start = _RULE_START.match(para)
        keywords = _KEYWORD.findall(para)
        if start is None:
            if keywords:
                chapter.problems.append(
                    f"{where}:{line_no}: normative keyword {keywords[0]} outside a rule (give it an id)"
                )
            continue
        rule_id, body = start.group("id"), start.group("text")
        if not _WELL_FORMED.match(rule_id):
            chapter.problems.append(f"{where}:{line_no}: malformed rule id {rule_id!r} (want PREFIX-NNN)")
            continue
        prefix, num = rule_id.split("-")
        if prefix not in chapter.prefixes:
            chapter.problems.append(
                f"{where}:{line_no}: {rule_id} has prefix {prefix}, chapter declares {list(chapter.prefixes)}"
            )
        if int(num) // 100 != chapter.number:
            chapter.problems.append(
                f"{where}:{line_no}: {rule_id} numbered outside chapter {chapter.number:02d} ({chapter.number}xx)"
            )
        if len(keywords) != 1:
            chapter.problems.append(
                f"{where}:{line_no}: {rule_id} has {len(keywords)} RFC 2119 keywords {keywords}; a rule has exactly one"
            )
            continue
        level = _LEVELS.get(keywords[0], keywords[0])
        chapter.rules.append(Rule(rule_id, path.stem, level, body))
    return chapter


def parse_spec(spec_dir: Path) -> list[Chapter]:
    """Every chapter of ``spec_dir``, in file order."""
    return [c for p in sorted(spec_dir.glob("*.md")) if (c := _parse_chapter(p)) is not None]


def lint(chapters: list[Chapter], previous_index: Path | None = None) -> list[str]:
    """Every form problem of the spec: malformed, duplicate, missing and removed ids (SPEC-00x)."""
    problems = [p for c in chapters for p in c.problems]
    seen: dict[str, str] = {}
    for chapter in chapters:
        for rule in chapter.rules:
            if rule.id in seen:
                problems.append(f"{chapter.path.name}: duplicate rule id {rule.id} (also in {seen[rule.id]})")
            seen[rule.id] = chapter.path.name
    prefixes = {p for c in chapters for p in c.prefixes}
    for chapter in chapters:
        for m in RULE_ID.finditer(chapter.text):
            rid = m.group(0)
            if m.group(1) in prefixes and rid not in seen:
                problems.append(f"{chapter.path.name}: refers to {rid}, which no chapter defines")
    if previous_index is not None and previous_index.is_file():
        old = json.loads(previous_index.read_text(encoding="utf-8"))
        for entry in old.get("rules", []):
            if entry["id"] not in seen:
                problems.append(
                    f"rule {entry['id']} is in {previous_index.name} but no longer in the spec; "
                    "ids are never removed (SPEC-003): keep it and mark it '(withdrawn)'"
                )
    return problems


def build_index(chapters: list[Chapter]) -> dict[str, object]:
    """The content of ``spec/rules.json``."""
    return {
        "format": 1,
        "chapters": [{"chapter": c.path.stem, "prefixes": list(c.prefixes), "status": c.status} for c in chapters],
        "rules": [
            {"id": r.id, "chapter": r.chapter, "level": r.level, "sha256": r.sha256, "text": r.text}
            for c in chapters
            for r in c.rules
        ],
    }


def _is_rule_mark(node: ast.expr, aliases: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in aliases
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "rule"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
    )


def _rule_args(call: ast.Call, aliases: set[str]) -> list[str]:
    if not _is_rule_mark(call.func, aliases):
        return []
    return [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def _rule_aliases(tree: ast.Module) -> set[str]:
    """Names a module uses for ``pytest.mark.rule``: a module-level alias (``rule = pytest.mark.rule``),
    or ``rule`` imported from ``kvref_conformance``."""
    aliases = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign) and _is_rule_mark(node.value, set())
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    # ``from kvref_conformance.suites.base import rule`` brings the same alias in.
    aliases |= {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvref_conformance")
        for alias in node.names
        if alias.name == "rule"
    }
    return aliases


def _python_files(paths: Iterable[Path]) -> Iterator[tuple[Path, ast.Module]]:
    for root in paths:
        for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def collect_rule_citations(paths: Iterable[Path]) -> dict[str, list[str]]:
    """``{rule id: [file, ...]}``, a file once per ``pytest.mark.rule(...)`` naming the rule under ``paths``.

    Also understands a module-level alias (``rule = pytest.mark.rule``), or ``rule`` imported from
    ``kvref_conformance``, used as ``@rule("ID")``.
    """
    cited: dict[str, list[str]] = {}
    for path, tree in _python_files(paths):
        aliases = _rule_aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for rid in _rule_args(node, aliases):
                    cited.setdefault(rid, []).append(str(path))
    return cited


def collect_rule_tests(paths: Iterable[Path]) -> dict[str, list[str]]:
    """``{rule id: ["file::Class::test", ...]}``: the test functions (and classes) whose decorators cite
    each rule under ``paths``, as :func:`collect_rule_citations` reads the marks."""
    tests: dict[str, list[str]] = {}

    def visit(node: ast.AST, prefix: str, aliases: set[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}::{child.name}"
                for decorator in child.decorator_list:
                    if isinstance(decorator, ast.Call):
                        for rid in _rule_args(decorator, aliases):
                            tests.setdefault(rid, []).append(name)
                visit(child, name, aliases)

    for path, tree in _python_files(paths):
        visit(tree, str(path), _rule_aliases(tree))
    return tests


@dataclass
class CoverageReport:
    """Rules without a test, by level, and cited ids that no rule has."""

    untested: dict[str, list[str]]
    unknown: dict[str, list[str]]

    def failing(self) -> list[str]:
        """MUST and MUST NOT rules of normative chapters with no test, and unknown citations."""
        return self.untested.get("MUST", []) + self.untested.get("MUST NOT", []) + sorted(self.unknown)


def coverage(chapters: list[Chapter], cited: dict[str, list[str]]) -> CoverageReport:
    """Compare the rules of normative chapters with the rules tests cite."""
    known = {r.id: r for c in chapters for r in c.rules}
    untested: dict[str, list[str]] = {}
    for chapter in chapters:
        if not chapter.normative:
            continue
        for rule in chapter.rules:
            if rule.id not in cited:
                untested.setdefault(rule.level, []).append(rule.id)
    unknown = {rid: where for rid, where in cited.items() if rid not in known}
    return CoverageReport(untested, unknown)


def code_rule_refs(paths: Iterable[Path], chapters: list[Chapter]) -> dict[str, list[str]]:
    """Rule ids that source code cites (in strings) but the spec does not define."""
    known = {r.id for c in chapters for r in c.rules}
    prefixes = {p for c in chapters for p in c.prefixes}
    bad: dict[str, list[str]] = {}
    for root in paths:
        for path in sorted(root.rglob("*.py")):
            for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for m in RULE_ID.finditer(line):
                    if m.group(1) in prefixes and m.group(0) not in known:
                        bad.setdefault(m.group(0), []).append(f"{path}:{line_no}")
    return bad
