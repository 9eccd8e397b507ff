"""``kvref serve-replay --engine vllm|sglang``: the serving replay on an engine's own scheduler, and with
``--compare`` kvref's own replay beside it, request by request (TRACE-1050..TRACE-1052, TRACE-1054..TRACE-1056).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kvref.cli.console import print_table, progress_bar
from kvref.cli.serving_tables import print_serving_results

__all__ = ["check_engine_arguments", "run_on_engine"]

#: The rule that says what each engine's replay drives.
ENGINE_RULES = {"vllm": "TRACE-1050", "sglang": "TRACE-1054"}
#: What only vLLM's replay takes: KV cache groups beside full attention, its event stream and snapshot.
VLLM_ONLY = ("--sliding-window", "--mamba", "--events", "--snapshot")


def check_engine_arguments(args: argparse.Namespace) -> None:
    """Refuse, before any work, what an engine's scheduler cannot be asked and what needs one
    (TRACE-1050, TRACE-1051, TRACE-1054, CONF-912); where the engine is not installed, say how to install it."""
    from kvref.contract.errors import InvalidValueError

    given = {
        "--compare": args.compare,
        "--no-prefix-caching": args.no_prefix_caching,
        "--sliding-window": args.sliding_window is not None,
        "--mamba": args.mamba,
        "--events": args.events is not None,
        "--snapshot": args.snapshot is not None,
    }
    if args.engine == "kvref":
        for flag, on in given.items():
            if on:
                where = "--engine vllm" if flag in VLLM_ONLY else "--engine vllm or --engine sglang"
                raise InvalidValueError("TRACE-1051", f"{flag} goes with {where}")
        return
    rule = ENGINE_RULES[args.engine]
    if args.engine == "sglang":
        for flag in VLLM_ONLY:
            if given[flag]:
                raise InvalidValueError(
                    rule, f"{flag} goes with --engine vllm: SGLang's scheduler is driven with one full-attention tree"
                )
    name = "vLLM" if args.engine == "vllm" else "SGLang"
    refused = [
        ("--target-hit-rate / --target-ttft-p90", args.target_hit_rate is not None or args.target_ttft_p90 is not None),
        ("--scheduler", args.scheduler is not None),
        ("--preemption pause", args.preemption != "recompute"),
        ("--backend", args.backend != "oracle"),
        ("--policy other than lru", any(p != "lru" for p in args.policy or [])),
        ("--results", args.results is not None),
        ("--workers", args.workers not in (None, 1)),
        ("--tier", bool(args.tier)),
    ]
    for flag, on in refused:
        if on:
            raise InvalidValueError(
                rule,
                f"{flag}: --engine {args.engine} replays the given capacities through {name}'s own scheduler, which "
                "evicts by its own LRU, preempts by recompute and runs in this process",
            )
    if args.engine == "vllm":
        _check_vllm_arguments(args)
        return
    from kvref.simulation.serving.sglang_scheduler import sglang_version

    sglang_version()  # refuses with how to install it


def _check_vllm_arguments(args: argparse.Namespace) -> None:
    """What vLLM alone refuses: fewer tokens than seats a step, events without caching, a snapshot without events."""
    from kvref.cli import arguments as arg
    from kvref.contract.errors import InvalidValueError
    from kvref.simulation.serving.vllm_scheduler import vllm_version

    if args.budget < args.max_seqs:
        raise InvalidValueError(
            "TRACE-1050", f"--budget {args.budget:,} is less than --max-seqs {args.max_seqs:,}: vLLM refuses that"
        )
    if args.events is not None and args.no_prefix_caching:
        raise InvalidValueError("PFX-323", "--events: vLLM sends no KV events with prefix caching off")
    why = arg.snapshot_clash(args.snapshot, args.events)
    if why:
        raise InvalidValueError(
            "PFX-327", f"--snapshot records what vLLM's cache holds at the end of its stream; {why}"
        )
    vllm_version()  # refuses with how to install it


def run_on_engine(args: argparse.Namespace, specs: list[Any], capacities: list[int], model: Any) -> int:
    """Replay each block size and capacity through the engine's scheduler, and with --compare kvref's beside it."""
    from kvref.cli.replay import trace_name
    from kvref.contract.manager import FULL_ATTENTION, CacheGroup
    from kvref.reports.comparison import ENGINE_NAMES, render_comparison_markdown
    from kvref.simulation.serving.comparison import compare_with_engine, engine_replay
    from kvref.simulation.serving.runner import load_workload

    engine = args.engine
    name = ENGINE_NAMES[engine]
    caching = not args.no_prefix_caching
    groups = (
        FULL_ATTENTION,
        *([CacheGroup.window(args.sliding_window)] if args.sliding_window is not None else []),
        *([CacheGroup.mamba()] if args.mamba else []),
    )
    workloads = [load_workload(spec) for spec in specs]
    first = workloads[0]
    sides = 2 if args.compare else 1
    total = sum(len(w.requests) for w in workloads) * len(capacities) * sides
    title = f"kvref serve-replay --engine {engine}: {trace_name(first.source)}, {len(first.requests):,} requests"
    notes = [first.note, f"step model: {model.describe()}", _engine_note(engine, caching, groups)]
    if args.events is not None and len(workloads) * len(capacities) != 1:
        from kvref.contract.errors import InvalidValueError

        raise InvalidValueError(
            "PFX-323", "--events records one replay on vLLM: give one --capacity and one --block-size"
        )
    events = Path(args.events) if args.events is not None else None
    snapshot = Path(args.snapshot) if args.snapshot is not None else None
    for path in (events, snapshot):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
    comparisons: list[tuple[str, Any]] = []
    results = []
    with progress_bar(f"replaying {len(first.requests):,} requests on {name}", total) as advance:

        def progress(done: int, _total: int) -> None:
            advance(done)

        for workload in workloads:
            for capacity in capacities:
                options: dict[str, Any] = {"prefix_caching": caching, "groups": groups, "warmup": args.warmup}
                options.update(progress=progress, events=events, snapshot=snapshot)
                if args.compare:
                    comparison = compare_with_engine(engine, workload, capacity, model, **options)
                    comparisons.append((f"block size {workload.block_size}, {capacity:,} blocks", comparison))
                    results.append(comparison.engine)
                else:
                    results.append(engine_replay(engine, workload, capacity, model, **options).run())
    if args.out:
        out = Path(args.out)
        if args.compare:
            path = out / "comparison.md"
            lines = [f"- {n}" for n in notes if n]
            path.write_text(render_comparison_markdown(title, comparisons, engine=name, notes=lines))
            print(f"wrote {path}", file=sys.stderr)
        else:
            from kvref.reports.serving import write_serving_report

            for path in write_serving_report(results, out, title=title, notes=notes, sizing=None):
                print(f"wrote {path}", file=sys.stderr)
    if args.json:
        payload: dict[str, Any] = {"title": title, "notes": notes, "results": [r.to_json() for r in results]}
        if args.compare:
            payload["comparisons"] = [_comparison_json(label, c) for label, c in comparisons]
        print(json.dumps(payload, indent=1))
        return _comparison_status(engine, comparisons)
    if not args.compare:
        print_serving_results(results, title, notes, None)
        return 0
    print(title)
    _print_comparisons(name, comparisons, notes)
    return _comparison_status(engine, comparisons)


def _engine_note(engine: str, caching: bool, groups: tuple[Any, ...]) -> str:
    """The engine's release and what it was asked, for the notes under the tables."""
    switch = "on" if caching else "off"
    if engine == "sglang":
        from kvref.simulation.serving.sglang_scheduler import sglang_version

        return f"SGLang {sglang_version()}, radix cache {switch}, its default schedule policy and admission"
    from kvref.simulation.serving.vllm_scheduler import vllm_version

    kinds = ", ".join(g.kind if g.sliding_window is None else f"window {g.sliding_window:,}" for g in groups)
    return f"vLLM {vllm_version()}, prefix caching {switch}, KV cache groups: {kinds}"


def _print_comparisons(name: str, comparisons: list[tuple[str, Any]], notes: list[str]) -> None:
    """The comparison table, its notes, then the first differing requests of each configuration."""
    from rich import box
    from rich.table import Table

    from kvref.reports.comparison import (
        DIFFERENCE_COLUMNS,
        comparison_columns,
        comparison_notes,
        comparison_row,
        difference_rows,
    )

    table = Table(title=f"kvref's serving replay against {name}'s scheduler", box=box.SIMPLE_HEAD, padding=(0, 1))
    for column in comparison_columns(name):
        table.add_column(column, justify="left" if column == "configuration" else "right", overflow="fold")
    for label, comparison in comparisons:
        table.add_row(*comparison_row(label, comparison))
    print_table(table)
    for note in comparison_notes(name) + tuple(f"- {n}" for n in notes if n):
        print(note)
    differing = [row for label, c in comparisons for row in difference_rows(label, c.differences, name)]
    if differing:
        diffs = Table(title="requests that differ (the first ten of each)", box=box.SIMPLE_HEAD, padding=(0, 1))
        for column in DIFFERENCE_COLUMNS:
            diffs.add_column(
                column, justify="left" if column in ("configuration", "side") else "right", overflow="fold"
            )
        for row in differing:
            diffs.add_row(*row)
        print_table(diffs)


def _comparison_status(engine: str, comparisons: list[tuple[str, Any]]) -> int:
    """0 where every configuration agrees, or the engine is one kvref's model does not claim to be; 1, with a
    line each, where vLLM and kvref do not agree (TRACE-1051, TRACE-1056)."""
    status = 0
    for label, c in comparisons:
        if c.agrees:
            continue
        why = "no request was compared" if not c.requests else f"{c.requests - c.exact:,} requests differ"
        if c.requests and c.exact == c.requests:
            why = "the aggregate counts differ"
        if engine == "vllm":
            status = 1
            print(f"kvref serve-replay: {label}: kvref and vLLM do not agree: {why}", file=sys.stderr)
        else:
            print(
                f"kvref serve-replay: {label}: {why} from SGLang's scheduler, whose admission and steps kvref's "
                "model does not follow (TRACE-1056)",
                file=sys.stderr,
            )
    return status


def _comparison_json(name: str, comparison: Any) -> dict[str, Any]:
    """One comparison for ``--json``: its counts, both results, and the differing requests' records."""
    import dataclasses

    c = comparison
    return {
        "configuration": name,
        "requests": c.requests,
        "exact": c.exact,
        "cached_equal": c.cached_equal,
        "preemptions_equal": c.preemptions_equal,
        "first_step_equal": c.first_step_equal,
        "hit_rate_error_pp": c.hit_rate_error_pp,
        "counts_equal": c.counts_equal,
        "agrees": c.agrees,
        "kvref": c.kvref.to_json(),
        "engine": c.engine.to_json(),
        "differences": [dataclasses.asdict(d) for d in c.differences],
    }
