"""The plots' shared pieces: series that would hide one another say so, and a hit rate of 0% is seen."""

from __future__ import annotations

import pytest

from kvref.reports.plotting import SeriesLabels, hit_rate_axis, pyplot

rule = pytest.mark.rule


@rule("TRACE-1053")
def test_a_series_on_top_of_an_earlier_one_names_it_exactly_or_within_how_many_points() -> None:
    labels = SeriesLabels()
    lru = [(100, 0.40), (200, 0.55)]
    assert labels.label("lru", lru) == "lru"
    assert labels.label("lru-leaf", lru) == "lru-leaf (= lru)"
    assert labels.label("radix-lru", [(100, 0.4008), (200, 0.5501)]) == "radix-lru (~ lru, within 0.1 pp)"
    assert labels.label("fifo", [(100, 0.30), (200, 0.50)]) == "fifo", "five points apart: both lines show"
    assert labels.label("ref-zero", [(100, 0.40)]) == "ref-zero", "other capacities: not the same series"


@rule("TRACE-1053")
def test_a_hit_rate_axis_starts_at_zero_with_room_for_a_series_at_zero() -> None:
    plt = pytest.importorskip("matplotlib.pyplot") and pyplot("the test plot")
    fig, ax = plt.subplots()
    ax.plot([1, 2], [0.0, 0.0])
    ax.plot([1, 2], [35.0, 62.0])
    hit_rate_axis(ax)
    low, high = ax.get_ylim()
    assert low < 0 <= min(ax.get_yticks()) and high >= 62.0, (low, high, list(ax.get_yticks()))
    plt.close(fig)
