"""What ``kvref serve-replay --out DIR`` writes: results as JSON, a Markdown summary and three plots.

``serving.json`` holds every result (and the sizing answer); ``serving.md`` the table, the notes
a reader needs (how outputs and block size were treated, TRACE-1046; the step model), the hit rate
and p90 time to first token by capacity per policy, and the sizing curve; ``serving-hit-rate.png``
and ``serving-ttft.png`` plot them against capacity, one curve per policy (Belady's offline
reference dashed); ``serving-blocks.png`` shows blocks in use over time. Plots need matplotlib.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvref.reports.plotting import SeriesLabels, capacity_axis, finish_figure, hit_rate_axis, pyplot, series_style
from kvref.simulation.serving.results import ServingResult
from kvref.simulation.serving.sizing import SizingAnswer

__all__ = [
    "COLUMN_NOTES",
    "TABLE_COLUMNS",
    "TABLE_GROUPS",
    "curve_label",
    "render_serving_markdown",
    "table_row",
    "write_serving_report",
]

#: Columns of the results table, shared by the terminal table and the Markdown.
TABLE_COLUMNS = (
    "blocks",
    "policy",
    "token hits",
    "block hits",
    "Belady",
    "prefill saved",
    "TTFT p50",
    "TTFT p90",
    "TTFT p99",
    "queue p90",
    "preempted",
    "rejected",
    "peak blocks",
    "mean blocks",
    "evictions",
    "replay s",
)


#: What a column means where its name does not say it all, printed under every table of them.
COLUMN_NOTES = (
    "- *token hits*, *block hits*: prompt tokens and blocks found cached at each request's first "
    "admission, over the requests after the warm-up that were not rejected (TRACE-1039).",
    "- *Belady*: the same hits under Belady's offline MIN over the prompts (TRACE-1017); "
    '"-" where it was not computed: with `--no-belady`, and for a token-level workload, whose outputs '
    "later requests hit, where MIN over the prompts alone is no bound.",
    "- *prefill saved*: prompt tokens not recomputed thanks to the cache, re-admissions after a "
    "preemption included; so it can be largest at the smallest capacity, where requests are "
    "preempted and re-admitted most.",
    "- *TTFT*: time to first token, from arrival; *queue*: time from arrival to first admission.",
)


#: The same columns in three narrower tables for a terminal (each fits 80 columns): title, columns.
TABLE_GROUPS = (
    (
        "hits at first admission",
        ("blocks", "policy", "token hits", "block hits", "Belady", "prefill saved", "evictions"),
    ),
    ("latency", ("blocks", "policy", "TTFT p50", "TTFT p90", "TTFT p99", "queue p90")),
    ("blocks and preemption", ("blocks", "policy", "preempted", "rejected", "peak blocks", "mean blocks", "replay s")),
)


def _ms(value: float) -> str:
    return f"{value:,.1f} ms"


def tier_sizes(r: ServingResult) -> tuple[tuple[str, int], ...]:
    """The tiers below the device of ``r`` as (name, blocks), first tier first; empty without tiers."""
    return tuple((line.name, line.blocks) for line in r.tiers.lines) if r.tiers is not None else ()


def curve_label(r: ServingResult, results: Sequence[ServingResult]) -> str:
    """The policy, with the block size where ``results`` hold several (a block-size sweep), and the
    tiers' sizes where they differ (a sweep of the tiers, TIER-1129)."""
    label = r.policy
    if len({x.block_size for x in results}) > 1:
        label = f"{label}, {r.block_size}-token blocks"
    if len({tier_sizes(x) for x in results}) > 1:
        label += "".join(f", {name} {blocks:,}" for name, blocks in tier_sizes(r)) or ", no tier"
    return label


def table_row(r: ServingResult, results: Sequence[ServingResult] = ()) -> list[str]:
    """One result as the cells of :data:`TABLE_COLUMNS`, every number whole (the policy labelled as
    :func:`curve_label` does among ``results``)."""
    belady = r.belady_token_hit_rate
    return [
        f"{r.capacity:,}",
        curve_label(r, results or [r]),
        f"{r.token_hit_rate:.2%}",
        f"{r.block_hit_rate:.2%}",
        "-" if belady is None else f"{belady:.2%}",
        f"{r.prefill_tokens_saved:,}",
        _ms(r.ttft_ms.p50),
        _ms(r.ttft_ms.p90),
        _ms(r.ttft_ms.p99),
        _ms(r.queue_ms.p90),
        f"{r.preemptions:,}",
        f"{r.rejected:,}",
        f"{r.peak_blocks_in_use:,}",
        f"{r.mean_blocks_in_use:,.1f}",
        f"{r.evictions:,}",
        f"{r.seconds:.2f}",
    ]


def _by_capacity(results: Sequence[ServingResult], cell: Any, title: str) -> list[str]:
    capacities = sorted({r.capacity for r in results})
    policies = list(dict.fromkeys(curve_label(r, results) for r in results))
    by = {(r.capacity, curve_label(r, results)): r for r in results}
    lines = ["", f"## {title}", "", "| blocks | " + " | ".join(policies) + " |", "|---:|" + "---:|" * len(policies)]
    for c in capacities:
        cells = [cell(by[(c, p)]) if (c, p) in by else "-" for p in policies]
        lines.append(f"| {c:,} | " + " | ".join(cells) + " |")
    return lines


def render_serving_markdown(
    results: Sequence[ServingResult], *, title: str, notes: Sequence[str], sizing: SizingAnswer | None = None
) -> str:
    """The Markdown summary of a serving replay run (TRACE-1039, TRACE-1046)."""
    lines = [f"# {title}", ""]
    lines += [f"- {note}" for note in notes]
    lines += ["", "| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---:|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(table_row(r, results)) + " |" for r in results]
    lines += ["", *COLUMN_NOTES]
    if len({r.capacity for r in results}) > 1:
        lines += _by_capacity(results, lambda r: f"{r.token_hit_rate:.2%}", "Token hit rate by capacity")
        lines += _by_capacity(results, lambda r: _ms(r.ttft_ms.p90), "p90 time to first token by capacity")
    lines += render_tier_grid(results)
    if sizing is not None:
        lines += ["", "## Cache sizing", "", sizing.sentence() + ".", "", f"| blocks | {sizing.measure} | meets |"]
        lines.append("|---:|---:|---|")
        for r in sizing.tried:
            lines.append(f"| {r.capacity:,} | {sizing.shown(r)} | {'yes' if sizing.meets(r) else 'no'} |")
    lines += [
        "",
        "![token hit rate against capacity](serving-hit-rate.png)",
        "![p90 time to first token against capacity](serving-ttft.png)",
        "![blocks in use over time](serving-blocks.png)",
        "",
    ]
    return "\n".join(lines)


def _curves(results: Sequence[ServingResult], title: str, path: Path, *, hit_rate: bool) -> None:
    """Token hit rate, or time to first token (seconds, log axis, p90 with p50-p99 whiskers), against
    capacity: one styled series per policy and block size, Belady's offline reference beside."""
    plt = pyplot("the serving replay's plots")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = list(dict.fromkeys(curve_label(r, results) for r in results))
    coinciding = SeriesLabels()
    for index, label in enumerate(labels):
        runs = sorted((r for r in results if curve_label(r, results) == label), key=lambda r: r.capacity)
        capacities = [r.capacity for r in runs]
        style = series_style(index, label)
        if hit_rate:  # a series that coincides with one drawn before says so, so both are seen
            shown = coinciding.label(label, [(r.capacity, r.token_hit_rate) for r in runs])
            ax.plot(capacities, [r.token_hit_rate * 100 for r in runs], label=shown, **style)
        else:  # p90 on the line; p50 to p99 as whiskers, each series a little aside so none hides another
            middle = [r.ttft_ms.p90 / 1000 for r in runs]
            ax.plot(capacities, middle, label=f"{label} (p90)", **style)
            aside = [c * 1.035 ** (index - (len(labels) - 1) / 2) for c in capacities]
            below = [m - r.ttft_ms.p50 / 1000 for m, r in zip(middle, runs, strict=True)]
            above = [r.ttft_ms.p99 / 1000 - m for m, r in zip(middle, runs, strict=True)]
            ax.errorbar(
                aside,
                middle,
                yerr=[below, above],
                fmt="none",
                ecolor=style["color"],
                elinewidth=1,
                capsize=2,
                alpha=0.8,
            )
    if hit_rate:
        belady = sorted({(r.capacity, r.belady_token_hit_rate) for r in results if r.belady_token_hit_rate is not None})
        if belady:
            ax.plot(
                [c for c, _ in belady],
                [h * 100 for _, h in belady],
                label="Belady (offline)",
                **series_style(len(labels), "Belady"),
            )
        hit_rate_axis(ax)
    else:
        ax.set_yscale("log")
        ax.set_ylabel("time to first token (s): p90, whiskers p50-p99")
    capacity_axis(ax, [r.capacity for r in results])
    finish_figure(plt, fig, ax, title, path)


def _timelines(results: Sequence[ServingResult], title: str, path: Path) -> None:
    """Blocks in use over time, one line per policy, at the capacity in the middle of those replayed."""
    plt = pyplot("the serving replay's plots")
    capacities = sorted({r.capacity for r in results})
    middle = capacities[len(capacities) // 2]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    shown = [run for run in results if run.capacity == middle and run.timeline]
    for index, run in enumerate(shown):
        times, blocks = [t / 1000 for t, _ in run.timeline], [b for _, b in run.timeline]
        label = curve_label(run, results)
        width = max(0.6, 2.4 - 0.45 * index)  # thinner over thicker: series that coincide all show
        ax.step(times, blocks, where="post", label=label, color=series_style(index, label)["color"], linewidth=width)
    ax.axhline(middle, color="grey", linestyle=":", label="capacity")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("blocks in use")
    finish_figure(plt, fig, ax, f"{title}\nat {middle:,} blocks", path)


def _tier_grid(results: Sequence[ServingResult]) -> tuple[list[int], list[int], dict[tuple[int, int], ServingResult]]:
    """Device capacities, first-tier sizes and the result at each pair, for one policy and block size."""
    if not results:
        return [], [], {}
    first = results[0]
    same = [r for r in results if (r.policy, r.block_size) == (first.policy, first.block_size) and r.tiers]
    cells = {(r.capacity, r.tiers.lines[0].blocks): r for r in same if r.tiers is not None}
    return sorted({c for c, _ in cells}), sorted({t for _, t in cells}), cells


def _tier_heatmap(results: Sequence[ServingResult], title: str, path: Path) -> None:
    """p90 time to first token over device blocks x first-tier blocks, each cell annotated (TIER-1129)."""
    plt = pyplot("the serving replay's plots")
    from matplotlib.colors import LogNorm

    devices, sizes, cells = _tier_grid(results)
    name = results[0].tiers.lines[0].name if results[0].tiers is not None else "tier"
    values = [[cells[(d, t)].ttft_ms.p90 if (d, t) in cells else float("nan") for d in devices] for t in sizes]
    fig, ax = plt.subplots(figsize=(1.2 * len(devices) + 3, 0.7 * len(sizes) + 2.5))
    finite = [v for row in values for v in row if v == v]
    spread = bool(finite) and min(finite) > 0 and max(finite) / min(finite) > 10
    norm = LogNorm(min(finite), max(finite)) if spread else None  # a log scale where the cells span decades
    image = ax.imshow(values, cmap="viridis_r", aspect="auto", origin="lower", norm=norm)
    for y, row in enumerate(values):
        for x, value in enumerate(row):
            if value == value:
                shade = image.cmap(image.norm(value))
                colour = "white" if 0.299 * shade[0] + 0.587 * shade[1] + 0.114 * shade[2] < 0.5 else "black"
                ax.text(x, y, f"{value:,.1f} ms", ha="center", va="center", fontsize=8, color=colour)
    ax.set_xticks(range(len(devices)), [f"{d:,}" for d in devices], fontsize=8)
    ax.set_yticks(range(len(sizes)), [f"{t:,}" for t in sizes], fontsize=8)
    ax.set_xlabel("device capacity (blocks)")
    ax.set_ylabel(f"{name} tier (blocks)")
    fig.colorbar(image, ax=ax, label="p90 time to first token (ms)")
    ax.set_title(f"{title}\np90 TTFT by device and {name} blocks, {results[0].policy}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def render_tier_grid(results: Sequence[ServingResult]) -> list[str]:
    """The Markdown table of the tier sweep: p90 TTFT and tokens the first tier served, device x tier blocks."""
    devices, sizes, cells = _tier_grid(results)
    if len(devices) < 2 and len(sizes) < 2:
        return []
    name = results[0].tiers.lines[0].name if results[0].tiers is not None else "tier"
    lines = ["", f"## p90 time to first token by device and {name} blocks", ""]
    lines += [f"| {name} blocks | " + " | ".join(f"{d:,}" for d in devices) + " |", "|---:|" + "---:|" * len(devices)]
    for t in sizes:
        row = [_ms(cells[(d, t)].ttft_ms.p90) if (d, t) in cells else "-" for d in devices]
        lines.append(f"| {t:,} | " + " | ".join(row) + " |")
    return [*lines, "", "![p90 TTFT by device and tier blocks](serving-tiers.png)"]


def write_serving_report(
    results: Sequence[ServingResult],
    out_dir: Path,
    *,
    title: str,
    notes: Sequence[str],
    sizing: SizingAnswer | None = None,
) -> list[Path]:
    """Write ``serving.json``, ``serving.md`` and the three plots under ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = out_dir / "serving.json"
    payload: dict[str, Any] = {"title": title, "notes": list(notes), "results": [r.to_json() for r in results]}
    if sizing is not None:
        payload["sizing"] = {
            "measure": sizing.measure,
            "target": sizing.target,
            "low": sizing.low,
            "high": sizing.high,
            "capacity": sizing.capacity,
            "sentence": sizing.sentence(),
        }
    data.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    summary = out_dir / "serving.md"
    summary.write_text(render_serving_markdown(results, title=title, notes=notes, sizing=sizing), encoding="utf-8")
    paths = [data, summary]
    for name, hit_rate in (("serving-hit-rate.png", True), ("serving-ttft.png", False)):
        _curves(results, title, out_dir / name, hit_rate=hit_rate)
        paths.append(out_dir / name)
    _timelines(results, title, out_dir / "serving-blocks.png")
    paths.append(out_dir / "serving-blocks.png")
    if render_tier_grid(results):
        _tier_heatmap(results, title, out_dir / "serving-tiers.png")
        paths.append(out_dir / "serving-tiers.png")
    return paths
