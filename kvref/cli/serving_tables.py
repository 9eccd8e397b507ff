"""The serving replay's results as tables on a terminal: hits, latency and blocks, then the tiers' lines."""

from __future__ import annotations

from typing import Any

from kvref.cli.console import print_table

__all__ = ["print_serving_results", "print_tier_lines"]


def print_serving_results(results: list[Any], title: str, notes: list[str], sizing: Any) -> None:
    """Three narrow tables (hits, latency, blocks), each within 80 columns, then the notes, the tiers' lines
    and, with ``sizing``, the capacities its search replayed."""
    from rich import box
    from rich.table import Table

    from kvref.reports.serving import COLUMN_NOTES, TABLE_COLUMNS, TABLE_GROUPS, table_row

    rows = [dict(zip(TABLE_COLUMNS, table_row(r, results), strict=True)) for r in results]
    print(title)
    for heading, columns in TABLE_GROUPS:
        table = Table(title=heading, box=box.SIMPLE_HEAD, padding=(0, 1))
        for column in columns:
            table.add_column(column, justify="left" if column == "policy" else "right", overflow="fold")
        for row in rows:
            table.add_row(*(row[c] for c in columns))
        print_table(table)
    for note in (*(f"- {n}" for n in notes), *COLUMN_NOTES):
        print(note)
    print_tier_lines(results)
    if sizing is not None:  # its answer is among the notes
        curve = Table(title="the capacities the search replayed", box=box.SIMPLE_HEAD, padding=(0, 1))
        for column in ("blocks", sizing.measure, "meets"):
            curve.add_column(column, justify="right", overflow="fold")
        for r in sizing.tried:
            curve.add_row(f"{r.capacity:,}", sizing.shown(r), "yes" if sizing.meets(r) else "no")
        print_table(curve)


def print_tier_lines(results: list[Any]) -> None:
    """Per replay and tier: what it served, loads faster and slower than recomputing, the crossover (TIER-1129)."""
    from rich import box
    from rich.table import Table

    tiered = [r for r in results if r.tiers is not None]
    if not tiered:
        return
    table = Table(title="tiers below the device", box=box.SIMPLE_HEAD, padding=(0, 1))
    columns = ("policy", "blocks", "tier", "tier blocks", "requests", "tokens", "faster", "slower", "crossover")
    for column in columns:
        table.add_column(column, justify="left" if column in ("policy", "tier") else "right", overflow="fold")
    for r in tiered:
        for line in r.tiers.lines:
            crossover = "never" if line.crossover_blocks is None else f"{line.crossover_blocks:,}"
            table.add_row(
                r.policy,
                f"{r.capacity:,}",
                line.name,
                f"{line.blocks:,}",
                f"{line.requests:,}",
                f"{line.tokens:,}",
                f"{line.helped:,}",
                f"{line.hurt:,}",
                crossover,
            )
    print_table(table)
    for line in tiered[0].tiers.lines:
        print(
            f"- {line.name}: at {line.gbps:g} GB/s and {line.latency_ms:g} ms a load; a block "
            f"loads in {line.load_ms_per_block:.3f} ms and recomputes in {line.recompute_ms_per_block:.3f} ms"
        )
    print(
        "- faster, slower: requests whose blocks from the tier loaded in less (more) time than recomputing them; "
        "crossover: the fewest blocks from which a load from the tier beats recomputing them"
    )
