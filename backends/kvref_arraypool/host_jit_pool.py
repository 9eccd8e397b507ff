"""A pool's common release as one numba kernel (imported by :mod:`kvref_arraypool.host_jit` only where numba is).

:func:`release_sole` is ``free`` of pairwise distinct blocks each held by its entry's holder alone,
checked and applied in one pass over the pool's own arrays: what ``_check_release``'s first host
read, ``_release`` and ``_settle`` do on the array path for that case, in the same order.
"""

from __future__ import annotations

from typing import Any

from numba import njit

__all__ = ["release_sole"]

_NOBODY = -1  # kvref_arraypool.state.NOBODY


@njit(cache=True)
def release_sole(ids: Any, hids: Any, n: Any, owner: Any, ref: Any, mark: Any, bhash: Any, evstamp: Any,
                 stack: Any, nfree: Any, qblocks: Any, qstamps: Any, qtail: Any, clock: Any) -> Any:  # fmt: skip
    """Drop one reference of ``hids[i]`` to ``ids[i]`` for every ``i``, in order, if every id is in
    ``[0, n)``, held by ``hids[i]`` alone, and none comes twice; else change nothing (but ``mark``,
    the pool's scratch). A block reaching zero is nobody's: pushed on the free stack, or, hashed,
    stamped ``clock``, ``clock + 1``, ... and appended to the eviction order (room made by the
    caller). Returns (accepted, free count, order tail, blocks cached)."""
    m = ids.shape[0]
    for i in range(m):
        b = ids[i]
        if b < 0 or b >= n or owner[b] != hids[i]:
            return False, nfree, qtail, 0
        mark[b] = i
    for i in range(m):
        if mark[ids[i]] != i:  # a block that comes twice
            return False, nfree, qtail, 0
    cached = 0
    for i in range(m):
        b = ids[i]
        left = ref[b] - 1
        ref[b] = left
        if left:
            continue
        owner[b] = _NOBODY
        if bhash[b] >= 0:
            evstamp[b] = clock + cached
            qblocks[qtail] = b
            qstamps[qtail] = clock + cached
            qtail += 1
            cached += 1
        else:
            stack[nfree] = b
            nfree += 1
    return True, nfree, qtail, cached
