"""``kvref report``: conformance results and benchmark runs rendered as one Markdown report.

Conformance: rows are spec chapters (rule families), columns implementations; a cell says
``pass``, ``partial (n/m)``, ``fail``, ``unsupported`` or ``-`` (not run). Below the matrix, per
implementation: its version, device, profile, state-machine speed, and each failure with the
rules it names and the first lines of its replay.

Benchmarks (pytest-benchmark JSON from ``nox -s bench``): per workload, the median time per
round and per block of each backend and its ratio against the oracle, with the machine and
package versions the run recorded; with ``--out``, plots of each run (:mod:`kvref.reports.bench_plots`).

Replays (``replay.json`` from ``kvref replay --out``): per file, the hit rates, evictions and
speed of every run, and the file's hit-rate plot when it sits beside it.

Each conformance and benchmark file says which machine recorded it (:func:`machine_of`); a report
never puts runs of two machines in one table (:func:`by_machine`), so a CPU run of the oracle is
never set beside a GPU run of CuPy as if they raced.
"""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path
from typing import Any

from kvref.contract.errors import InvalidValueError

__all__ = [
    "by_machine",
    "json_documents",
    "machine_of",
    "this_machine",
    "load_benchmarks",
    "load_replays",
    "load_results",
    "render_benchmarks",
    "render_matrix",
    "render_replays",
]

_MARK = {"pass": "pass", "fail": "**fail**", "unsupported": "unsupported", "blocked": "blocked"}


def json_documents(paths: list[Path]) -> list[tuple[Path, Any]]:
    """``(file, parsed JSON)`` for each file given and each ``*.json`` in each directory given."""
    files: list[Path] = []
    for path in paths:
        files.extend(sorted(path.glob("*.json")) if path.is_dir() else [path])
    documents = []
    for file in files:
        try:
            documents.append((file, json.loads(file.read_text(encoding="utf-8"))))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            why = f"{exc.msg} at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
            raise InvalidValueError("CONF-912", f"{file} is not a results file of kvref's: {why}") from None
    return documents


def this_machine() -> str:
    """This machine as results files name it: its host name and platform."""
    return f"{platform.node()} ({platform.platform()})"


def machine_of(doc: Any) -> str:
    """The machine that recorded a conformance or benchmark document, as :func:`this_machine` names it;
    ``"an unnamed machine"`` for a file that does not say (results written before files named it)."""
    if isinstance(doc, dict):
        machine = doc.get("machine")
        if isinstance(machine, dict) and "node" in machine:
            return f"{machine['node']} ({machine.get('platform', '?')})"
        info = doc.get("machine_info")
        if isinstance(info, dict) and "node" in info:
            return f"{info['node']} ({info.get('kvref_platform', '?')})"
    return "an unnamed machine"


def by_machine(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """``docs`` grouped by the machine that recorded them, this machine first, the rest by name."""
    here = this_machine()
    groups: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        groups.setdefault(machine_of(doc), []).append(doc)
    return {m: groups[m] for m in sorted(groups, key=lambda m: (m != here, m))}


def load_results(paths: list[Path], documents: list[tuple[Path, Any]] | None = None) -> list[dict[str, Any]]:
    """Every conformance results file among ``documents`` (default: read from ``paths``), by name."""
    docs = []
    for file, doc in json_documents(paths) if documents is None else documents:
        if isinstance(doc, dict) and "implementation" in doc and "chapters" in doc:
            doc["_file"] = str(file)
            docs.append(doc)
    return sorted(docs, key=lambda d: str(d["implementation"]["name"]))


def _cell(chapter: dict[str, Any] | None) -> str:
    if chapter is None:
        return "-"
    status = str(chapter["status"])
    if status == "fail":
        return f"**fail** ({chapter['covered']}/{chapter['total']})"
    if status == "partial":
        return f"partial ({chapter['covered']}/{chapter['total']})"
    return _MARK.get(status, status)


def render_matrix(docs: list[dict[str, Any]], *, machine: str | None = None) -> str:
    """The Markdown conformance matrix of ``docs``, all recorded on ``machine`` when it is named."""
    title = "# kvref conformance matrix" + (f" on {machine}" if machine else "")
    if not docs:
        return f"{title}\n\nNo results files found.\n"
    names = [str(d["implementation"]["name"]) for d in docs]
    chapters = sorted({c for d in docs for c in d["chapters"]})
    lines = [title, "", "| chapter | " + " | ".join(names) + " |"]
    lines.append("|---|" + "---|" * len(names))
    for chapter in chapters:
        cells = [_cell(d["chapters"].get(chapter)) for d in docs]
        lines.append(f"| {chapter} | " + " | ".join(cells) + " |")
    totals = []
    for d in docs:
        rules = d["rules"]
        passed = sum(1 for r in rules.values() if r["status"] == "pass")
        totals.append(f"{passed}/{len(rules)}")
    lines.append("| rules passed | " + " | ".join(totals) + " |")
    for d in docs:
        impl = d["implementation"]
        lines += ["", f"## {impl['name']}" + (f" on {machine}" if machine else ""), ""]
        lines.append(
            f"version {impl['version']}, device {impl['device']}, profile {impl['profile']}, "
            f"Hypothesis profile {d['hypothesis_profile']}; tests: "
            + ", ".join(f"{k} {v}" for k, v in sorted(d["summary"].items()))
        )
        for name, run in sorted(d.get("state_machines", {}).items()):
            lines.append(f"- state machine `{name}`: {run['steps']} steps, {run['steps_per_second']:,} steps/s")
        for failure in d["failures"]:
            named = sorted(set(re.findall(r"\[([A-Z]+-\d{3})\]", failure["replay"])))
            first = next((ln.strip() for ln in failure["replay"].splitlines() if "Error" in ln), "")
            lines.append(f"- **fail** `{failure['test']}` ({', '.join(named or failure['rules'])}): {first[:200]}")
        for deviation in d.get("unmatched_deviations", []):
            lines.append(f"- known deviation matching no test: {deviation}")
    return "\n".join(lines) + "\n"


def load_benchmarks(paths: list[Path], documents: list[tuple[Path, Any]] | None = None) -> list[dict[str, Any]]:
    """Every pytest-benchmark run among ``documents`` (default: read from ``paths``)."""
    out = []
    for file, doc in json_documents(paths) if documents is None else documents:
        if isinstance(doc, dict) and isinstance(doc.get("benchmarks"), list):
            doc["_file"] = str(file)
            out.append(doc)
    return out


def _bench_key(bench: dict[str, Any]) -> str:
    info = bench.get("extra_info", {})
    params = {k: v for k, v in (bench.get("params") or {}).items() if k != "backend"}
    label = str(info.get("workload", bench["name"].split("[")[0]))
    extras = [f"{k}={v}" for k, v in sorted(params.items()) if f"[{v}]" not in label]
    return label + (f" ({', '.join(extras)})" if extras else "")


def render_benchmarks(docs: list[dict[str, Any]]) -> str:
    """Markdown tables: median per round and per block, by workload and backend, ratio to the oracle."""
    lines = ["# kvref benchmarks", ""]
    for doc in docs:
        machine = doc.get("machine_info", {})
        cpu = machine.get("cpu", {}).get("brand_raw", "?")
        lines.append(
            f"From `{doc['_file']}`: Python {machine.get('python_version', '?')}, {cpu}, "
            f"packages {machine.get('kvref_packages', {})}, backends {machine.get('kvref_backends', {})}."
        )
        rows: dict[str, dict[str, tuple[float, int]]] = {}
        for bench in doc["benchmarks"]:
            info = bench.get("extra_info", {})
            backend = str(info.get("backend", "?"))
            rows.setdefault(_bench_key(bench), {})[backend] = (
                float(bench["stats"]["median"]),
                int(info.get("blocks_per_round", 1)),
            )
        backends = sorted({b for r in rows.values() for b in r}, key=lambda b: (b != "oracle", b))
        lines += ["", "| workload | " + " | ".join(f"{b}: us/round, us/block, x oracle" for b in backends) + " |"]
        lines.append("|---|" + "---|" * len(backends))
        for key in sorted(rows):
            cells = []
            base = rows[key].get("oracle")
            for b in backends:
                if b not in rows[key]:
                    cells.append("-")
                    continue
                median, blocks = rows[key][b]
                ratio = f"{median / base[0]:.2f}" if base else "-"
                cells.append(f"{median * 1e6:,.2f}, {median * 1e6 / blocks:.3f}, {ratio}")
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def load_replays(documents: list[tuple[Path, Any]]) -> list[tuple[Path, list[dict[str, Any]]]]:
    """Every ``kvref replay --out`` JSON file among ``documents``: a list of replay results."""
    out = []
    for file, doc in documents:
        if isinstance(doc, list) and doc and all(isinstance(r, dict) and "block_hits" in r for r in doc):
            out.append((file, doc))
    return out


def render_replays(replays: list[tuple[Path, list[dict[str, Any]]]], out_dir: Path | None = None) -> str:
    """Markdown tables of replay results, one per file, with its plot when one sits beside it."""
    lines = ["# kvref replays", ""]
    for file, runs in replays:
        first = runs[0]
        lines.append(
            f"From `{file}`: {first['source']}, {first['requests']:,} requests, "
            f"{first['block_references']:,} block references in blocks of {first['block_size']} tokens."
        )
        lines += [
            "",
            "| backend | replay | policy | capacity | block hits | token hits | no-evict (tokens) | evictions "
            "| blocks/s |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in runs:
            lines.append(
                f"| {r['backend']} | {r.get('mode', 'stepwise')} | {r['policy']} | {r['capacity']:,} | "
                f"{r['block_hit_rate']:.2%} | "
                f"{r['token_hit_rate']:.2%} | {r['infinite_token_hit_rate']:.2%} | {r['evictions']:,} | "
                f"{r.get('block_ops_per_second', 0):,.0f} |"
            )
        plot = file.parent / "hit-rate.png"
        if plot.is_file():
            where = plot.resolve()
            if out_dir is not None and where.is_relative_to(out_dir.resolve()):
                where = where.relative_to(out_dir.resolve())
            lines += ["", f"![token hit rate against capacity]({where})"]
        lines.append("")
    return "\n".join(lines)
