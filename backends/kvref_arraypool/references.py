"""The array core's reference counting: allocate, free and their checks over device arrays (chapter 01).

Bad input is *detected* with array operations over the whole call; only then do the explainers
of :mod:`kvref.contract.checks` walk the call on the host to name the first offending entry, in
the order of checks every implementation shares (ERR-502, ERR-509). On success each call is a
constant number of array operations over its batch.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import SupportsIndex

import numpy as np

from kvref.contract.checks import explain_release, stale_reference
from kvref.contract.errors import InvalidValueError, InvariantViolation, OutOfBlocksError
from kvref.contract.policies import EvictionPolicy
from kvref.contract.validate import IntsLike, as_count, as_holder
from kvref_arraypool.host_flags import all_true, any_true, count_true, positions
from kvref_arraypool.inputs import index_array
from kvref_arraypool.ops import Array
from kvref_arraypool.state import HID_BITS, HID_MASK, NOBODY, SHARED, ArrayPoolState

__all__ = ["ReferenceCounting"]

_REF_ZERO = EvictionPolicy.REF_ZERO


class ReferenceCounting(ArrayPoolState):
    """``allocate`` and ``free`` (and their device-array forms) over the array core (POOL-104..POOL-112)."""

    def allocate(self, count: SupportsIndex, *, holder: Hashable = None) -> list[int]:
        """Take ``count`` unhashed blocks with one reference each for ``holder``, or none (POOL-104..106).

        Free blocks are taken first (top of the stack first); cached blocks are evicted only for
        the shortfall (EVICT-408) and come back without their hash (PFX-312).
        """
        return self.ops.tolist(self._allocate(count, holder))

    def allocate_ids(self, count: SupportsIndex, *, holder: Hashable = None) -> Array:
        """``allocate``, returning the ids as a fresh device array (int64) instead of a list.

        The form an engine uses to write block tables without a round trip through Python ints.
        """
        return self.ops.export(self._allocate(count, holder))

    def _allocate(self, count: SupportsIndex, holder: Hashable) -> Array:
        n = as_count(count, op="allocate")
        holder = as_holder(holder, op="allocate")
        self._refuse_if_paused(holder, n, "allocate")
        if n == 0:
            return self.ops.zeros(0)
        ids = self._take(n, "allocate")
        self._hand_out(ids, self._hid(holder))
        self._add_held(holder, n)
        return ids

    def _hand_out(self, ids: Array, hids: Array | int, sizes: Sequence[int] | None = None) -> None:
        self.ops.fill_at(self._ref, ids, 1)
        self._gen[ids] += 1
        self.ops.put(self._owner, ids, hids)
        self._stamp_access(ids, sizes)

    def _take(self, n: int, op: str) -> Array:
        """Pop ``n`` blocks: the free stack top-down, then eviction victims (POOL-105, EVICT-408)."""
        nf = self._nfree
        if n <= nf:
            ids = self.ops.copy(self.ops.flip(self._stack[nf - n : nf]))
            self._nfree = nf - n
            return ids
        short = n - nf
        victims, reclaimable = self._select_victims(short)
        if len(victims) < short:
            raise OutOfBlocksError(
                "POOL-105",
                f"{op}: asked for {n} blocks, {nf + reclaimable} available "
                f"({nf} free + {reclaimable} evictable) of {self.num_usable} usable; nothing was taken",
            )
        ids = self.ops.concat([self.ops.flip(self._stack[:nf]), victims])
        self._nfree = 0
        self._unregister(victims)
        self._evictions += short
        return ids

    def free(
        self,
        block_ids: IntsLike,
        *,
        holder: Hashable = None,
        generations: IntsLike | None = None,
    ) -> None:
        """Drop one of ``holder``'s references per occurrence in ``block_ids``, in list order.

        A block whose last reference goes becomes free, or cached if hashed (PFX-311), or is
        dropped under ``ref-zero`` (EVICT-405); earlier positions count as released earlier
        (EVICT-401). All-or-nothing (POOL-107..POOL-109, POOL-112).
        """
        op = "free"
        host, items = index_array(block_ids, op=op)
        holder = as_holder(holder, op=op)
        gens = None if generations is None else self._gen_array(generations, len(host), op)
        if len(host) == 0:
            return
        hid = self._hids.get(holder, -1)
        ids, distinct, sole, flags = self._check_release(
            host, items, hid, lambda: [(holder, hid, host, items)], gens, op, known=hid >= 0
        )
        self._release(ids, hid, distinct, sole=sole, flags=flags)
        self._drop_held(holder, len(host))

    def _gen_array(self, generations: object, expected: int, op: str) -> np.ndarray:
        gens, _ = index_array(generations, op=op, arg="generations")
        if len(gens) != expected:
            raise InvalidValueError(
                "ERR-506", f"{op}: {len(gens)} generations for {expected} block ids; they must pair up"
            )
        return gens

    def _check_generations(self, host: np.ndarray, gens: np.ndarray, op: str) -> None:
        """POOL-112: every in-range, unreserved block's generation matches the caller's."""
        ok = (host >= 0) & (host < self._n)
        safe = np.where(ok, host, 0)
        ok &= ~self._host_reserved[safe]
        current = self.ops.to_host(self._gen[self.ops.asarray(safe)])
        stale = np.flatnonzero(ok & (current != gens))
        if len(stale):
            i = int(stale[0])
            raise stale_reference(op, int(host[i]), int(gens[i]), int(current[i]))

    def _check_release(
        self,
        host: np.ndarray,
        items: list[int] | None,
        hids: Array | int,
        groups: Callable[[], Sequence[tuple[Hashable, int, np.ndarray, list[int] | None]]],
        gens: np.ndarray | None,
        op: str,
        *,
        known: bool,
    ) -> tuple[Array, bool, bool, tuple[np.ndarray, np.ndarray] | None]:
        """POOL-108/109/112 over a whole batch; returns the ids on the device when all is well.

        Also whether they are pairwise distinct, whether each is held by its entry's holder
        alone (``sole``: the release then needs no look at shared counts), and for such a release
        the host flags of :meth:`_reaching_zero` (read with the verdict), else None. ``known``: every holder
        of a non-empty entry holds something. ``groups()`` lists each holder with its ids in order,
        for naming the first bad entry (asked only when the batch is refused).
        """
        if gens is not None:
            self._check_generations(host, gens, op)
        if known and self._in_range(host):
            ids = self.ops.asarray(host)
            owner = self._owner[ids]
            m = len(ids)
            if m <= self._n:  # distinct and solely held, in one host read (the common release)
                other = owner != hids
                bad, twice = other, None
                if m > 1:
                    pos = self._positions[:m]
                    self._mark[ids] = pos
                    twice = self._mark[ids] != pos
                    bad = other | twice
                # With the verdict, which blocks the release leaves at zero and which are hashed: one read.
                flags = self.ops.to_host(self.ops.concat([bad, self._ref[ids] == 1, self._bhash[ids] >= 0]))
                if not any_true(flags[:m]):
                    return ids, True, True, (flags[m : 2 * m], flags[2 * m :])
                # Distinct, and each held by its entry's holder alone or shared: one more read.
                joined = owner == SHARED
                if not self.ops.any(other & ~joined if twice is None else (other & ~joined) | twice):
                    at = self.ops.nonzero(joined)
                    have = self._shared.get(ids[at], hids if isinstance(hids, int) else hids[at])
                    if not self.ops.any(have < 1):
                        return ids, True, False, None
            distinct = self._distinct(ids)
            if not self.ops.any((owner != hids) & (owner != SHARED)) and self._counts_cover(ids, hids):
                return ids, distinct, False, None
        for holder, _, g_host, g_items in groups():
            explain_release(self, g_items if g_items is not None else g_host.tolist(), holder, op)
        raise InvariantViolation("ERR-508", f"{op}: the batch was refused but no entry is at fault")  # pragma: no cover

    def _pair_counts(self, ids: Array, hids: Array | int) -> tuple[Array, Array, Array]:
        """Distinct (block, holder) pairs as keys, blocks and occurrence counts."""
        keys = (ids << HID_BITS) | hids
        uk, _, cnt = self.ops.unique(keys)
        return uk, uk >> HID_BITS, cnt

    def _counts_cover(self, ids: Array, hids: Array | int) -> bool:
        """Each (block, holder) occurs no more often than the holder's references to the block."""
        if isinstance(hids, int) and self._distinct(ids):
            return not self.ops.any(self._have((ids << HID_BITS) | hids, ids) < 1)
        uk, ub, cnt = self._pair_counts(ids, hids)
        have = self._have(uk, ub)
        return not self.ops.any(have < cnt)

    def _have(self, uk: Array, ub: Array) -> Array:
        """References each distinct (block, holder) pair holds."""
        owner = self._owner[ub]
        sole = owner == (uk & HID_MASK)
        have = self.ops.where(sole, self._ref[ub], 0)
        shared = self.ops.nonzero(owner == SHARED)
        if len(shared):
            have[shared] = self._shared.get(ub[shared], uk[shared] & HID_MASK)
        return have

    def _release(
        self,
        ids: Array,
        hids: Array | int,
        distinct: bool,
        *,
        sole: bool = False,
        flags: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """Drop one reference per position (validated); blocks reaching zero leave in list order.

        ``distinct``: the ids are known to be pairwise distinct; ``sole``: each is held by its
        entry's holder alone (both save a check); ``flags``: which reach zero and which are hashed,
        when the check read them (:meth:`_check_release`).
        """
        ops = self.ops
        m = len(ids)
        if distinct:  # one reference each, from the shared counts too where the block is shared
            if not sole:
                joined = ops.nonzero(self._owner[ids] == SHARED)
                if len(joined):
                    self._shared.sub(ids[joined], hids if isinstance(hids, int) else hids[joined], 1)
            left = self._ref[ids] - 1
            self._ref[ids] = left
            zeroed, hashed = self._reaching_zero(ids, left, flags)
            ops.fill_at(self._owner, zeroed, NOBODY)
            self._settle(zeroed, hashed)
            return
        else:
            uk, ub, cnt = self._pair_counts(ids, hids)
            shared = self._owner[ub] == SHARED
            if ops.any(shared):
                self._shared.sub(ub[shared], uk[shared] & HID_MASK, cnt[shared])
            ops.scatter_add(self._ref, ub, -cnt)
            blocks = ops.unique(ub)[0]
            zb = blocks[self._ref[blocks] == 0]
            ops.fill_at(self._owner, zb, NOBODY)
            # Zero order: the position of each block's last occurrence.
            ops.fill_at(self._mark, zb, -1)
            ops.scatter_max(self._mark, ids, ops.arange(m))
            zeroed = zb[ops.argsort(self._mark[zb])]
        self._settle(zeroed)

    def _reaching_zero(
        self, ids: Array, left: Array, flags: tuple[np.ndarray, np.ndarray] | None = None
    ) -> tuple[Array, np.ndarray]:
        """The distinct ``ids`` whose count ``left`` is zero, in order, and whether each is hashed.

        One host read for both (the common release: one sync here beside the validation's), or
        none where the validation read them (``flags``: per position, reaching zero and hashed).
        """
        ops = self.ops
        if flags is not None:
            zero, hashed = flags
        else:
            m = len(ids)
            read = ops.to_host(ops.concat([left == 0, self._bhash[ids] >= 0]))
            zero, hashed = read[:m], read[m:]
        if all_true(zero):
            return ids, hashed
        at = positions(zero)
        return (ids[ops.asarray(at)] if len(at) else ops.zeros(0)), hashed[at]

    def _settle(self, zeroed: Array, hashed: np.ndarray | None = None) -> None:
        """Blocks whose last reference just went, in release order: free, cached or dropped.

        ``hashed``: whether each is hashed, where the caller read it already (else one read here).
        """
        if len(zeroed) == 0:
            return
        if hashed is None:
            hashed = self.ops.to_host(self._bhash[zeroed] >= 0)
        k = count_true(hashed)
        if k == 0:  # the common release of unhashed blocks: all free, in order
            self._push_free(zeroed)
            return
        if self._policy is _REF_ZERO:
            dropped = self._part(zeroed, hashed)
            if len(dropped):
                self._unregister(dropped)
                self._evictions += len(dropped)
            self._push_free(zeroed)
            return
        if k < len(zeroed):
            self._push_free(self._part(zeroed, ~hashed))
        cached = self._part(zeroed, hashed)
        if k:
            stamps = self._stamps(k)
            self._evstamp[cached] = stamps
            self._lru_order.push(cached, stamps)
            self._ncached += k
