"""Host memory seen through NumPy: what the host kernels share (``host_slot_kernels``, ``host_block_kernels``).

On the CPU an array library's cost is its per-call overhead, not the work: torch dispatches each
operation in 3-8 us, so an array path of forty operations costs some 200 us whatever its size.
The host kernels do the fused calls of the GPU kernels with a few NumPy calls (or element by
element, for a few entries) on **views** of the caller's own arrays: ``tensor.numpy()`` shares a
CPU tensor's memory, and a NumPy array is its own view. The state stays in the library's arrays;
results are fresh arrays of that library.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvref_arraypool.deferred import CALLS, CODE, REFUSED, VALUE
from kvref_arraypool.host_flags import positions
from kvref_arraypool.ops import Array

__all__ = ["SCALAR_LIMIT", "HostViews", "first_refusal"]

#: Up to this many entries a call reads and writes elements one by one (each ~0.1 us) instead of
#: making whole-array calls (each ~1 us, whatever the size): the default of ``scalar_limit``.
SCALAR_LIMIT = 16


def first_refusal(codes: np.ndarray, given: np.ndarray) -> tuple[int, int, int] | None:
    """The first entry with a nonzero code, as (position, code, value), or None: one NumPy scan."""
    bad = positions(codes)
    if not bad.size:
        return None
    at = int(bad[0])
    return at, int(codes[at]), int(given[at])


class HostViews:
    """NumPy views of one library's host arrays, each made once and kept, and the way back.

    ``view`` gives an array's memory as a NumPy array without copying it; ``wrap`` makes a NumPy
    array one of the library's without copying it. Calls of up to ``scalar_limit`` entries go
    element by element, larger ones by whole-array NumPy calls.
    """

    def __init__(
        self, view: Callable[[Array], np.ndarray], wrap: Callable[[np.ndarray], Array], scalar_limit: int = SCALAR_LIMIT
    ) -> None:
        self._view, self._wrap, self._scalar = view, wrap, scalar_limit
        self._views: dict[int, tuple[Array, np.ndarray]] = {}
        #: Fused calls made so far (the launch budget counts them as kernels).
        self.launches = 0

    def _host(self, array: Array) -> np.ndarray:
        """The kept view of one of the owner's arrays, which it writes in place and never rebinds
        (the array is held, so its id stays its own)."""
        kept = self._views.get(id(array))
        if kept is None or kept[0] is not array:
            kept = (array, self._view(array))
            self._views[id(array)] = kept
        return kept[1]

    def _ints(self, array: Array) -> np.ndarray:
        """A caller's integer array as int64 NumPy (a view where it is int64 already)."""
        return np.asarray(self._view(array), dtype=np.int64)

    @staticmethod
    def _note(record: np.ndarray, refusal: tuple[int, int, int] | None) -> bool:
        """Count a checked call in the record (:mod:`kvref_arraypool.deferred`) and, when ``refusal``
        (position, code, value) names an offending entry, record it if it is the first refused call
        since the last report (ERR-511, ERR-512); whether the call was accepted."""
        calls = int(record[CALLS])
        record[CALLS] = calls + 1
        if refusal is None:
            return True
        at, code, value = refusal
        if record[CODE] == 0:
            record[CODE : VALUE + 1] = (code, calls, at, value)
        record[REFUSED] += 1
        return False
