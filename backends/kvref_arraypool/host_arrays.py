"""Questions about 1-d host arrays (what a host read returns), answered in NumPy's cheapest spelling.

Each function answers exactly what the NumPy call named in its docstring answers. On arrays of a
few hundred flags NumPy's reductions pay more for their dispatch than for the work:
``flags.any()`` and ``flags.all()`` take ~0.8 us where ``np.count_nonzero`` takes ~0.2 us, and
``np.flatnonzero`` ~0.8 us where ``flags.nonzero()[0]`` takes ~0.1 us; and ``np.unique`` finds
distinct values through a hash table before it sorts them: on 4,096 int64 values some 320 us,
where a sort and a comparison of neighbours take 36 us (NumPy 2.4, one core). The core asks these
questions a dozen times or more per pool operation.
"""

from __future__ import annotations

import numpy as np

__all__ = ["all_true", "any_true", "count_distinct", "count_true", "positions", "sorted_counts", "sorted_distinct"]


def positions(flags: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(flags)`` of a 1-d array: where it is True (or non-zero), ascending, int64."""
    at: np.ndarray = flags.nonzero()[0]
    return at


def any_true(flags: np.ndarray) -> bool:
    """``bool(flags.any())``."""
    return bool(np.count_nonzero(flags))


def all_true(flags: np.ndarray) -> bool:
    """``bool(flags.all())`` of a 1-d array (True when empty)."""
    return int(np.count_nonzero(flags)) == len(flags)


def count_true(flags: np.ndarray) -> int:
    """``int(flags.sum())`` of a 1-d bool array."""
    return int(np.count_nonzero(flags))


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
