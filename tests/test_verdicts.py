"""Verdict files, the verdict matrix and a rule's verdicts in one command (CONF-912).

A verdict file says, per rule a run judged, pass / deviation / fail / not applicable / not run;
``kvref report --verdicts DIR`` renders a directory of them as Markdown and one HTML page, and
``kvref spec show RULE`` prints the tests citing a rule and every verdict on it.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from kvref.cli.main import main
from kvref_conformance.verdicts import verdict_document, verdict_file_name, write_verdicts

rule = pytest.mark.rule

DEVIATION = "known deviation: TestPool::test_free: scatter release (https://example.org/issues/1)"
LACKS = "mypool lacks 'events': records KV events (PFX-315)"

TESTS: dict[str, dict[str, Any]] = {
    "s::test_a": {"rules": ["POOL-105", "POOL-106"], "outcome": "passed"},
    "s::test_b": {"rules": ["POOL-106"], "outcome": "failed"},
    "s::test_c": {"rules": ["POOL-107"], "outcome": "xfailed", "reason": DEVIATION},
    "s::test_d": {"rules": ["POOL-107"], "outcome": "passed"},
    "s::test_e": {"rules": ["PFX-315"], "outcome": "unsupported", "reason": LACKS},
    "s::test_f": {"rules": ["POOL-108"], "outcome": "blocked", "reason": "prerequisite failed: POOL-106"},
    "s::test_g": {"rules": ["POOL-105"], "outcome": "unsupported", "reason": LACKS},
}
IMPLEMENTATION = {"name": "mypool", "version": "1.2", "device": "host", "profile": "exact-order", "capabilities": []}


@rule("CONF-912")
def test_each_rule_gets_the_verdict_its_tests_decide() -> None:
    doc = verdict_document(IMPLEMENTATION, TESTS, "ci")
    rules = doc["rules"]
    assert rules["POOL-105"] == {"verdict": "pass", "tests": ["s::test_a"]}, "a test of a missing capability aside"
    assert rules["POOL-106"] == {"verdict": "fail", "tests": ["s::test_b"]}, "one failing test fails the rule"
    assert rules["POOL-107"]["verdict"] == "deviation"
    assert rules["POOL-107"]["reasons"] == [{"reason": "scatter release", "link": "https://example.org/issues/1"}]
    assert rules["PFX-315"] == {"verdict": "not applicable", "reasons": [{"reason": LACKS}]}
    assert rules["POOL-108"] == {"verdict": "not run", "reasons": [{"reason": "prerequisite failed: POOL-106"}]}
    assert doc["counts"] == {"fail": 1, "deviation": 1, "pass": 1, "not applicable": 1, "not run": 1}
    assert "timestamp" not in doc and "machine" not in doc, "the same run must make the same file"
    assert verdict_file_name(doc["implementation"]) == "mypool-host@1.2.json"
    assert verdict_file_name({"name": "cupy", "device": "cuda:0", "version": "14.2.0"}) == "cupy-cuda_0@14.2.0.json"


class Cells(HTMLParser):
    """The page's table cells, its links and its anchors."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.anchors: set[str] = set()
        self.rows = 0
        self.filter_box = False
        self.script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "a" and (found.get("href") or "").startswith("#"):
            self.links.append(str(found["href"])[1:])
        if found.get("id"):
            self.anchors.add(str(found["id"]))
        self.rows += tag == "tr"
        self.filter_box |= tag == "input" and found.get("id") == "filter"
        self.script |= tag == "script"


@rule("CONF-912")
def test_report_renders_the_matrix_as_markdown_and_one_html_page_whose_marked_cells_link_their_reasons(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = {**IMPLEMENTATION, "name": "otherpool", "version": "0.9"}
    write_verdicts(tmp_path, [verdict_document(IMPLEMENTATION, TESTS, "ci"), verdict_document(other, TESTS, "ci")])
    (tmp_path / "unjudged.toml").write_text(
        '[[implementation]]\nname = "farpool"\nversion = "3"\nreason = "ImportError: no GPU"\n', encoding="utf-8"
    )
    assert main(["report", "--verdicts", str(tmp_path)]) == 0
    markdown = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "| mypool 1.2 (host) | `mypool-host@1.2.json` | 1 | 1 | 1 | 1 | 1 |" in markdown, markdown
    assert "| POOL-105 | ✓ | ✓ |" in markdown and "## 01-pool" in markdown
    assert "scatter release ([upstream](https://example.org/issues/1))" in markdown
    assert markdown.rstrip().endswith("## Not judged here\n\n- **farpool 3**: ImportError: no GPU"), markdown[-300:]
    page = Cells()
    page.feed((tmp_path / "index.html").read_text(encoding="utf-8"))
    assert page.filter_box and page.script, "the page filters its rows with a few lines of script"
    assert page.rows == 1 + 5, "a header and one row per judged rule"
    assert len(page.links) == 4 and set(page.links) <= page.anchors, "each fail and deviation cell links its reason"


@rule("CONF-912")
def test_spec_show_prints_the_tests_citing_a_rule_and_every_verdict_on_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_verdicts(tmp_path, [verdict_document(IMPLEMENTATION, TESTS, "ci")])
    assert main(["spec", "show", "POOL-107", "--verdicts", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("POOL-107 (01-pool, MUST):"), out
    assert "tests citing it:" in out and "::test_" in out
    assert "mypool 1.2 (host): deviation: scatter release (https://example.org/issues/1)" in out, out
    assert main(["spec", "show", "POOL-106", "--verdicts", str(tmp_path), "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)
    assert shown["id"] == "POOL-106" and shown["tests"]
    assert shown["verdicts"] == [{"implementation": "mypool 1.2 (host)", "verdict": "fail", "tests": ["s::test_b"]}]


@rule("CONF-912")
def test_the_committed_verdicts_cover_the_oracle_torch_and_cupy_and_their_matrix_is_current() -> None:
    directory = Path(__file__).resolve().parent.parent / "results" / "verdicts"
    names = {p.name.split("@")[0] for p in directory.glob("*.json")}
    assert {"oracle-host", "torch-cpu", "cupy-host"} <= names, names
    from kvref.cli.commands import spec_rules
    from kvref.reports.verdicts import load_unjudged, load_verdicts, render_verdict_markdown

    rules = spec_rules(directory.parent.parent / "spec")
    rendered = render_verdict_markdown(load_verdicts(directory), rules, load_unjudged(directory))
    assert (directory / "README.md").read_text(encoding="utf-8") == rendered, "rerun `kvref report --verdicts`"


@rule("CONF-912")
def test_a_deviation_of_one_rule_in_a_test_citing_many_is_that_rules_deviation_only() -> None:
    machine = "known deviation: TestStateful::test_cache: bug: a second BlockStored (PFX-317) (https://example.org/2)"
    tests = {
        "s::test_cache": {"rules": ["PFX-317", "POOL-105", "EVICT-401"], "outcome": "xfailed", "reason": machine},
        "s::test_evict": {"rules": ["EVICT-401"], "outcome": "passed"},
    }
    rules = verdict_document(IMPLEMENTATION, tests, "ci")["rules"]
    assert rules["PFX-317"]["verdict"] == "deviation"
    assert rules["EVICT-401"] == {"verdict": "pass", "tests": ["s::test_evict"]}, "judged by the test that ran"
    assert rules["POOL-105"] == {
        "verdict": "not run",
        "reasons": [{"reason": "its test stopped at a known deviation of PFX-317"}],
    }
