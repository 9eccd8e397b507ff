"""kvref's serving replay beside an engine's scheduler as a table: one row per configuration, then the
requests that differ (TRACE-1051). Used by ``kvref serve-replay --compare`` and results/sim-to-real*.md.
Each function takes the engine's name as the tables print it (``ENGINE_NAMES``).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvref.simulation.serving.comparison import Comparison, RequestDifference
from kvref.simulation.serving.results import RequestRecord

__all__ = [
    "DIFFERENCE_COLUMNS",
    "ENGINE_NAMES",
    "comparison_columns",
    "comparison_notes",
    "comparison_row",
    "difference_rows",
    "render_comparison_markdown",
]

#: Each engine's name as the tables print it.
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def comparison_columns(engine: str) -> tuple[str, ...]:
    """Columns of a comparison's row against ``engine`` (its name as printed), the configuration first."""
    return (
        "configuration",
        "requests",
        "rejected",
        "exact",
        "counts equal",
        "cached equal",
        "preemptions equal",
        "first-token step equal",
        "kvref hits",
        f"{engine} hits",
        "error (pp)",
        f"preemptions kvref / {engine}",
        "kvref s",
        f"{engine} s",
    )


#: Columns of a differing request's row.
DIFFERENCE_COLUMNS = ("configuration", "request", "side", "cached tokens", "preemptions", "first-token step", "at (ms)")


def comparison_notes(engine: str) -> tuple[str, ...]:
    """What the columns mean, printed under the tables."""
    return (
        "- *exact*: requests whose cached tokens, preemption count, first-token step and first-token time "
        "are all equal on both sides (TRACE-1051); the *equal* columns count one field each.",
        f"- *kvref hits*, *{engine} hits*: prompt tokens cached at each request's first admission over prompt "
        f"tokens, requests after the warm-up; *error*: kvref's minus {engine}'s, in percentage points.",
        f"- *rejected*: requests that could never fit, kvref / {engine}, left out of the comparison (TRACE-1037); "
        "*counts equal*: every aggregate count and time of the two replays is equal (steps, evictions, "
        "prefill tokens, blocks in use, makespan).",
        f"- *kvref s*, *{engine} s*: each replay's own wall time on this machine.",
    )


def _share(count: int, total: int) -> str:
    return f"{100 * count / total:.2f}%" if total else "-"


def comparison_row(name: str, comparison: Comparison) -> list[str]:
    """One configuration's row, every number whole (:func:`comparison_columns`)."""
    c = comparison
    n = c.requests
    return [
        name,
        f"{n:,}",
        f"{c.kvref.rejected:,} / {c.engine.rejected:,}",
        f"{_share(c.exact, n)} ({c.exact:,})",
        "yes" if c.counts_equal else "no",
        _share(c.cached_equal, n),
        _share(c.preemptions_equal, n),
        _share(c.first_step_equal, n),
        f"{100 * c.kvref.token_hit_rate:.4f}%",
        f"{100 * c.engine.token_hit_rate:.4f}%",
        f"{c.hit_rate_error_pp:+.4f}",
        f"{c.kvref.preemptions:,} / {c.engine.preemptions:,}",
        f"{c.kvref.seconds:.2f}",
        f"{c.engine.seconds:.2f}",
    ]


def _side(record: RequestRecord | None) -> list[str]:
    if record is None:
        return ["not finished", "-", "-", "-"]
    return [
        f"{record.cached_tokens:,}",
        f"{record.preemptions:,}",
        f"{record.first_token_step:,}",
        f"{record.first_token_us / 1000:,.3f}",
    ]


def difference_rows(name: str, differences: Sequence[RequestDifference], engine: str) -> list[list[str]]:
    """Two rows per differing request, kvref's then ``engine``'s (DIFFERENCE_COLUMNS)."""
    rows = []
    for d in differences:
        rows.append([name, f"r{d.index}", "kvref", *_side(d.kvref)])
        rows.append([name, f"r{d.index}", engine, *_side(d.engine)])
    return rows


def _markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def render_comparison_markdown(
    title: str, comparisons: Sequence[tuple[str, Comparison]], *, engine: str, notes: Sequence[str] = ()
) -> str:
    """The Markdown of ``comparisons`` against ``engine``: the table, its notes, then each configuration's
    differing requests."""
    lines = [f"# {title}", ""]
    lines += list(notes)
    if notes:
        lines.append("")
    lines += _markdown_table(comparison_columns(engine), [comparison_row(name, c) for name, c in comparisons])
    lines += ["", *comparison_notes(engine), ""]
    differing = [row for name, c in comparisons for row in difference_rows(name, c.differences, engine)]
    lines.append("## Requests that differ (the first ten of each configuration)")
    lines.append("")
    if differing:
        lines += _markdown_table(DIFFERENCE_COLUMNS, differing)
    else:
        lines.append("None: every request is exactly equal in every configuration.")
    return "\n".join(lines) + "\n"
