"""What ``kvref replay --out DIR`` writes: the results as JSON, a Markdown summary and a plot.

``replay.json`` holds every result; ``replay.md`` a table per run and, for a sweep, the token
hit rate by capacity with one column per policy; ``hit-rate.png`` plots the token hit rate
against capacity, one curve per policy (Belady's MIN dashed), with the infinite-capacity rate as
a horizontal line. The plot needs matplotlib (``pip install 'kvref[plots]'``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from kvref.reports.plotting import SeriesLabels, capacity_axis, finish_figure, hit_rate_axis, pyplot, series_style
from kvref.simulation.curves import HitRateCurve
from kvref.simulation.replay import ReplayResult

__all__ = ["render_markdown", "write_curve_report", "write_replay_report"]


def render_markdown(results: list[ReplayResult], title: str, backend_runs: Sequence[ReplayResult] = ()) -> str:
    """The Markdown summary of one replay run (and of the same replay on every usable backend)."""
    lines = [f"# {title}", ""]
    lines.append("| capacity | policy | block hit rate | token hit rate | no-evict (tokens) | evictions | blocks/s |")
    lines.append("|---:|---|---:|---:|---:|---:|---:|")
    for r in results:
        lines.append(
            f"| {r.capacity:,} | {r.policy} | {r.block_hit_rate:.2%} | {r.token_hit_rate:.2%} | "
            f"{r.infinite_token_hit_rate:.2%} | {r.evictions:,} | {r.block_ops_per_second:,.0f} |"
        )
    lines += [
        "",
        "- *no-evict*: the token hit rate of a cache that never evicts (TRACE-1016), the most any policy "
        'could reach; *belady*: Belady\'s offline MIN (TRACE-1017); "-" where a policy was not replayed '
        "at that capacity (Belady is computed for the hash-block cache only).",
    ]
    capacities = sorted({r.capacity for r in results})
    policies = list(dict.fromkeys(r.policy for r in results))
    if len(capacities) > 1:
        by = {(r.capacity, r.policy): r for r in results}
        lines += ["", "## Token hit rate by capacity", ""]
        lines.append("| capacity | " + " | ".join(policies) + " |")
        lines.append("|---:|" + "---:|" * len(policies))
        for c in capacities:
            cells = [f"{by[(c, p)].token_hit_rate:.2%}" if (c, p) in by else "-" for p in policies]
            lines.append(f"| {c:,} | " + " | ".join(cells) + " |")
    if backend_runs:
        first = backend_runs[0]
        lines += ["", f"## Every usable backend: {first.policy} at {first.capacity:,} blocks", ""]
        lines.append(
            f"| backend | replay | block hit rate | token hit rate | evictions | same counts as {first.backend} "
            "| blocks/s |"
        )
        lines.append("|---|---|---:|---:|---:|---|---:|")
        for r in backend_runs:
            same = r.counts() == first.counts()
            lines.append(
                f"| {r.backend} | {r.mode} | {r.block_hit_rate:.2%} | {r.token_hit_rate:.2%} | {r.evictions:,} | "
                f"{'yes' if same else 'NO'} | {r.block_ops_per_second:,.0f} |"
            )
    lines += ["", "![token hit rate against capacity](hit-rate.png)", ""]
    return "\n".join(lines)


def _plot(results: list[ReplayResult], title: str, path: Path) -> None:
    """Token hit rate against capacity, one styled series per policy; a series that coincides with
    one drawn before it says so in its label, so both are seen."""
    plt = pyplot("the replay plot")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = SeriesLabels()
    for index, policy in enumerate(dict.fromkeys(r.policy for r in results)):
        points = sorted((r.capacity, r.token_hit_rate) for r in results if r.policy == policy)
        label = labels.label(policy, points)
        ax.plot([c for c, _ in points], [h * 100 for _, h in points], label=label, **series_style(index, policy))
    ax.axhline(results[0].infinite_token_hit_rate * 100, color="grey", linestyle=":", label="no eviction")
    capacity_axis(ax, [r.capacity for r in results])
    hit_rate_axis(ax)
    finish_figure(plt, fig, ax, title, path)


def write_replay_report(
    results: list[ReplayResult], out_dir: Path, *, title: str, backend_runs: Sequence[ReplayResult] = ()
) -> list[Path]:
    """Write ``replay.json``, ``replay.md`` and ``hit-rate.png`` under ``out_dir``; return their paths.

    ``backend_runs`` (one configuration on every usable backend) go into the JSON and the
    Markdown, not the plot.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    data = out_dir / "replay.json"
    data.write_text(json.dumps([r.to_json() for r in [*results, *backend_runs]], indent=1) + "\n", encoding="utf-8")
    summary = out_dir / "replay.md"
    summary.write_text(render_markdown(results, title, backend_runs), encoding="utf-8")
    plot = out_dir / "hit-rate.png"
    _plot(results, title, plot)
    return [data, summary, plot]


def write_curve_report(
    curve: HitRateCurve, out_dir: Path, *, title: str, optimum: list[dict[str, float]] | None = None
) -> list[Path]:
    """Write ``curve.json`` (block and token hits at every capacity of ``curve``) and ``curve.png`` (both
    hit rates against capacity, with the rate of a cache that never evicts) under ``out_dir``.

    ``optimum``: points (``capacity`` and the hit rates ``belady_block``, ``belady_token``,
    ``bound_block``, ``bound_token``) of Belady's MIN and the bound on the offline optimum
    (TRACE-1063), drawn as markers and kept in the JSON under ``"optimum"``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = out_dir / "curve.json"
    data.write_text(json.dumps({**asdict(curve), "optimum": optimum or []}) + "\n", encoding="utf-8")
    plt = pyplot("the curve plot")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    capacities = range(curve.smallest, curve.largest + 1)
    for index, (name, hits, total) in enumerate(
        (("token hit rate", curve.token_hits, curve.tokens), ("block hit rate", curve.block_hits, curve.blocks))
    ):
        style = {**series_style(index, name), "marker": None}
        ax.plot(capacities, [100 * h / total if total else 0.0 for h in hits], label=f"lru, lru-leaf: {name}", **style)
    markers = (
        ("belady_token", "Belady's MIN: token hit rate", 0, "x"),
        ("belady_block", "Belady's MIN: block hit rate", 1, "+"),
        ("bound_token", "bound on the optimum: token hit rate", 0, "o"),
        ("bound_block", "bound on the optimum: block hit rate", 1, "o"),
    )
    labels = SeriesLabels()  # MIN and the bound often coincide: the label says so (TRACE-1053)
    for key, name, color_of, marker in markers if optimum else ():
        style = {**series_style(color_of, name), "linestyle": "none", "marker": marker, "markersize": 8}
        if marker == "o":
            style["markerfacecolor"] = "none"
        points = [(int(p["capacity"]), p[key]) for p in optimum or ()]
        ax.plot([c for c, _ in points], [100 * v for _, v in points], label=labels.label(name, points), **style)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda value, _: f"{value:,.0f}"))
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel(
        f"cache capacity (blocks of {curve.block_size} tokens), from the longest request ({curve.smallest:,})"
    )
    ax.set_ylim(bottom=0)
    ax.set_ylabel("hit rate (%)")
    plot = out_dir / "curve.png"
    finish_figure(plt, fig, ax, title, plot)
    return [data, plot]
