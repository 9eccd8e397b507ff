"""What every report's plots share: matplotlib loaded on first use (the ``plots`` extra), one style
per series, capacity axes ticked where the replays were, and one way to finish a figure."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvref.contract.errors import BackendUnavailableError

__all__ = ["SeriesLabels", "capacity_axis", "finish_figure", "hit_rate_axis", "pyplot", "series_style"]

#: Series of hit rates closer than this everywhere (percentage points) would hide one another: the
#: later one's label names the earlier one.
NEAR_PP = 0.5

#: Colour-blind-safe colours (Okabe and Ito's, then Tol's muted ones), ten before any repeats and
#: none black (Belady's) or pale yellow (unreadable on white); then line styles and markers: series
#: that coincide stay apart by style even where their lines overlap.
_COLOURS = (
    "#0072B2",
    "#D55E00",
    "#009E73",
    "#CC79A7",
    "#E69F00",
    "#56B4E9",
    "#882255",
    "#332288",
    "#999933",
    "#44AA99",
)
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<")


def pyplot(what: str) -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or BackendUnavailableError saying ``what`` needs it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BackendUnavailableError("CONF-902", f"{what} need matplotlib: pip install 'kvref[plots]'") from None
    return plt


def series_style(index: int, name: str) -> dict[str, Any]:
    """The style of the ``index``-th series, named ``name``: its own colour and marker; the radix
    cache's policies (``radix-*``) dash-dotted beside the hash-block cache's solid lines; Belady's
    offline reference black and dashed. Markers shrink with the index, so a series drawn over
    another that coincides with it leaves the first one's marker showing around its own."""
    if name.lower().startswith("belady"):
        return {"color": "black", "linestyle": "--", "marker": "x", "markersize": 6, "linewidth": 1.2}
    return {
        "color": _COLOURS[index % len(_COLOURS)],
        "linestyle": "-." if name.startswith("radix-") else "-",
        "marker": _MARKERS[index % len(_MARKERS)],
        "markersize": max(3.0, 8.0 - 1.0 * index),
        "linewidth": 1.4,
        "alpha": 0.9,
    }


class SeriesLabels:
    """Labels for series of hit rates drawn one after another: a series that coincides with one drawn
    before it (the same capacities, every rate equal, or within :data:`NEAR_PP` percentage points)
    says so in its label, ``lru-leaf (= lru)`` or ``radix-lru (~ lru, within 0.1 pp)``, so that a
    reader knows both are there though one line hides the other (TRACE-1053)."""

    def __init__(self) -> None:
        self._drawn: list[tuple[str, dict[int, float]]] = []

    def label(self, name: str, points: Sequence[tuple[int, float]]) -> str:
        """The label of series ``name`` with ``points`` (capacity, hit rate as a fraction)."""
        mine = dict(points)
        shown = name
        for other, theirs in self._drawn:
            if theirs.keys() != mine.keys():
                continue
            gap = max(abs(mine[c] - theirs[c]) for c in mine) * 100 if mine else 0.0
            if gap < 1e-4:
                shown = f"{name} (= {other})"
                break
            if gap < NEAR_PP:
                shown = f"{name} (~ {other}, within {max(gap, 0.1):.1f} pp)"
                break
        self._drawn.append((name, mine))
        return shown


def hit_rate_axis(ax: Any) -> None:
    """A hit-rate axis in percent from 0, with a little room below so a series at 0% is not hidden
    behind the axis line (TRACE-1053)."""
    ax.set_ylim(bottom=-1.5)
    top = ax.get_ylim()[1]
    ax.set_yticks([t for t in ax.get_yticks() if 0 <= t <= top])
    ax.set_ylabel("token hit rate (%)")


def capacity_axis(ax: Any, capacities: Sequence[int]) -> None:
    """A capacity axis: logarithmic where the capacities span a range, ticked at each one replayed."""
    ticks = sorted(set(capacities))
    if len(ticks) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{c:,}" for c in ticks], rotation=30 if len(ticks) > 4 else 0, fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("cache capacity (blocks)")


def finish_figure(plt: Any, fig: Any, ax: Any, title: str, path: Path) -> None:
    """Title, grid, legend, tight layout; save ``fig`` to ``path`` at 150 dpi and close it.

    A legend of more than four entries goes outside the axes, on the right, so that it never hides
    a line; a short one takes the corner where it covers the least.
    """
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    if len(ax.get_legend_handles_labels()[1]) > 4:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        width, height = fig.get_size_inches()
        fig.set_size_inches(width + 2.2, height)
    else:
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
