"""``kvref report``: conformance results, benchmark runs and replays as one Markdown report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvref.contract.errors import KVRefError

__all__ = ["benchmark_plots", "run_report", "write_verdict_matrix"]


def run_report(args: argparse.Namespace) -> int:
    """Render every results file under ``args.paths`` (or, with ``--verdicts DIR``, the verdict matrix
    into DIR); 1 when there was nothing to render."""
    if args.verdicts:
        return write_verdict_matrix(Path(args.verdicts), Path(args.spec))
    from kvref.reports.summary import (
        by_machine,
        json_documents,
        load_benchmarks,
        load_replays,
        load_results,
        machine_of,
        render_benchmarks,
        render_matrix,
        render_replays,
        this_machine,
    )

    paths = [Path(p) for p in args.paths]
    for missing in [p for p in paths if not p.exists()]:
        print(f"kvref report: {missing} does not exist; skipped", file=sys.stderr)
    paths = [p for p in paths if p.exists()]
    documents = json_documents(paths)
    docs = load_results(paths, documents)
    benches = load_benchmarks(paths, documents)
    replays = load_replays(documents)
    if not args.all_machines:  # this machine's runs only: another's are not set beside them (CONF-912)
        here = this_machine()
        for doc in docs + benches:
            if machine_of(doc) != here:
                print(
                    f"kvref report: left out {doc['_file']}, recorded on {machine_of(doc)}; "
                    "--all-machines reports every machine, each in tables of its own",
                    file=sys.stderr,
                )
        docs = [d for d in docs if machine_of(d) == here]
        benches = [b for b in benches if machine_of(b) == here]
    out = Path(args.out) if args.out else None
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    parts: list[str] = []
    if docs or not (benches or replays):
        groups = by_machine(docs) if args.all_machines else {}
        if len(groups) > 1:
            parts.extend(render_matrix(group, machine=machine) for machine, group in groups.items())
        else:
            parts.append(render_matrix(docs))
    if benches:
        parts.append(render_benchmarks(benches))
        if out is not None:
            parts.append(benchmark_plots(benches, out.parent))
    if replays:
        parts.append(render_replays(replays, None if out is None else out.parent))
    text = "\n".join(parts)
    if out is not None:
        out.write_text(text, encoding="utf-8")
        print(
            f"wrote {out} ({len(docs)} conformance result(s), {len(benches)} benchmark run(s), "
            f"{len(replays)} replay file(s))"
        )
    else:
        print(text, end="")
    return 0 if docs or benches or replays else 1


def write_verdict_matrix(directory: Path, spec_dir: Path) -> int:
    """Write ``directory/README.md`` and ``directory/index.html`` from the verdict files there; 1 when
    there are none."""
    from kvref.cli.commands import spec_rules
    from kvref.reports.verdicts import load_unjudged, load_verdicts, render_verdict_markdown, render_verdict_page

    docs = load_verdicts(directory)
    if not docs:
        print(f"kvref report: no verdict files in {directory} (kvref conformance --verdicts writes them)")
        return 1
    rules = spec_rules(spec_dir)
    for name, text in (
        ("README.md", render_verdict_markdown(docs, rules, load_unjudged(directory))),
        ("index.html", render_verdict_page(docs, rules)),
    ):
        (directory / name).write_text(text, encoding="utf-8")
        print(f"wrote {directory / name} ({len(docs)} implementation(s))")
    return 0


def benchmark_plots(benches: list[dict[str, Any]], out_dir: Path) -> str:
    """Plot each benchmark run next to the report; Markdown image links, or why there are none."""
    from kvref.reports.bench_plots import plot_benchmark_run

    lines = ["## Benchmark plots", ""]
    for i, run in enumerate(benches):
        stem = (
            f"bench-{Path(str(run['_file'])).stem}"
            if len(benches) == 1
            else f"bench-{i}-{Path(str(run['_file'])).stem}"
        )
        try:
            written = plot_benchmark_run(run, out_dir, stem)
        except KVRefError as exc:
            return "\n".join([*lines, f"No plots: {exc}", ""])
        for path in written:
            lines.append(f"![{path.stem}]({path.name})")
    lines.append("")
    return "\n".join(lines)
