"""How far LRU is from the true optimum: results/optimum.md, .json and .png (TRACE-1060..TRACE-1063).

For each Mooncake trace and capacity: the hits of a replay under ``lru`` (the exact one-pass curve,
TRACE-1023) and of Belady's MIN, beside the offline optimum of ``kvref.simulation.optimum``: the LP
relaxation over the whole trace (an upper bound, TRACE-1063), and the integer program solved
exactly over a window of the trace's first requests (TRACE-1060), where MIN and LRU are replayed on
the same window. Where MIN reaches the whole trace's bound, MIN is certified optimal there.

    python scripts/optimum.py                    # both traces, four capacities
    python scripts/optimum.py --window 2000 --time-limit 120
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

from kvref.simulation.belady import belady_replay
from kvref.simulation.curves import HitRateCurve, lru_curve
from kvref.simulation.optimum import OfflineOptimum, offline_optimum
from kvref.simulation.traces import Trace, load_trace

TRACES = ["mooncake_conversation_trace.jsonl", "mooncake_synthetic_trace.jsonl"]
UNITS = ("blocks", "tokens")


@cache
def curve_of(trace: Trace) -> HitRateCurve:
    """The exact LRU curve of ``trace`` (one pass, TRACE-1023)."""
    return lru_curve(trace)


def row(trace: Trace, capacity: int, scope: str, exact: bool, time_limit: float) -> dict[str, Any]:
    """LRU, MIN and the optimum (or its bound) of ``trace`` at ``capacity``, in blocks and in tokens."""
    curve = curve_of(trace)
    lru = curve.at(capacity) if capacity >= curve.smallest else None
    belady = belady_replay(trace, capacity)
    out: dict[str, Any] = {"scope": scope, "capacity": capacity, "requests": len(trace.requests)}
    for i, unit in enumerate(UNITS):
        limit = time_limit if exact else None
        best: OfflineOptimum = offline_optimum(trace, capacity, unit=unit, exact=exact, time_limit=limit)
        out[unit] = {
            "total": best.total,
            "lru": None if lru is None else lru[i],
            "belady": belady.block_hits if unit == "blocks" else belady.token_hits,
            "optimum": best.hits,
            "exact": best.exact,
            "kind": "exact (ILP)" if best.exact else "upper bound (ILP, time limit)" if exact else "upper bound (LP)",
            "seconds": round(best.seconds, 2),
        }
        print(scope, capacity, unit, out[unit], flush=True)
    return out


def percent(hits: float | None, total: int) -> str:
    return "-" if hits is None else f"{100 * hits / total:.2f}%"


def table(rows: list[dict[str, Any]], unit: str) -> list[str]:
    lines = [
        f"| trace | scope | capacity | LRU | Belady's MIN | optimum | the optimum | LRU's gap | MIN's gap ({unit}) |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        u = r[unit]
        total = u["total"]
        kind = u.get("kind") or ("exact (ILP)" if u["exact"] else "upper bound (LP)")
        lru_gap = "-" if u["lru"] is None else f"{max(0.0, 100 * (u['optimum'] - u['lru']) / total):.2f} pp"
        min_gap = f"{max(0.0, 100 * (u['optimum'] - u['belady']) / total):.3f} pp"  # an LP's last digits may dip below
        lines.append(
            f"| {r['trace']} | {r['scope']} | {r['capacity']:,} | {percent(u['lru'], total)} | "
            f"{percent(u['belady'], total)} | {percent(u['optimum'], total)} | {kind}, {u['seconds']} s | "
            f"{lru_gap} | {min_gap} |"
        )
    return lines


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    """Token hit rate against capacity over each whole trace: LRU, MIN and the bound, labelled where
    they coincide (TRACE-1053)."""
    from kvref.reports.plotting import SeriesLabels, capacity_axis, hit_rate_axis, pyplot, series_style

    plt = pyplot("the optimum's plot")
    traces = sorted({str(r["trace"]) for r in rows})
    figure, axes = plt.subplots(1, len(traces), figsize=(6.5 * len(traces), 4.2), squeeze=False)
    for axis, name in zip(axes[0], traces, strict=True):
        whole = [r for r in rows if r["trace"] == name and r["scope"] == "whole trace"]
        capacities = [int(r["capacity"]) for r in whole]
        labels = SeriesLabels()
        for index, (key, series) in enumerate(
            (("lru", "LRU"), ("belady", "Belady's MIN"), ("optimum", "LP bound on the optimum"))
        ):
            rates = [r["tokens"][key] / r["tokens"]["total"] for r in whole]
            style = series_style(index, series)
            axis.plot(
                capacities,
                [100 * v for v in rates],
                label=labels.label(series, list(zip(capacities, rates, strict=True))),
                **style,
            )
        capacity_axis(axis, capacities)
        hit_rate_axis(axis)
        axis.set_title(f"{name}, blocks of 512 tokens")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=150)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--traces", type=Path, default=Path("../shared/traces"))
    parser.add_argument("--capacities", type=int, nargs="+", default=[1000, 3000, 10000, 30000])
    parser.add_argument("--window", type=int, default=2000, help="requests of the window solved exactly")
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds HiGHS may take per integer program")
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--report-only", action="store_true", help="rewrite optimum.md and .png from optimum.json")
    args = parser.parse_args()
    if args.report_only:
        made = json.loads((args.out / "optimum.json").read_text(encoding="utf-8"))
        write_report(made["rows"], args.out, made["command"], made["seconds"])
        return 0
    started = time.perf_counter()
    rows = []
    for name in TRACES:
        trace = load_trace(args.traces / name)
        window = dataclasses.replace(trace, requests=trace.requests[: args.window])
        for capacity in args.capacities:
            rows.append(
                {"trace": name.removesuffix(".jsonl"), **row(trace, capacity, "whole trace", False, args.time_limit)}
            )
        for capacity in args.capacities[:2]:
            scope = f"first {args.window:,} requests"
            rows.append({"trace": name.removesuffix(".jsonl"), **row(window, capacity, scope, True, args.time_limit)})
    seconds = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    command = f"python scripts/optimum.py --window {args.window} --time-limit {args.time_limit:g}"
    made = {"command": command, "seconds": round(seconds), "rows": rows}
    (args.out / "optimum.json").write_text(json.dumps(made, indent=1) + "\n", encoding="utf-8")
    write_report(rows, args.out, command, seconds)
    return 0


def write_report(rows: list[dict[str, Any]], out: Path, command: str, seconds: float) -> None:
    """optimum.md (the tables) and optimum.png (the plot) under ``out``."""
    lines = [
        "# How far LRU is from the true optimum",
        "",
        "The offline optimum of a prefix cache under the replay's rules (chapter 10, TRACE-1060..TRACE-1063;",
        "`kvref.simulation.optimum`), solved by HiGHS through SciPy: over each whole trace its LP relaxation,",
        "an upper bound on what any eviction policy can hit; over a window of the first requests the",
        "integer program itself, exactly. LRU is the exact one-pass curve (TRACE-1023; `-` below the",
        "longest request, where it is not defined), Belady's MIN the replay of TRACE-1017. Gaps are in",
        "percentage points of the counted blocks or tokens. Where MIN's gap is 0 against the whole",
        "trace's bound, MIN is certified optimal there.",
        "",
        f"Made by `{command}` in {seconds:.0f} s.",
        "",
        "## Block hits",
        "",
        *table(rows, "blocks"),
        "",
        "## Token hits",
        "",
        *table(rows, "tokens"),
        "",
        "![token hit rate against capacity](optimum.png)",
        "",
    ]
    (out / "optimum.md").write_text("\n".join(lines), encoding="utf-8")
    plot(rows, out / "optimum.png")
    print(f"wrote {out}/optimum.md, .json, .png", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
