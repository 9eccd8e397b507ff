"""The host path's questions about flags (``kvref_arraypool.host_flags``) answer exactly as NumPy's own calls."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kvref_arraypool.host_flags import all_true, any_true, count_true, positions

rule = pytest.mark.rule


@rule("STATE-002")
@given(st.lists(st.booleans(), max_size=70), st.integers(1, 3))
def test_flag_questions_answer_as_numpy_does(flags: list[bool], stride: int) -> None:
    a = np.array(flags, dtype=bool)[::stride]  # views too: the core asks about slices of host reads
    seen = (positions(a).tolist(), any_true(a), all_true(a), count_true(a))
    want = (np.flatnonzero(a).tolist(), bool(a.any()), bool(a.all()), int(a.sum()))
    assert seen == want, f"for flags {a.tolist()}: (positions, any, all, count) = {seen}, NumPy says {want}"
    assert positions(a).dtype == np.int64, f"positions gave {positions(a).dtype}; the core indexes with int64"
