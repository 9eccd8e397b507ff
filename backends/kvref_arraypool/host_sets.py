"""Distinct values of host int64 arrays by sorting: what ``np.unique`` answers, several times faster.

NumPy 2.4's ``np.unique`` finds distinct values through a hash table before it sorts them: on
4,096 int64 values it takes some 320 us, where a sort and a comparison of neighbours take 36 us.
With the counts it sorts, but pays some 10-20 us of Python around a 1 us sort of 256 values.
Each function returns what the ``np.unique`` call named in its docstring returns, exactly.
"""

from __future__ import annotations

import numpy as np

__all__ = ["count_distinct", "sorted_counts", "sorted_distinct"]


def _starts(ordered: np.ndarray) -> np.ndarray:
    """Where each run of equal values starts in a sorted array (bool per position)."""
    flag = np.empty(len(ordered), dtype=bool)
    flag[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=flag[1:])
    return flag


def sorted_distinct(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)``: the distinct values, ascending."""
    ordered = np.sort(a)
    distinct: np.ndarray = ordered[_starts(ordered)]
    return distinct


def count_distinct(a: np.ndarray) -> int:
    """``len(np.unique(a))``."""
    return int(np.count_nonzero(_starts(np.sort(a))))


def sorted_counts(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_counts=True)``: the distinct values, ascending, and how often each occurs (int64)."""
    ordered = np.sort(a)
    at = _starts(ordered).nonzero()[0]
    counts = np.empty(len(at), dtype=np.int64)
    np.subtract(at[1:], at[:-1], out=counts[:-1])
    counts[-1:] = len(a) - at[-1:]
    distinct: np.ndarray = ordered[at]
    return distinct, counts
