"""The ``kvref`` command.

``kvref backends``       every registered backend: usable here or why not, device, capabilities
``kvref replay``         replay a trace through a backend's prefix cache: hit rates, evictions, speed
``kvref conformance``    run the conformance suite on a backend (``--backend NAME``)
``kvref report``         render conformance results files as one Markdown matrix
``kvref spec check``     lint the spec, write ``spec/rules.json``, report rule coverage by tests

``--backend`` and the other settings follow the precedence of :mod:`kvref.config.settings` (CONF-903).
Errors print as one line naming the rule and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvref.contract.errors import KVRefError

__all__ = ["main"]


def _console() -> object:
    from rich.console import Console

    return Console()


def _cmd_backends(args: argparse.Namespace) -> int:
    from rich.table import Table

    from kvref.config.registry import backend_statuses

    statuses = backend_statuses()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": s.name,
                        "usable": s.usable,
                        "reason": s.reason,
                        "version": s.version,
                        "device": s.device,
                        "capabilities": sorted(s.capabilities),
                    }
                    for s in statuses
                ],
                indent=2,
            )
        )
        return 0
    table = Table(title="kvref backends")
    for column in ("backend", "usable", "version", "device", "capabilities / reason"):
        table.add_column(column)
    for s in statuses:
        detail = ", ".join(sorted(s.capabilities)) if s.usable else s.reason
        table.add_row(s.name, "yes" if s.usable else "no", s.version, s.device, detail)
    _console().print(table)  # type: ignore[attr-defined]
    return 0


@contextmanager
def _progress(*, enabled: bool) -> Iterator[Callable[[str, int], None]]:
    """A rich progress bar over replay runs, shown on a terminal only."""
    from rich.progress import Progress

    console = _console()
    if not enabled or not console.is_terminal:  # type: ignore[attr-defined]
        yield lambda _label, _total: None
        return
    with Progress(console=console, transient=True) as progress:  # type: ignore[arg-type]
        task = progress.add_task("replaying", total=None)

        def advance(label: str, total: int) -> None:
            progress.update(task, advance=1, total=total, description=label)

        yield advance


def _cmd_replay(args: argparse.Namespace) -> int:
    from rich.table import Table

    from kvref.config.registry import create_pool
    from kvref.config.settings import load_settings
    from kvref.contract.policies import EvictionPolicy
    from kvref.simulation.replay import replay
    from kvref.simulation.traces import load_trace

    settings = load_settings({"backend": args.backend, "hash": args.hash})
    if args.trace:
        trace = load_trace(args.trace, block_size=args.block_size or 512, algorithm=settings.hash)
    else:
        from kvref.simulation.workloads import workload_trace

        trace = workload_trace(args.workload, seed=args.seed, block_size=args.block_size or 16, algorithm=settings.hash)
    if args.policy:
        policies = args.policy
    elif settings.sources["policy"] != "default":
        policies = [settings.policy]
    else:
        policies = [p.value for p in EvictionPolicy]
    capacities = sorted(set(args.capacity or [10_000]))
    if args.sweep and len(capacities) == 1:
        base = capacities[0]
        capacities = sorted({max(1, base // 8), max(1, base // 4), max(1, base // 2), base, base * 2})
    runs = [(c, p) for c in capacities for p in [*policies, *(["belady"] if args.sweep else [])]]
    results = []
    with _progress(enabled=not args.json and len(runs) > 1) as advance:
        for capacity, policy in runs:
            if policy == "belady":
                from kvref.simulation.belady import belady_replay

                results.append(belady_replay(trace, capacity, warmup=args.warmup))
            else:
                pool = create_pool(capacity + 1, backend=settings.backend, policy=policy, device=args.device)
                results.append(
                    replay(trace, pool, warmup=args.warmup, backend=settings.backend, stepwise=args.stepwise)
                )
            advance(f"{policy} at {capacity:,} blocks", len(runs))
    compared = _compare_backends(trace, results, args) if args.backends else []
    if args.out:
        from kvref.reports.replay import write_replay_report

        title = f"kvref replay: {trace.source}, backend {settings.backend}"
        for path in write_replay_report(results, Path(args.out), title=title, backend_runs=compared):
            print(f"wrote {path}", file=sys.stderr)
    disagree = [r.backend for r in compared if r.counts() != compared[0].counts()]
    if args.json:
        print(json.dumps([r.to_json() for r in results + compared], indent=2))
        return 1 if disagree else 0
    table = Table(
        title=f"kvref replay: {trace.source}, {len(trace.requests)} requests, {trace.block_references} block "
        f"references in blocks of {trace.block_size} tokens, backend {settings.backend}"
    )
    for column in ("blocks", "policy", "block hits", "token hits", "no-evict", "evictions", "blocks/s"):
        table.add_column(column, justify="right", no_wrap=True)
    for r in results:
        table.add_row(
            f"{r.capacity:,}", r.policy, f"{r.block_hit_rate:.2%}", f"{r.token_hit_rate:.2%}",
            f"{r.infinite_token_hit_rate:.2%}", f"{r.evictions:,}", f"{r.block_ops_per_second:,.0f}",
        )  # fmt: skip
    _console().print(table)  # type: ignore[attr-defined]
    if compared:
        _print_backend_runs(compared)
    if disagree:
        print(f"kvref replay: backends {disagree} counted differently from {compared[0].backend}", file=sys.stderr)
        return 1
    return 0


def _compare_backends(trace: Any, results: list[Any], args: argparse.Namespace) -> list[Any]:
    """The largest capacity and first policy of the run, replayed once on every usable backend (TRACE-1018)."""
    from kvref.config.registry import backend_statuses, create_pool
    from kvref.simulation.replay import replay

    run = max((r for r in results if r.policy != "belady"), key=lambda r: r.capacity)
    out = []
    for status in sorted(backend_statuses(), key=lambda s: s.name != "oracle"):
        if not status.usable:
            continue
        # A backend with a one-call replay (TRACE-1019) runs both ways: they must count the same.
        modes = [False, True] if "replay" in status.capabilities else [True]
        for stepwise in modes:
            pool = create_pool(run.capacity + 1, backend=status.name, policy=run.policy)
            label = f"{status.name} ({status.device})"
            out.append(replay(trace, pool, warmup=args.warmup, backend=label, stepwise=stepwise))
    return out


def _print_backend_runs(runs: list[Any]) -> None:
    from rich.table import Table

    first = runs[0]
    table = Table(
        title=f"every usable backend: {first.policy} at {first.capacity:,} blocks "
        f"(same: the same counts as {first.backend})"
    )
    table.add_column("backend", justify="right")
    table.add_column("replay", justify="right")
    for column in ("block hits", "token hits", "evictions", "same", "blocks/s"):
        table.add_column(column, justify="right", no_wrap=True)
    for r in runs:
        same = "yes" if r.counts() == first.counts() else "NO"
        table.add_row(
            r.backend, r.mode, f"{r.block_hit_rate:.2%}", f"{r.token_hit_rate:.2%}", f"{r.evictions:,}", same,
            f"{r.block_ops_per_second:,.0f}",
        )  # fmt: skip
    _console().print(table)  # type: ignore[attr-defined]


def _cmd_spec(args: argparse.Namespace) -> int:
    from kvref.cli.speclint import (
        build_index,
        code_rule_refs,
        collect_rule_citations,
        coverage,
        lint,
        parse_spec,
    )

    spec_dir = Path(args.spec)
    if not spec_dir.is_dir():
        raise SystemExit(f"kvref spec: no spec directory at {spec_dir}")
    index_path = spec_dir / "rules.json"
    chapters = parse_spec(spec_dir)
    problems = lint(chapters, index_path)
    rules = sum(len(c.rules) for c in chapters)
    print(f"spec: {len(chapters)} chapters, {rules} rules")
    for problem in problems:
        print(f"  lint: {problem}")
    if args.action in ("index", "check") and not problems:
        index_path.write_text(json.dumps(build_index(chapters), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {index_path}")
    failing: list[str] = []
    if args.action == "check":
        cited = collect_rule_citations([Path(p) for p in args.tests if Path(p).exists()])
        report = coverage(chapters, cited)
        for level in ("MUST", "MUST NOT", "SHOULD", "SHOULD NOT", "MAY"):
            ids = report.untested.get(level, [])
            if ids:
                print(f"  untested {level} rules ({len(ids)}): {', '.join(ids)}")
        for rid, where in sorted(report.unknown.items()):
            print(f"  tests cite unknown rule {rid}: {', '.join(where[:3])}")
        bad_code = code_rule_refs([Path(p) for p in args.code if Path(p).exists()], chapters)
        for rid, where in sorted(bad_code.items()):
            print(f"  code cites unknown rule {rid}: {', '.join(where[:3])}")
        failing = report.failing() + sorted(bad_code)
        tested = len({r.id for c in chapters for r in c.rules} & set(cited))
        print(f"coverage: {tested}/{rules} rules cited by a test")
    if problems or failing:
        print("spec check FAILED")
        return 1
    print("spec check passed")
    return 0


def _cmd_conformance(args: argparse.Namespace) -> int:
    """Run the conformance suite in this process: the same mechanism as ``pytest --pyargs``."""
    from importlib.metadata import entry_points

    try:
        import pytest
    except ImportError:
        raise SystemExit("kvref conformance needs the suite's dependencies: pip install 'kvref[conformance]'") from None
    argv = ["--pyargs", "kvref_conformance", "-c", os.devnull, "--rootdir", os.getcwd(), "-p", "no:cacheprovider"]
    # kvref itself is already imported (this command is part of it): nothing in it needs rewriting.
    argv += ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if not any(ep.name == "kvref_conformance" for ep in entry_points(group="pytest11")):
        argv += ["-p", "kvref_conformance.plugin"]
    for flag, value in (
        ("--kvref-backend", args.backend),
        ("--kvref-device", args.device),
        ("--kvref-profile", args.profile),
        ("--kvref-results", args.results),
        ("--kvref-deviations", args.deviations),
    ):
        if value is not None:
            argv += [flag, value]
    if args.no_shrink:
        argv.append("--kvref-no-shrink")
    return int(pytest.main(argv + list(args.pytest_args)))


def _cmd_report(args: argparse.Namespace) -> int:
    from kvref.reports.summary import (
        json_documents,
        load_benchmarks,
        load_replays,
        load_results,
        render_benchmarks,
        render_matrix,
        render_replays,
    )

    paths = [Path(p) for p in args.paths]
    for missing in [p for p in paths if not p.exists()]:
        print(f"kvref report: {missing} does not exist; skipped", file=sys.stderr)
    paths = [p for p in paths if p.exists()]
    documents = json_documents(paths)
    docs = load_results(paths, documents)
    benches = load_benchmarks(paths, documents)
    replays = load_replays(documents)
    out = Path(args.out) if args.out else None
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    parts = []
    if docs or not (benches or replays):
        parts.append(render_matrix(docs))
    if benches:
        parts.append(render_benchmarks(benches))
        if out is not None:
            parts.append(_benchmark_plots(benches, out.parent))
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


def _benchmark_plots(benches: list[dict[str, Any]], out_dir: Path) -> str:
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


def _parser() -> argparse.ArgumentParser:
    from kvref.simulation.workloads import WORKLOADS

    parser = argparse.ArgumentParser(prog="kvref", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="store_true", help="print kvref's version and exit")
    sub = parser.add_subparsers(dest="command")

    backends = sub.add_parser("backends", help="list registered backends and whether they run here")
    backends.add_argument("--json", action="store_true", help="machine-readable output")
    backends.set_defaults(func=_cmd_backends)

    rep = sub.add_parser("replay", help="replay a trace (or the built-in workload) through a prefix cache")
    rep.add_argument("trace", nargs="?", help="JSON Lines trace (Mooncake format); default: the built-in workload")
    rep.add_argument("--backend", help="backend name (default: KVREF_BACKEND, config, oracle)")
    rep.add_argument("--device", help="device for device backends")
    rep.add_argument("--policy", action="append", help="eviction policy; repeat for several (default: all four)")
    rep.add_argument("--capacity", type=int, action="append", help="cache capacity in blocks; repeat for several")
    rep.add_argument(
        "--sweep", action="store_true", help="several capacities (x1/8 .. x2 of one given) and the offline optimum"
    )
    rep.add_argument("--block-size", type=int, help="tokens per block (default 512 for a trace file, 16 built in)")
    rep.add_argument("--warmup", type=float, default=0.0, help="fraction of requests that only warm the cache")
    rep.add_argument("--hash", help="hash function for token-level traces")
    rep.add_argument("--seed", type=int, default=0, help="seed of the built-in workload")
    rep.add_argument(
        "--workload",
        default="chat",
        choices=list(WORKLOADS),
        help="built-in workload",
    )
    rep.add_argument(
        "--stepwise",
        action="store_true",
        help="replay by protocol calls even on a backend with a one-call replay (same counts, slower)",
    )
    rep.add_argument("--json", action="store_true", help="machine-readable output")
    rep.add_argument("--out", help="directory for replay.json, replay.md and hit-rate.png")
    rep.add_argument(
        "--backends",
        action="store_true",
        help="also replay the largest capacity (first policy) on every usable backend: speed, and the same counts",
    )
    rep.set_defaults(func=_cmd_replay)

    conf = sub.add_parser("conformance", help="run the conformance suite on a backend")
    conf.add_argument("--backend", help="backend name or module:Class (default: KVREF_BACKEND, config, oracle)")
    conf.add_argument("--device", help="device for the backend")
    conf.add_argument("--profile", choices=["ci", "dev", "deep"], help="Hypothesis profile")
    conf.add_argument("--results", help="directory for the results file (default results/conformance)")
    conf.add_argument("--deviations", help="extra known-deviations TOML file")
    conf.add_argument("--no-shrink", action="store_true", help="detection only: skip Hypothesis's shrink phase")
    conf.add_argument("pytest_args", nargs="*", help="after --: arguments passed on to pytest")
    conf.set_defaults(func=_cmd_conformance)

    report = sub.add_parser("report", help="render results files as a Markdown conformance matrix")
    report.add_argument(
        "paths", nargs="*", default=["results/conformance", "results"], help="results files or directories"
    )
    report.add_argument("--out", help="write the Markdown here instead of printing it")
    report.set_defaults(func=_cmd_report)

    spec = sub.add_parser("spec", help="lint the spec, write rules.json, check rule coverage")
    spec.add_argument("action", choices=["lint", "index", "check"], nargs="?", default="check")
    spec.add_argument("--spec", default="spec", help="spec directory (default: ./spec)")
    spec.add_argument("--tests", nargs="*", default=["tests", "conformance"], help="where tests live")
    spec.add_argument(
        "--code",
        nargs="*",
        default=["kvref", "backends", "conformance"],
        help="source whose cited rule ids must exist",
    )
    spec.set_defaults(func=_cmd_spec)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvref`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        from kvref import __version__

        print(f"kvref {__version__}")
        return 0
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(args.func(args))
    except KVRefError as exc:
        print(f"kvref {args.command}: {exc}", file=sys.stderr)
        return 2
