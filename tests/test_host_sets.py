"""The host path's distinct values (``kvref_arraypool.host_sets``) answer exactly as ``np.unique``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kvref_arraypool.host_sets import count_distinct, sorted_counts, sorted_distinct

rule = pytest.mark.rule

values_st = st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 3), max_size=50)


@rule("STATE-005", "PFX-303")
@given(values_st)
def test_distinct_values_by_sorting_are_those_of_np_unique(values: list[int]) -> None:
    a = np.array(values, dtype=np.int64)
    want = np.unique(a)
    got = sorted_distinct(a)
    assert np.array_equal(got, want), f"sorted_distinct({values}) = {got.tolist()}, np.unique gives {want.tolist()}"
    assert count_distinct(a) == len(want), f"count_distinct({values}) = {count_distinct(a)}, np.unique has {len(want)}"


@rule("STATE-007")
@given(values_st)
def test_distinct_values_with_their_counts_are_those_of_np_unique(values: list[int]) -> None:
    a = np.array(values, dtype=np.int64)
    want, want_counts = np.unique(a, return_counts=True)
    got, counts = sorted_counts(a[::-1])  # a view, as a slice of a host read is
    assert np.array_equal(got, want) and np.array_equal(counts, want_counts), (
        f"sorted_counts({values[::-1]}) = {got.tolist()}, {counts.tolist()}; "
        f"np.unique gives {want.tolist()}, {want_counts.tolist()}"
    )
    assert counts.dtype == np.int64, f"sorted_counts' counts are {counts.dtype}, the core adds them to int64 arrays"
