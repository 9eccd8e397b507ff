"""The host path's questions about flags and distinct values (``kvref_arraypool.host_arrays``) answer
exactly as NumPy's own calls (``np.flatnonzero``, ``any``, ``all``, ``np.unique``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kvref_arraypool.host_arrays import (
    all_true,
    any_true,
    count_distinct,
    count_true,
    positions,
    sorted_counts,
    sorted_distinct,
)

rule = pytest.mark.rule


@rule("STATE-002")
@given(st.lists(st.booleans(), max_size=70), st.integers(1, 3))
def test_flag_questions_answer_as_numpy_does(flags: list[bool], stride: int) -> None:
    a = np.array(flags, dtype=bool)[::stride]  # views too: the core asks about slices of host reads
    seen = (positions(a).tolist(), any_true(a), all_true(a), count_true(a))
    want = (np.flatnonzero(a).tolist(), bool(a.any()), bool(a.all()), int(a.sum()))
    assert seen == want, f"for flags {a.tolist()}: (positions, any, all, count) = {seen}, NumPy says {want}"
    assert positions(a).dtype == np.int64, f"positions gave {positions(a).dtype}; the core indexes with int64"


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
