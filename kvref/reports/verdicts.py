"""The verdict matrix: every rule down, every implementation and version across, one symbol a cell.

Reads the verdict files a conformance run writes with ``--verdicts`` (``<name>-<device>@<version>.json``,
see ``kvref_conformance.verdicts``) and renders them as Markdown (``README.md``, chapter by chapter,
a legend, the counts per implementation, then each failure and deviation with its reason and
link) and as one self-contained HTML page of the same table with a filter box (no server, no
network: plain HTML and a few lines of script). ``kvref report --verdicts DIR`` writes both into DIR.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "SYMBOLS",
    "column_name",
    "load_unjudged",
    "load_verdicts",
    "render_verdict_markdown",
    "render_verdict_page",
    "verdicts_on",
]

#: One symbol per verdict, as the matrix prints it.
SYMBOLS = {"pass": "✓", "fail": "✗", "deviation": "~", "not applicable": "-", "not run": "·"}
_ORDER = ("pass", "deviation", "fail", "not applicable", "not run")


def load_verdicts(directory: Path) -> list[dict[str, Any]]:
    """Every verdict file in ``directory``, by implementation, device and file name; each with ``_file``."""
    docs = []
    for path in sorted(directory.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and doc.get("format") == 1 and "rules" in doc and "counts" in doc:
            doc["_file"] = path.name
            docs.append(doc)
    return sorted(docs, key=lambda d: (d["implementation"]["name"], d["implementation"]["device"], d["_file"]))


def column_name(doc: dict[str, Any]) -> str:
    """An implementation's column: ``name version (device)``."""
    impl = doc["implementation"]
    return f"{impl['name']} {impl['version']} ({impl['device']})"


def verdicts_on(rule_id: str, docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """``(column, verdict)`` of every implementation that judged ``rule_id``."""
    return [(column_name(d), d["rules"][rule_id]) for d in docs if rule_id in d["rules"]]


def _rules(docs: list[dict[str, Any]], spec_rules: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """The judged rules by chapter, in the spec's order (rules the spec does not know last, by id)."""
    judged = {r for d in docs for r in d["rules"]}
    order = {rid: i for i, rid in enumerate(spec_rules)}
    chapters: dict[str, list[str]] = {}
    for rid in sorted(judged, key=lambda r: (order.get(r, len(order)), r)):
        chapter = spec_rules.get(rid, {}).get("chapter", "rules the spec does not list")
        chapters.setdefault(chapter, []).append(rid)
    return chapters


def _anchor(rule_id: str, column: int) -> str:
    return f"{rule_id.lower()}-{column}"


def _explanation(verdict: dict[str, Any]) -> str:
    """A failure's tests, or a deviation's reasons with their links, in one line of Markdown."""
    if verdict["verdict"] == "fail":
        return "failed: " + ", ".join(f"`{t.rsplit('::', 1)[-1]}`" for t in verdict.get("tests", []))
    return "; ".join(
        r["reason"] + (f" ([upstream]({r['link']}))" if r.get("link") else "") for r in verdict.get("reasons", [])
    )


def load_unjudged(directory: Path) -> list[dict[str, str]]:
    """The implementations ``directory/unjudged.toml`` lists as not judged here, each with ``name``,
    ``version`` and ``reason`` (what failed, in its own words); none when there is no such file."""
    import tomllib

    path = directory / "unjudged.toml"
    if not path.exists():
        return []
    return [
        {key: str(entry[key]) for key in ("name", "version", "reason")}
        for entry in tomllib.loads(path.read_text(encoding="utf-8")).get("implementation", [])
    ]


def render_verdict_markdown(
    docs: list[dict[str, Any]], spec_rules: dict[str, dict[str, Any]], unjudged: Sequence[dict[str, str]] = ()
) -> str:
    """The matrix as Markdown: legend, counts, one table per chapter, then failures and deviations,
    then the implementations not judged here and why (``unjudged``, from :func:`load_unjudged`)."""
    columns = [column_name(d) for d in docs]
    legend = ", ".join(f"{SYMBOLS[v]} {v}" for v in _ORDER)
    lines = [
        "# kvref verdicts",
        "",
        "Each implementation's verdict on every rule its conformance run judged, from the files in this",
        "directory (`kvref conformance --verdicts DIR` writes them; `kvref report --verdicts DIR` renders",
        "them; `kvref spec show RULE` prints one rule's). A blank cell: the run judged no test of that rule.",
        "",
        f"Legend: {legend}.",
        "",
        "| implementation | file | " + " | ".join(_ORDER) + " |",
        "|---|---|" + "---:|" * len(_ORDER),
    ]
    for doc, column in zip(docs, columns, strict=True):
        counts = " | ".join(str(doc["counts"].get(v, 0)) for v in _ORDER)
        lines.append(f"| {column} | `{doc['_file']}` | {counts} |")
    notes: list[str] = []
    for chapter, rules in _rules(docs, spec_rules).items():
        lines += ["", f"## {chapter}", "", "| rule | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
        for rid in rules:
            cells = []
            for i, doc in enumerate(docs):
                verdict = doc["rules"].get(rid)
                if verdict is None:
                    cells.append("")
                    continue
                symbol = SYMBOLS[verdict["verdict"]]
                if verdict["verdict"] in ("fail", "deviation"):
                    cells.append(f"[{symbol}](#{_anchor(rid, i)})")
                    notes.append(
                        f'- <a id="{_anchor(rid, i)}"></a>**{rid}**, {columns[i]}: {verdict["verdict"]}; '
                        + _explanation(verdict)
                    )
                else:
                    cells.append(symbol)
            lines.append(f"| {rid} | " + " | ".join(cells) + " |")
    if notes:
        lines += ["", "## Failures and deviations", "", *notes]
    if unjudged:
        lines += ["", "## Not judged here", ""]
        lines += [f"- **{u['name']} {u['version']}**: {u['reason']}" for u in unjudged]
    return "\n".join(lines) + "\n"


_SCRIPT = """
const box = document.getElementById("filter");
box.addEventListener("input", () => {
  const words = box.value.toLowerCase().split(/\\s+/).filter(Boolean);
  for (const row of document.querySelectorAll("tbody tr")) {
    const text = row.textContent.toLowerCase();
    row.hidden = !words.every((w) => text.includes(w));
  }
});
"""

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: center; }
td.rule, td.text { text-align: left; }
td.text { max-width: 40em; font-size: 12px; color: #444; }
td.fail { background: #fdd; } td.deviation { background: #ffd; } td.pass { background: #dfd; }
"""


def render_verdict_page(docs: list[dict[str, Any]], spec_rules: dict[str, dict[str, Any]]) -> str:
    """The matrix as one self-contained HTML page: a filter box over the rows (rule, chapter, text,
    verdicts), each failing or deviating cell linking to its reason below the table."""
    columns = [column_name(d) for d in docs]
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    rows: list[str] = []
    notes: list[str] = []
    for chapter, rules in _rules(docs, spec_rules).items():
        for rid in rules:
            cells = []
            for i, doc in enumerate(docs):
                verdict = doc["rules"].get(rid)
                if verdict is None:
                    cells.append("<td></td>")
                    continue
                kind = verdict["verdict"]
                symbol = esc(SYMBOLS[kind])
                css = kind.replace(" ", "-")
                if kind in ("fail", "deviation"):
                    anchor = _anchor(rid, i)
                    cells.append(f'<td class="{css}" title="{esc(kind)}"><a href="#{anchor}">{symbol}</a></td>')
                    reasons = "; ".join(
                        esc(r["reason"]) + (f' (<a href="{esc(r["link"])}">upstream</a>)' if r.get("link") else "")
                        for r in verdict.get("reasons", [])
                    ) or "failed: " + esc(", ".join(verdict.get("tests", [])))
                    notes.append(f'<li id="{anchor}"><b>{esc(rid)}</b>, {esc(columns[i])}: {esc(kind)}; {reasons}</li>')
                else:
                    cells.append(f'<td class="{css}" title="{esc(kind)}">{symbol}</td>')
            text = esc(spec_rules.get(rid, {}).get("text", ""))
            rows.append(
                f'<tr><td class="rule">{esc(rid)}</td><td>{esc(chapter)}</td><td class="text">{text}</td>'
                + "".join(cells)
                + "</tr>"
            )
    legend = ", ".join(f"{esc(SYMBOLS[v])} {esc(v)}" for v in _ORDER)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8"><title>kvref verdicts</title>',
            f"<style>{_STYLE}</style></head><body>",
            "<h1>kvref verdicts</h1>",
            f"<p>Legend: {legend}. Type to keep the rows whose rule, chapter, text or verdicts hold every word.</p>",
            '<p><input id="filter" type="search" placeholder="filter: RADIX-624, eviction, ✗ ..." size="40"></p>',
            f"<table><thead><tr><th>rule</th><th>chapter</th><th>text</th>{head}</tr></thead>",
            "<tbody>",
            *rows,
            "</tbody></table>",
            "<h2>Failures and deviations</h2>",
            "<ul>",
            *notes,
            "</ul>",
            f"<script>{_SCRIPT}</script>",
            "</body></html>",
            "",
        ]
    )
