"""``kvref replay``: replay a trace or a built-in workload through a backend's prefix cache.

Hit rates per policy and capacity (with Belady's MIN on ``--sweep``), and with ``--backends`` the
same replay on every usable backend, which must count the same (TRACE-1018).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kvref.cli import arguments as arg
from kvref.cli.console import print_table, progress_bar

__all__ = ["compare_backends", "print_backend_runs", "run_replay", "trace_name"]


def run_replay(args: argparse.Namespace) -> int:
    """Replay per policy and capacity, print (or write) the results; 1 when backends count differently."""
    from rich.table import Table

    from kvref.config.registry import create_pool
    from kvref.config.settings import load_settings
    from kvref.simulation.replay import replay

    settings = load_settings({"backend": args.backend, "hash": args.hash})
    if args.optimum and not args.curve:
        from kvref.contract.errors import ConfigError

        raise ConfigError("TRACE-1063", "--optimum bounds the optimum at the capacities of --curve: give --curve too")
    if args.curve:
        return run_curve(args, settings)
    runs = planned_runs(args, settings)
    if args.events and (len(runs) != 1 or runs[0][1] == "belady" or runs[0][1].startswith("radix-")):
        from kvref.contract.errors import ConfigError

        why = (
            f"{runs[0][1]} is not a policy of the hash-block cache"
            if len(runs) == 1
            else f"{len(runs)} were asked for: give one --capacity and one --policy"
        )
        raise ConfigError("PFX-323", f"--events records one replay of the hash-block cache; {why}")
    clash = arg.snapshot_clash(args.snapshot, args.events)
    if clash:
        from kvref.contract.errors import ConfigError

        raise ConfigError("PFX-327", f"--snapshot records what the cache holds at the end of its event stream; {clash}")
    trace = replay_trace(args, settings.hash)
    runs = within_the_trace(runs, trace)
    results = []
    with progress_bar("replaying", len(runs), enabled=len(runs) > 1) as advance:
        for capacity, policy in runs:
            advance(0, label=f"{policy} at {capacity:,} blocks")
            if policy == "belady":
                from kvref.simulation.belady import belady_replay

                results.append(belady_replay(trace, capacity, warmup=args.warmup))
            elif policy.startswith("radix-"):
                from kvref.simulation.radix_replay import radix_replay

                results.append(radix_replay(trace, capacity, policy=policy.removeprefix("radix-"), warmup=args.warmup))
            else:
                pool = create_pool(
                    capacity + 1, backend=settings.backend, policy=policy, device=args.device, events=bool(args.events)
                )
                results.append(
                    replay(trace, pool, warmup=args.warmup, backend=settings.backend, stepwise=args.stepwise)
                )
                if args.events:
                    from kvref.simulation.event_streams import write_snapshot, write_stream

                    written = write_stream(pool.take_events(), Path(args.events))
                    print(f"wrote {written:,} events to {args.events}", file=sys.stderr)
                    if args.snapshot:
                        resident = sorted(pool.resident_hashes())
                        Path(args.snapshot).unlink(missing_ok=True)
                        write_snapshot(Path(args.snapshot), written, resident)
                        print(
                            f"wrote the cache's {len(resident):,} resident hashes to {args.snapshot}", file=sys.stderr
                        )
            advance()
    compared = compare_backends(trace, results, args) if args.backends else []
    if args.out:
        from kvref.reports.replay import write_replay_report

        title = f"kvref replay: {trace_name(trace.source)}, backend {settings.backend}"
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
        table.add_column(column, justify="right", overflow="fold")
    for r in results:
        table.add_row(
            f"{r.capacity:,}",
            r.policy,
            f"{r.block_hit_rate:.2%}",
            f"{r.token_hit_rate:.2%}",
            f"{r.infinite_token_hit_rate:.2%}",
            f"{r.evictions:,}",
            f"{r.block_ops_per_second:,.0f}",
        )
    print_table(table)
    if compared:
        print_backend_runs(compared)
    if disagree:
        print(f"kvref replay: backends {disagree} counted differently from {compared[0].backend}", file=sys.stderr)
        return 1
    return 0


def run_curve(args: argparse.Namespace, settings: Any) -> int:
    """``kvref replay --curve``: the exact lru and lru-leaf hit-rate curve in one pass (TRACE-1023), as a
    table at doubling capacities; with ``--out``, the whole curve as curve.json and curve.png."""
    from rich.table import Table

    from kvref.contract.errors import ConfigError
    from kvref.simulation.curves import lru_curve

    clashing = [
        option
        for option, given in (
            ("--capacity", args.capacity),
            ("--sweep", args.sweep),
            ("--backends", args.backends),
            ("--stepwise", args.stepwise),
            ("--cache radix/both", args.cache != "hash"),
            ("--policy other than lru, lru-leaf", any(p not in ("lru", "lru-leaf") for p in args.policy or ())),
            ("--events", args.events),
            ("--snapshot", args.snapshot),
        )
        if given
    ]
    if clashing:
        raise ConfigError(
            "TRACE-1023",
            f"--curve computes every capacity of lru and lru-leaf at once; it takes no {', '.join(clashing)}",
        )
    trace = replay_trace(args, settings.hash)
    curve = lru_curve(trace, warmup=args.warmup)
    shown = sorted(
        {curve.smallest, curve.largest} | {c for c in (2**k for k in range(40)) if curve.smallest < c < curve.largest}
    )
    points: list[dict[str, float]] = [
        {"capacity": c, **dict(zip(("block_hit_rate", "token_hit_rate"), curve.hit_rates(c), strict=True))}
        for c in shown
    ]
    optimum = optimum_points(trace, shown, args.warmup) if args.optimum else None
    if optimum:
        for point, best in zip(points, optimum, strict=True):
            point.update({k: v for k, v in best.items() if k != "capacity"})
    if args.out:
        from kvref.reports.replay import write_curve_report

        title = f"kvref replay --curve: {trace_name(trace.source)}"
        for path in write_curve_report(curve, Path(args.out), title=title, optimum=optimum):
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        print(
            json.dumps(
                {"source": trace.source, "smallest": curve.smallest, "largest": curve.largest, "points": points},
                indent=1,
            )
        )
        return 0
    table = Table(
        title=f"kvref replay --curve: {trace.source}, {len(trace.requests)} requests in blocks of {trace.block_size} "
        f"tokens; lru and lru-leaf, exact at every capacity from {curve.smallest:,} (the longest request)"
    )
    columns = ["blocks", "block hits", "token hits"]
    if optimum:
        columns += ["MIN: blocks", "MIN: tokens", "optimum <=: blocks", "optimum <=: tokens"]
    for column in columns:
        table.add_column(column, justify="right", overflow="fold")
    for point in points:
        keys = ["block_hit_rate", "token_hit_rate"]
        if optimum:
            keys += ["belady_block", "belady_token", "bound_block", "bound_token"]
        table.add_row(f"{point['capacity']:,}", *(f"{point[k]:.2%}" for k in keys))
    print_table(table)
    return 0


def optimum_points(trace: Any, capacities: list[int], warmup: float) -> list[dict[str, float]]:
    """Belady's MIN and the LP bound on the offline optimum (TRACE-1017, TRACE-1063) at ``capacities``,
    as hit rates, with progress: the bound is a linear program over the whole trace per capacity and unit."""
    from kvref.simulation.belady import belady_replay
    from kvref.simulation.optimum import offline_optimum

    points = []
    with progress_bar("bounding the optimum", len(capacities)) as advance:
        for capacity in capacities:
            advance(0, label=f"{capacity:,} blocks")
            belady = belady_replay(trace, capacity, warmup=warmup)
            blocks = offline_optimum(trace, capacity, unit="blocks", warmup=warmup, exact=False)
            tokens = offline_optimum(trace, capacity, unit="tokens", warmup=warmup, exact=False)
            points.append(
                {
                    "capacity": capacity,
                    "belady_block": belady.block_hits / blocks.total if blocks.total else 0.0,
                    "belady_token": belady.token_hits / tokens.total if tokens.total else 0.0,
                    "bound_block": blocks.hit_rate,
                    "bound_token": tokens.hit_rate,
                }
            )
            advance()
    return points


def trace_name(source: str) -> str:
    """A trace's name for a title: a file's own name (a path as typed says little in a figure)."""
    return Path(source).name if ("/" in source or source.endswith((".jsonl", ".csv"))) else source


def replay_trace(args: argparse.Namespace, algorithm: str) -> Any:
    """The trace ``args`` name: a JSON Lines or Azure CSV file, a catalog name, or the built-in workload.

    The same forms ``serve-replay`` takes; an Azure trace gets its seeded synthetic prefixes
    (TRACE-1045), with blocks of 16 tokens unless ``--block-size`` says otherwise.
    """
    if args.trace is None:
        from kvref.simulation.workloads import workload_trace

        return workload_trace(args.workload, seed=args.seed, block_size=args.block_size or 16, algorithm=algorithm)
    from kvref.simulation.catalog import resolve_trace

    path, entry = resolve_trace(args.trace)
    if (entry.format == "azure-csv") if entry else path.suffix.lower() == ".csv":
        from kvref.simulation.serving.azure import AzurePrefixes, load_azure_trace

        prefixes = AzurePrefixes(shared=args.azure_shared, count=args.azure_prefixes, seed=args.seed)
        workload = load_azure_trace(path, block_size=args.block_size or 16, prefixes=prefixes, algorithm=algorithm)
        return workload.block_trace()
    from kvref.simulation.traces import load_trace

    return load_trace(path, block_size=args.block_size or 512, algorithm=algorithm)


def planned_runs(args: argparse.Namespace, settings: Any) -> list[tuple[int, str]]:
    """(capacity, policy) of every replay asked for: hash-cache policies, ``radix-*`` ones (TRACE-1022), Belady."""
    from kvref.contract.errors import InvalidValueError
    from kvref.contract.policies import EvictionPolicy
    from kvref.simulation.radix_replay import RADIX_POLICIES

    cache = args.cache
    named = list(dict.fromkeys(args.policy or ([settings.policy] if settings.sources["policy"] != "default" else [])))
    if named and cache == "hash" and any(p.startswith("radix-") for p in named):
        # radix-lfu, as the tables print it, names the radix cache: both caches when hash names come too
        cache = "radix" if all(p.startswith("radix-") for p in named) else "both"
    policies: list[str] = []
    hash_policies = [p.value for p in EvictionPolicy]
    if cache == "hash":
        unknown = [p for p in named or () if p not in hash_policies]
        if unknown:  # a radix policy's bare name (lfu) with the hash-block cache
            raise InvalidValueError(
                "EVICT-407",
                f"unknown eviction policy {unknown[0]!r} for the hash-block cache; known: {', '.join(hash_policies)} "
                f"(radix-{unknown[0]} names the radix cache's, or give --cache radix)",
            )
        policies += named or hash_policies
    elif cache == "both":
        policies += [p for p in named if p in hash_policies] if named else hash_policies
    if cache in ("radix", "both"):
        radix_named = (q for p in named or () if (q := p.removeprefix("radix-")) in RADIX_POLICIES)
        wanted = list(dict.fromkeys(radix_named)) if named else list(RADIX_POLICIES)
        if named and cache == "radix" and not wanted:
            raise InvalidValueError(
                "TRACE-1021", f"replay --cache radix: none of {named} is a radix policy {RADIX_POLICIES}"
            )
        policies += [f"radix-{p}" for p in wanted]
    if not policies:
        raise InvalidValueError(
            "TRACE-1022",
            f"replay --cache both: none of {named} is a policy of either cache "
            f"(hash: {hash_policies}; radix: {list(RADIX_POLICIES)})",
        )
    capacities = sorted(set(args.capacity or [10_000]))  # each at least 1 (the argument's parser)
    if args.sweep and len(capacities) == 1:
        base = capacities[0]
        capacities = sorted({max(1, base // 8), max(1, base // 4), max(1, base // 2), base, base * 2})
    return [(c, p) for c in capacities for p in [*policies, *(["belady"] if args.sweep else [])]]


def within_the_trace(runs: list[tuple[int, str]], trace: Any) -> list[tuple[int, str]]:
    """The runs with every capacity above the trace's distinct blocks replayed at that count, said once:
    a cache that holds every block the trace names never evicts, so any larger one counts the same
    (and one the machine could not hold is never built)."""
    distinct = len({b for r in trace.requests for b in r.block_ids})
    above = sorted({c for c, _ in runs if c > distinct})
    if not above:
        return runs
    shown = ", ".join(f"{c:,}" for c in above)
    print(
        f"kvref replay: capacity {shown} is more than the trace's {distinct:,} distinct blocks can fill; "
        f"replayed at {distinct:,} blocks, which counts the same",
        file=sys.stderr,
    )
    return list(dict.fromkeys((min(c, distinct), p) for c, p in runs))


def compare_backends(trace: Any, results: list[Any], args: argparse.Namespace) -> list[Any]:
    """The largest capacity and first policy of the run, replayed once on every usable backend (TRACE-1018)."""
    from kvref.config.registry import backend_statuses, create_pool
    from kvref.simulation.replay import replay

    hashed = [r for r in results if r.policy != "belady" and not r.policy.startswith("radix-")]
    if not hashed:  # --cache radix: the radix cache has one implementation, the oracle's
        return []
    run = max(hashed, key=lambda r: r.capacity)
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


def print_backend_runs(runs: list[Any]) -> None:
    """The per-backend table of ``--backends``: hit rates, evictions, whether the counts agree, speed."""
    from rich.table import Table

    first = runs[0]
    table = Table(
        title=f"every usable backend: {first.policy} at {first.capacity:,} blocks "
        f"(same: the same counts as {first.backend})"
    )
    table.add_column("backend", justify="right")
    table.add_column("replay", justify="right")
    for column in ("block hits", "token hits", "evictions", "same", "blocks/s"):
        table.add_column(column, justify="right", overflow="fold")
    for r in runs:
        same = "yes" if r.counts() == first.counts() else "NO"
        table.add_row(
            r.backend,
            r.mode,
            f"{r.block_hit_rate:.2%}",
            f"{r.token_hit_rate:.2%}",
            f"{r.evictions:,}",
            same,
            f"{r.block_ops_per_second:,.0f}",
        )
    print_table(table)
