"""``kvref serve-replay`` and ``kvref traces``: serving replays, cache sizing, sweeps, the trace catalog.

``kvref serve-replay [TRACE]`` replays a trace (a path, or a catalog name fetched with ``kvref
traces fetch``) or a built-in workload with requests overlapping in time through the request
manager (spec chapter 10, TRACE-1030..TRACE-1049), over a grid of policies, capacities and block
sizes run as independent tasks, and prints the table; ``--out`` writes the report and plots;
``--target-hit-rate`` / ``--target-ttft-p90`` search the smallest capacity meeting a target;
``--engine vllm`` / ``--engine sglang`` replays on the engine's own scheduler instead, and ``--compare``
beside kvref's (TRACE-1050..TRACE-1052, TRACE-1054, TRACE-1055; ``kvref.cli.engines``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from kvref.cli.console import print_table, progress_bar, quiet
from kvref.cli.engines import check_engine_arguments, run_on_engine
from kvref.cli.serving_tables import print_serving_results

__all__ = ["add_serving_commands", "run_serve_replay", "run_traces"]


def add_serving_commands(sub: Any) -> None:
    """Add ``serve-replay`` and ``traces`` to the ``kvref`` command's subparsers."""
    from kvref.cli import arguments as arg
    from kvref.simulation.serving import PREEMPTION_MODES, SERVING_WORKLOADS, StepModel
    from kvref.simulation.serving.tiers import DEFAULT_KV_BYTES_PER_TOKEN

    defaults = StepModel()
    whole = arg.positive_count
    serve = sub.add_parser("serve-replay", help="replay requests overlapping in time through the request manager")
    serve.add_argument(
        "trace",
        nargs="?",
        type=arg.trace_argument,
        help="a JSON Lines (Mooncake) or Azure CSV trace, or a catalog name (kvref traces list)",
    )
    serve.add_argument("--workload", default="chat", choices=list(SERVING_WORKLOADS), help="built-in workload")
    serve.add_argument(
        "--seed", type=arg.seed, default=0, help="seed of the built-in workload or of the Azure prefixes"
    )
    serve.add_argument(
        "--capacity", type=arg.capacity, action="append", help="cache capacity in blocks; repeat for several"
    )
    serve.add_argument(
        "--policy", action="append", type=arg.hash_policy_name, help="eviction policy (lru, lru-leaf, ...); repeat"
    )
    serve.add_argument(
        "--block-size", type=arg.block_size, action="append", help="tokens per block; repeat (built-in, Azure)"
    )
    serve.add_argument(
        "--warmup", type=arg.warmup_fraction, default=0.0, help="fraction of requests that only warm the cache"
    )
    serve.add_argument("--preemption", default=defaults.preemption, choices=list(PREEMPTION_MODES))
    serve.add_argument(
        "--budget",
        type=whole("TRACE-1032", "a token budget"),
        default=defaults.max_num_batched_tokens,
        help="tokens a step",
    )
    serve.add_argument(
        "--max-seqs",
        type=whole("TRACE-1032", "a number of running requests"),
        default=defaults.max_num_seqs,
        help="requests running at once",
    )
    serve.add_argument(
        "--max-model-len",
        type=whole("TRACE-1032", "a model length (tokens)"),
        default=defaults.max_model_len,
        help="tokens a request may have",
    )
    serve.add_argument(
        "--step-ms", type=arg.nonnegative_milliseconds, default=defaults.step_ms, help="fixed cost of a step"
    )
    serve.add_argument(
        "--prefill-ms-per-token", type=arg.nonnegative_milliseconds, default=defaults.prefill_ms_per_token
    )
    serve.add_argument("--decode-ms-per-token", type=arg.nonnegative_milliseconds, default=defaults.decode_ms_per_token)
    serve.add_argument(
        "--azure-shared", type=arg.shared_fraction, default=0.5, help="Azure: fraction opening with a shared prefix"
    )
    serve.add_argument(
        "--azure-prefixes",
        type=whole("TRACE-1045", "a number of shared prefixes"),
        default=8,
        help="Azure: how many shared prefixes",
    )
    serve.add_argument(
        "--hash", type=arg.hash_algorithm, default="sha256", help="hash function of token-level workloads"
    )
    serve.add_argument(
        "--backend", type=arg.backend_name, default="oracle", help="backend of the prefix cache under the manager"
    )
    serve.add_argument("--no-belady", action="store_true", help="skip Belady's offline reference")
    serve.add_argument(
        "--engine",
        choices=["kvref", "vllm", "sglang"],
        default="kvref",
        help="whose scheduler runs the steps: kvref's model, vLLM's own Scheduler or SGLang's (needs it installed)",
    )
    serve.add_argument(
        "--compare",
        action="store_true",
        help="with --engine vllm or sglang: kvref's model beside it, request by request",
    )
    serve.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="with --engine vllm or sglang: prefix caching off (on both sides)",
    )
    serve.add_argument(
        "--sliding-window",
        type=whole("REQ-730", "a sliding window (tokens)"),
        help="with --engine vllm: a sliding-window group of this many tokens beside the full-attention one",
    )
    serve.add_argument(
        "--mamba", action="store_true", help="with --engine vllm: a mamba group beside the full-attention one"
    )
    serve.add_argument(
        "--events",
        type=arg.output_file,
        help="with --engine vllm: record vLLM's KV event batches of the one replay asked for, as its publisher "
        "sends them (MessagePack; kvref events check --copies reads them)",
    )
    serve.add_argument(
        "--snapshot",
        type=arg.output_file,
        help="with --events: also write what vLLM's block pool holds at the end, per KV cache group "
        "(kvref events check --copies --snapshots reads it, PFX-327)",
    )
    serve.add_argument(
        "--no-chunked-prefill",
        action="store_true",
        help="admit a prompt only when all of it fits the step's budget (needs --budget >= --max-model-len)",
    )
    serve.add_argument(
        "--no-reserve-full-sequence",
        action="store_true",
        help="admit on the first chunk's blocks alone, not all the request's (vLLM's scheduler_reserve_full_isl)",
    )
    target = serve.add_mutually_exclusive_group()
    target.add_argument(
        "--target-hit-rate", type=arg.hit_rate_target, help="find the smallest capacity with this token hit rate"
    )
    target.add_argument(
        "--target-ttft-p90", type=arg.milliseconds, help="find the smallest capacity with this p90 TTFT (ms)"
    )
    serve.add_argument(
        "--range",
        type=arg.capacity_range,
        help="LOW:HIGH capacities the search covers (default: fits every request .. never evicts)",
    )
    serve.add_argument(
        "--workers", type=arg.worker_count, help="processes of the sweep (default: every core; 1: this process)"
    )
    serve.add_argument(
        "--scheduler",
        type=arg.scheduler_address,
        help="a Dask scheduler's address (tcp://host:8786): run the sweep there",
    )
    serve.add_argument(
        "--results", type=arg.results_file, help="JSON Lines file of finished points; a rerun skips those written"
    )
    serve.add_argument(
        "--tier",
        action="append",
        type=arg.tier_spec,
        metavar="NAME:BLOCKS:GBPS[:LATENCY_MS]",
        help="a tier below the device pool (repeat, first below the device first): e.g. host:20000:25:0.05; "
        "BLOCKS as a comma list (host:5000,10000,20000:25) sweeps the tier's size beside --capacity",
    )
    serve.add_argument(
        "--kv-bytes-per-token",
        type=arg.kv_bytes_per_token,
        help=f"one token's K and V in bytes, for tier loads (default {DEFAULT_KV_BYTES_PER_TOKEN:,}, an 8B Llama's)",
    )
    serve.add_argument("--out", type=arg.output_directory, help="directory for serving.json, serving.md and the plots")
    serve.add_argument("--json", action="store_true", help="machine-readable output")
    serve.add_argument(
        "--format", choices=["table", "plain"], default="table", help="plain: tables as plain columns, every cell whole"
    )
    serve.set_defaults(func=run_serve_replay)

    traces = sub.add_parser("traces", help="the public traces kvref knows: list them, fetch one")
    traces.add_argument("action", choices=["list", "fetch"])
    traces.add_argument("name", nargs="?", help="the trace to fetch")
    traces.add_argument("--url", help="fetch from this URL instead (a mirror, or a file:// URL)")
    traces.add_argument(
        "--dir",
        type=arg.output_directory,
        help="cache directory (default: $KVREF_TRACE_CACHE or ~/.cache/kvref/traces)",
    )
    traces.set_defaults(func=run_traces)


def _workloads(args: argparse.Namespace) -> list[Any]:
    """One WorkloadSpec per block size; a JSON Lines trace has one, its own (TRACE-1046)."""
    from kvref.contract.errors import InvalidValueError
    from kvref.simulation.catalog import resolve_trace
    from kvref.simulation.serving.runner import WorkloadSpec

    common = {"seed": args.seed, "hash": args.hash}
    if args.trace is None:
        kind, name, default_size = "builtin", args.workload, 16
    else:
        path, entry = resolve_trace(args.trace)
        csv = (entry.format == "azure-csv") if entry else path.suffix.lower() == ".csv"
        kind, name, default_size = ("azure", str(path), 16) if csv else ("jsonl", str(path), 512)
        common.update(azure_shared=args.azure_shared, azure_prefixes=args.azure_prefixes)
    sizes = args.block_size or [default_size]
    if kind == "jsonl" and len(sizes) > 1:
        raise InvalidValueError("TRACE-1046", "a JSON Lines trace names blocks of its own size: give one --block-size")
    return [WorkloadSpec(kind, name, size, **common) for size in sizes]


def _default_capacities(workload: Any) -> tuple[int, int]:
    """The smallest capacity that rejects no request, and one that never evicts (prompt and output blocks)."""
    size = workload.block_size
    fits = max(-(-r.max_computed_tokens() // size) for r in workload.requests)
    never = sum(-(-(r.prompt_length + r.output_length) // size) for r in workload.requests)
    return fits, max(fits, never)


def _model(args: argparse.Namespace) -> Any:
    from kvref.simulation.serving import StepModel

    return StepModel(
        max_num_batched_tokens=args.budget,
        max_num_seqs=args.max_seqs,
        max_model_len=args.max_model_len,
        step_ms=args.step_ms,
        prefill_ms_per_token=args.prefill_ms_per_token,
        decode_ms_per_token=args.decode_ms_per_token,
        preemption=args.preemption,
        reserve_full_sequence=not args.no_reserve_full_sequence,
        chunked_prefill=not args.no_chunked_prefill,
    )


def run_serve_replay(args: argparse.Namespace) -> int:
    """Replay, print the table (or JSON), write the report; the sizing answer when a target is given."""
    from kvref.cli.replay import trace_name
    from kvref.contract.errors import InvalidValueError
    from kvref.contract.policies import EvictionPolicy
    from kvref.simulation.replay import check_warmup
    from kvref.simulation.serving.runner import load_workload
    from kvref.simulation.serving.sweep import grid, run_sweep
    from kvref.simulation.serving.tiers import DEFAULT_KV_BYTES_PER_TOKEN, check_tier_names

    check_warmup(args.warmup, "serve-replay")
    if args.range and args.target_hit_rate is None and args.target_ttft_p90 is None:
        raise InvalidValueError(
            "CONF-912", "--range bounds a capacity search: give --target-hit-rate or --target-ttft-p90"
        )
    searching = args.target_hit_rate is not None or args.target_ttft_p90 is not None
    if searching and not args.capacity and (len(set(args.policy or [])) > 1 or len(set(args.block_size or [])) > 1):
        raise InvalidValueError(
            "TRACE-1042",
            "a capacity search sizes one cache (the first --policy at the first --block-size, beside a grid of "
            "--capacity points): give one --policy and one --block-size, or the --capacity points to replay",
        )
    check_engine_arguments(args)
    if args.out and not args.compare:  # the report's plots: refused before any replay where they cannot be drawn
        from kvref.reports.plotting import pyplot

        pyplot("the serving replay's plots")
    tier_sizes = list(itertools.product(*args.tier)) if args.tier else [()]
    check_tier_names(tier_sizes[0])
    if args.kv_bytes_per_token is not None and not args.tier:
        raise InvalidValueError("TIER-1130", "--kv-bytes-per-token sizes the tiers' loads: it goes with --tier")
    if searching and len(tier_sizes) > 1:
        raise InvalidValueError(
            "TIER-1130", "a capacity search sizes the device with the tiers fixed: give one BLOCKS per --tier"
        )
    specs = _workloads(args)
    first = load_workload(specs[0])
    model = _model(args)
    policies = list(dict.fromkeys(args.policy or [p.value for p in EvictionPolicy]))
    groups = 1 + (args.sliding_window is not None) + args.mamba  # each group holds its own blocks (TRACE-1037)
    bounds = [tuple(groups * b for b in _default_capacities(load_workload(spec))) for spec in specs]
    fits, never = max(b[0] for b in bounds), max(b[1] for b in bounds)
    asked = sorted(set(args.capacity or []))
    if asked and asked[-1] > never:  # a cache that never evicts counts the same at any larger size
        shown = ", ".join(f"{c:,}" for c in asked if c > never)
        print(
            f"kvref serve-replay: capacity {shown} is more than the workload can fill ({never:,} blocks never "
            f"evict); replayed at {never:,} blocks, which counts the same",
            file=sys.stderr,
        )
    capacities = sorted({min(c, never) for c in asked} or {fits << k for k in range(6) if (fits << k) <= 2 * never})
    if args.engine != "kvref":
        return run_on_engine(args, specs, capacities, model)
    common = {"model": model, "warmup": args.warmup, "backend": args.backend, "belady": not args.no_belady}
    if args.tier:
        common.update(tiers=tier_sizes[0], kv_bytes_per_token=args.kv_bytes_per_token or DEFAULT_KV_BYTES_PER_TOKEN)
    notes = [first.note, f"step model: {model.describe()}", f"backend {args.backend}, warm-up {args.warmup:g}"]
    sizing = None
    results_file = Path(args.results) if args.results else None
    if searching:  # the search replays what it needs; the grid only where capacities are asked for too
        sizing = _size(args, specs[0], policies[0], common, fits, never)
        notes.append(f"{sizing.sentence()}; policy {policies[0]}, block size {first.block_size}")
    points = []
    if args.capacity or not searching:  # the device's capacities, at each size of the tiers (TIER-1129)
        for tiers in tier_sizes:
            points += grid(specs, policies, capacities, **{**common, **({"tiers": tiers} if tiers else {})})
    in_process = not args.scheduler and (args.workers == 1 or len(points) == 1)
    if not points:
        results = list(sizing.tried) if sizing is not None else []
    elif in_process:  # a bar over the trace's requests, point after point
        total = len(points) * len(first.requests)
        with progress_bar(f"replaying {len(first.requests):,} requests", total) as advance:
            results = run_sweep(
                points, results_file=results_file, workers=1, request_progress=lambda done, _total: advance(done)
            )
    else:
        with progress_bar("replaying", len(points)) as advance_point:
            results = run_sweep(
                points,
                results_file=results_file,
                workers=args.workers,
                scheduler=args.scheduler,
                progress=lambda p: advance_point(1),
            )
    title = f"kvref serve-replay: {trace_name(first.source)}, {len(first.requests):,} requests"
    empty = [] if searching else [r for r in results if r.counted_requests == 0]
    if empty:  # nothing was measured there: a table of zeros would read as an answer (a probe may be so)
        shown = ", ".join(f"{r.policy} at {r.capacity:,} blocks" for r in empty[:3])
        print(
            f"kvref serve-replay: no request was measured ({shown}{' and more' if len(empty) > 3 else ''}): "
            f"every one was rejected (TRACE-1037: none fits --max-model-len {args.max_model_len:,} and the "
            "cache) or fell in the warm-up",
            file=sys.stderr,
        )
        return 1
    if args.out:
        from kvref.reports.serving import write_serving_report

        for path in write_serving_report(results, Path(args.out), title=title, notes=notes, sizing=sizing):
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        payload: dict[str, Any] = {"title": title, "notes": notes, "results": [r.to_json() for r in results]}
        if sizing is not None:
            payload["sizing"] = {"capacity": sizing.capacity, "sentence": sizing.sentence()}
        print(json.dumps(payload, indent=1))
        return _sizing_status(sizing)
    print_serving_results(results, title, notes, sizing)
    return _sizing_status(sizing)


def _sizing_status(sizing: Any) -> int:
    """0, or 1 when a search found no capacity in its range meeting the target (TRACE-1048)."""
    if sizing is not None and sizing.capacity is None:
        print(f"kvref serve-replay: {sizing.sentence()}", file=sys.stderr)
        return 1
    return 0


def _size(args: argparse.Namespace, spec: Any, policy: str, common: dict[str, Any], fits: int, never: int) -> Any:
    """Bisect for the smallest capacity meeting the target (TRACE-1042, TRACE-1048)."""
    from kvref.simulation.serving.runner import ServingPoint
    from kvref.simulation.serving.sizing import SizingAnswer, size_cache
    from kvref.simulation.serving.sweep import read_results, run_sweep

    low, high = args.range or (fits, never)
    if high > never:  # a cache that never evicts answers for every larger one
        print(
            f"kvref serve-replay: --range reaches {high:,} blocks, more than the workload can fill; "
            f"searched up to {never:,} blocks, which count the same",
            file=sys.stderr,
        )
        low, high = min(low, never), never
    measure, target = (
        ("token hit rate", args.target_hit_rate)
        if args.target_hit_rate is not None
        else ("p90 TTFT (ms)", args.target_ttft_p90)
    )
    results_file = Path(args.results) if args.results else None
    probe = SizingAnswer(measure, target, low, high, None, ())
    with progress_bar("sizing", max(1, (high - low).bit_length() + 2)) as advance:
        read_back = 0
        on_file_before = read_results(results_file) if results_file is not None else {}

        def replay_at(capacity: int) -> Any:
            nonlocal read_back
            point = ServingPoint(spec, capacity, policy, **common)
            on_file = point.key() in on_file_before
            [result] = run_sweep([point], results_file=results_file, workers=1)  # a rerun reads it back
            read_back += on_file
            advance(1)
            if not quiet():  # each probe and its result, in a log too
                said = "meets" if probe.meets(result) else "misses"
                where = ", read back from --results" if on_file else ""
                print(
                    f"sizing: {capacity:,} blocks{where}: {measure} {probe.shown(result)}, {said} the target",
                    file=sys.stderr,
                )
            return result

        answer = size_cache(replay_at, measure=measure, target=target, low=low, high=high)
    if read_back:
        print(f"sizing: {read_back} of {len(answer.tried)} probes read back from {results_file}", file=sys.stderr)
    return answer


def run_traces(args: argparse.Namespace) -> int:
    """``list``: the catalog with what is fetched; ``fetch NAME``: download and check it (TRACE-1044)."""
    from rich.table import Table

    from kvref.contract.errors import InvalidValueError
    from kvref.simulation.catalog import CATALOG, cache_directory, fetch_trace

    directory = Path(args.dir) if args.dir else cache_directory()
    if args.action == "list" and args.name:
        raise InvalidValueError("CONF-912", f"kvref traces list takes no name, got {args.name!r}")
    if args.action == "list":
        table = Table(title=f"public traces kvref knows (cache: {directory})")
        for column in ("name", "source", "licence", "size", "sha256", "fetched", "what"):
            table.add_column(column, overflow="fold")
        for t in CATALOG:
            fetched = "yes" if (directory / t.filename).exists() else "no"
            table.add_row(t.name, t.source, t.licence, f"{t.size_bytes:,} B", t.sha256, fetched, t.description)
        print_table(table)
        return 0
    if not args.name:
        raise InvalidValueError("TRACE-1044", "kvref traces fetch: name the trace (kvref traces list shows them)")
    with progress_bar(f"fetching {args.name}") as advance:
        arrived = [0]

        def arriving(done: int, total: int) -> None:
            advance(done - arrived[0], total=total or None)
            arrived[0] = done

        path = fetch_trace(args.name, directory=directory, url=args.url, progress=arriving)
    print(path)
    return 0
