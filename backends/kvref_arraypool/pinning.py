"""The array core's acquire: pinning blocks in use or cached for another holder (POOL-110, POOL-119, PFX-310).

A block gaining a second holder becomes shared: its per-holder counts move to the ``shared``
table. Bad input is detected with array operations and explained by
:func:`kvref.contract.checks.explain_acquire`, in the shared order of checks (ERR-509).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from kvref.contract.checks import explain_acquire
from kvref.contract.validate import IntsLike, as_holder
from kvref_arraypool.host_flags import all_true, any_true, positions
from kvref_arraypool.inputs import index_array
from kvref_arraypool.ops import Array
from kvref_arraypool.references import ReferenceCounting
from kvref_arraypool.state import HID_MASK, NOBODY, SHARED

__all__ = ["Pinning"]


class Pinning(ReferenceCounting):
    """``acquire``, and the pinning that ``acquire`` and ``match`` share; on reference counting's checks."""

    def acquire(
        self,
        block_ids: IntsLike,
        *,
        holder: Hashable = None,
        generations: IntsLike | None = None,
    ) -> None:
        """Add one reference for ``holder`` per occurrence; blocks must be in use or cached (POOL-110).

        A cached block so acquired is pinned: it leaves the eviction order (PFX-310).
        """
        op = "acquire"
        host, items = index_array(block_ids, op=op)
        holder = as_holder(holder, op=op)
        self._refuse_if_paused(holder, len(host), op)
        gens = None if generations is None else self._gen_array(generations, len(host), op)
        if gens is not None:
            self._check_generations(host, gens, op)
        if len(host) == 0:
            return
        if self._in_range(host):
            ids = self.ops.asarray(host)
            bad = self._is_reserved[ids] | ((self._ref[ids] == 0) & (self._bhash[ids] < 0))
            if self._pin(ids, self._hid_to_be(holder), refuse=bad):  # checked in the pin's own host read
                self._hid(holder)
                self._add_held(holder, len(host))
                return
        explain_acquire(self, items if items is not None else host.tolist(), op)

    def _pin(
        self, ids: Array, hids: Array | int, sizes: Sequence[int] | None = None, *, refuse: Array | None = None
    ) -> bool:
        """Add one reference per position (every block in use or cached), an access of each
        (EVICT-411; ``sizes`` splits a batched call into its calls); True.

        ``refuse``: a flag per position; if any is set nothing changes and the answer is False
        (read with the pin's own flags: one host read for the check and the pin). A block gaining
        a second holder becomes shared: its per-holder counts move to ``shared``.
        """
        ops = self.ops
        m = len(ids)
        if m == 0:
            return True
        if m > self._n:  # too many for the marks of one read: some block comes twice
            if refuse is not None and ops.any(refuse):
                return False
            self._stamp_access(ids, sizes)
        else:  # distinct? which are cached, held by another holder alone, shared; refused? One host read.
            owner = self._owner[ids]
            parts = [owner == NOBODY, (owner >= 0) & (owner != hids), owner == SHARED]
            if refuse is not None:
                parts.append(refuse)
            if m > 1:
                pos = self._positions[:m]
                self._mark[ids] = pos
                parts.append(self._mark[ids] != pos)
            flags = ops.to_host(ops.concat(parts))
            if refuse is not None and any_true(flags[3 * m : 4 * m]):
                return False
            self._stamp_access(ids, sizes)
            if not any_true(flags[(3 if refuse is None else 4) * m :]):
                self._pin_distinct(ids, hids, flags[:m], flags[m : 2 * m], flags[2 * m : 3 * m])
                return True
        if isinstance(hids, int):
            hids = ops.full(len(ids), hids)
        uk, ub, cnt = self._pair_counts(ids, hids)  # sorted by block, then holder
        uh = uk & HID_MASK
        k = len(ub)
        change = ub[1:] != ub[:-1]
        first, last = ops.concat([ops.full(1, 1) > 0, change]), ops.concat([change, ops.full(1, 1) > 0])
        current = self._owner[ub]
        # Per pair, in one host read: it stays its block's sole holder; its block (first pair) leaves a
        # sole holder for the shared counts; its block (first pair) is cached.
        alone = first & last & ((current == NOBODY) | (current == uh))
        flags = ops.to_host(ops.concat([alone, first & (current >= 0), first & (self._ref[ub] == 0)]))
        sole = flags[:k]
        convert = self._part(ub, flags[k : 2 * k] & ~sole)
        cached = self._part(ub, flags[2 * k :])
        if len(cached):
            ops.fill_at(self._evstamp, cached, -1)
            self._ncached -= len(cached)
        if len(convert):  # a sole holder's count moves to the shared counts
            self._shared.add(convert, self._owner[convert], self._ref[convert], distinct=True)
        if not all_true(sole):
            at = ops.asarray(positions(~sole))
            ops.fill_at(self._owner, ub[at], SHARED)
            self._shared.add(ub[at], uh[at], cnt[at])
        if any_true(sole):
            at = ops.asarray(positions(sole))
            ops.put(self._owner, ub[at], uh[at])
        ops.scatter_add(self._ref, ub, cnt)
        return True

    def _pin_distinct(
        self, ids: Array, hids: Array | int, unheld: np.ndarray, other: np.ndarray, joined: np.ndarray
    ) -> None:
        """:meth:`_pin` of pairwise distinct blocks, given (host flags, per position) which are cached,
        which another holder holds alone (they become shared) and which are shared already."""
        ops = self.ops
        cached = self._part(ids, unheld)
        if len(cached):
            ops.fill_at(self._evstamp, cached, -1)
            self._ncached -= len(cached)
        to_shared = other | joined
        if any_true(to_shared):
            every = self._positions[: len(ids)]
            if any_true(other):  # the sole holder's count and the new one go to the shared counts, no read
                at = self._part(every, other)
                convert = ids[at]
                self._shared.share(
                    convert, self._owner[convert], self._ref[convert], hids if isinstance(hids, int) else hids[at], 1
                )
                ops.fill_at(self._owner, convert, SHARED)
            if any_true(joined):
                at = self._part(every, joined)
                self._shared.add(ids[at], hids if isinstance(hids, int) else hids[at], 1, distinct=True)
            if not all_true(to_shared):
                at = self._part(every, ~to_shared)
                ops.put(self._owner, ids[at], hids if isinstance(hids, int) else hids[at])
        else:
            ops.put(self._owner, ids, hids)
        self._ref[ids] += 1
