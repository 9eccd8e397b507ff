"""The array core's reference counting: hand out, check, release and pin references over device arrays (chapter 01).

:class:`ReferenceCounts` keeps each block's references and owner (the blocks' ``ref`` and
``owner``) and the per-holder counts of shared blocks (:class:`HolderCounts`). Bad input is
*detected* with array operations over the whole call (:meth:`~ReferenceCounts.check_release`
answers None); the pool then has the explainers of :mod:`kvref.contract.checks` name the first
offending entry, in the order of checks every implementation shares (ERR-502, ERR-509). On
success each call is a constant number of array operations over its batch, reading the host once
where the call allows it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from kvref.contract.checks import stale_reference
from kvref_arraypool.blocks import NOBODY, SHARED, BlockArrays
from kvref_arraypool.holder_counts import HID_BITS, HID_MASK, HolderCounts
from kvref_arraypool.host_arrays import all_true, any_true, positions
from kvref_arraypool.ops import Array
from kvref_arraypool.orders import CacheOrders

__all__ = ["ReferenceCounts"]

#: What a checked release knows: the ids on the device, whether they are distinct, whether each is
#: held by its entry's holder alone, and (for such a release) per position whether it reaches zero
#: and whether it is hashed, as read with the verdict.
CheckedRelease = tuple[Array, bool, bool, tuple[np.ndarray, np.ndarray] | None]


class ReferenceCounts:
    """References per block and per (block, holder) pair; the holder ids are the pool's (STATE-002)."""

    def __init__(self, blocks: BlockArrays, orders: CacheOrders) -> None:
        self.ops = blocks.ops
        self.blocks = blocks
        self.orders = orders
        self.shared = HolderCounts(blocks.ops, blocks.n)

    def holders_of(self, b: int, holder_of: Sequence[Hashable]) -> dict[Hashable, int]:
        """``{holder: references}`` on block ``b`` (STATE-002); ``holder_of`` names the holder ids."""
        owner = int(self.blocks.owner[b])
        if owner == NOBODY:
            return {}
        if owner >= 0:
            return {holder_of[owner]: int(self.blocks.ref[b])}
        return {holder_of[h]: c for h, c in self.shared.holders_of(b)}

    # ------------------------------------------------------------------ hand out

    def hand_out(self, ids: Array, hids: Array | int, sizes: Sequence[int] | None = None) -> None:
        """One reference each on fresh ``ids`` for ``hids`` (one id, or one per position), an access
        of each (EVICT-411; ``sizes`` splits a batched call into its calls); a new generation each."""
        blocks = self.blocks
        self.ops.fill_at(blocks.ref, ids, 1)
        blocks.gen[ids] += 1
        self.ops.put(blocks.owner, ids, hids)
        self.orders.stamp_access(ids, sizes)

    # ------------------------------------------------------------------ release

    def check_generations(self, host: np.ndarray, gens: np.ndarray, op: str) -> None:
        """POOL-112: every in-range, unreserved block's generation matches the caller's."""
        blocks = self.blocks
        ok = (host >= 0) & (host < blocks.n)
        safe = np.where(ok, host, 0)
        ok &= ~blocks.host_reserved[safe]
        current = self.ops.to_host(blocks.gen[self.ops.asarray(safe)])
        stale = np.flatnonzero(ok & (current != gens))
        if len(stale):
            i = int(stale[0])
            raise stale_reference(op, int(host[i]), int(gens[i]), int(current[i]))

    def check_release(self, host: np.ndarray, hids: Array | int, *, known: bool) -> CheckedRelease | None:
        """POOL-108/109 over a whole batch: what the release needs when all is well, else None.

        ``hids``: the holder id of every position (or one for all); ``known``: every holder of a
        non-empty entry holds something. The common release (distinct blocks, each held by its
        entry's holder alone) is decided in one host read, with the flags :meth:`release` needs.
        """
        ops, blocks = self.ops, self.blocks
        if not known or not blocks.in_range(host):
            return None
        ids = ops.asarray(host)
        owner = blocks.owner[ids]
        m = len(ids)
        if m <= blocks.n:  # distinct and solely held, in one host read (the common release)
            other = owner != hids
            bad, twice = other, None
            if m > 1:
                twice = blocks.repeats(ids)
                bad = other | twice
            # With the verdict, which blocks the release leaves at zero and which are hashed: one read.
            flags = ops.to_host(ops.concat([bad, blocks.ref[ids] == 1, blocks.hash[ids] >= 0]))
            if not any_true(flags[:m]):
                return ids, True, True, (flags[m : 2 * m], flags[2 * m :])
            # Distinct, and each held by its entry's holder alone or shared: one more read.
            joined = owner == SHARED
            if not ops.any(other & ~joined if twice is None else (other & ~joined) | twice):
                at = ops.nonzero(joined)
                have = self.shared.get(ids[at], hids if isinstance(hids, int) else hids[at])
                if not ops.any(have < 1):
                    return ids, True, False, None
        distinct = blocks.distinct(ids)
        if not ops.any((owner != hids) & (owner != SHARED)) and self._counts_cover(ids, hids):
            return ids, distinct, False, None
        return None

    def _pair_counts(self, ids: Array, hids: Array | int) -> tuple[Array, Array, Array]:
        """Distinct (block, holder) pairs as keys, blocks and occurrence counts."""
        keys = (ids << HID_BITS) | hids
        uk, cnt = self.ops.unique(keys)
        return uk, uk >> HID_BITS, cnt

    def _counts_cover(self, ids: Array, hids: Array | int) -> bool:
        """Each (block, holder) occurs no more often than the holder's references to the block."""
        if isinstance(hids, int) and self.blocks.distinct(ids):
            return not self.ops.any(self._have((ids << HID_BITS) | hids, ids) < 1)
        uk, ub, cnt = self._pair_counts(ids, hids)
        return not self.ops.any(self._have(uk, ub) < cnt)

    def _have(self, uk: Array, ub: Array) -> Array:
        """References each distinct (block, holder) pair holds."""
        blocks = self.blocks
        owner = blocks.owner[ub]
        sole = owner == (uk & HID_MASK)
        have = self.ops.where(sole, blocks.ref[ub], 0)
        shared = self.ops.nonzero(owner == SHARED)
        if len(shared):
            have[shared] = self.shared.get(ub[shared], uk[shared] & HID_MASK)
        return have

    def release(self, checked: CheckedRelease, hids: Array | int) -> tuple[Array, np.ndarray | None]:
        """Drop one reference per position of a checked release; return the blocks reaching zero in
        release order (each block's last position) and, where read, whether each is hashed."""
        ids, distinct, sole, flags = checked
        ops, blocks = self.ops, self.blocks
        m = len(ids)
        if distinct:  # one reference each, from the shared counts too where the block is shared
            if not sole:
                joined = ops.nonzero(blocks.owner[ids] == SHARED)
                if len(joined):
                    self.shared.sub(ids[joined], hids if isinstance(hids, int) else hids[joined], 1)
            left = blocks.ref[ids] - 1
            blocks.ref[ids] = left
            zeroed, hashed = self._reaching_zero(ids, left, flags)
            ops.fill_at(blocks.owner, zeroed, NOBODY)
            return zeroed, hashed
        uk, ub, cnt = self._pair_counts(ids, hids)
        shared = blocks.owner[ub] == SHARED
        if ops.any(shared):
            self.shared.sub(ub[shared], uk[shared] & HID_MASK, cnt[shared])
        ops.scatter_add(blocks.ref, ub, -cnt)
        unique_blocks = ops.unique(ub)[0]
        zb = unique_blocks[blocks.ref[unique_blocks] == 0]
        ops.fill_at(blocks.owner, zb, NOBODY)
        # Zero order: the position of each block's last occurrence.
        ops.fill_at(blocks.mark, zb, -1)
        ops.scatter_max(blocks.mark, ids, ops.arange(m))
        return zb[ops.argsort(blocks.mark[zb])], None

    def _reaching_zero(
        self, ids: Array, left: Array, flags: tuple[np.ndarray, np.ndarray] | None
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
            read = ops.to_host(ops.concat([left == 0, self.blocks.hash[ids] >= 0]))
            zero, hashed = read[:m], read[m:]
        if all_true(zero):
            return ids, hashed
        at = positions(zero)
        return (ids[ops.asarray(at)] if len(at) else ops.zeros(0)), hashed[at]

    # ------------------------------------------------------------------ pin

    def pin(
        self, ids: Array, hids: Array | int, sizes: Sequence[int] | None = None, *, refuse: Array | None = None
    ) -> bool:
        """Add one reference per position (every block in use or cached), an access of each
        (EVICT-411; ``sizes`` splits a batched call into its calls); True.

        ``refuse``: a flag per position; if any is set nothing changes and the answer is False
        (read with the pin's own flags: one host read for the check and the pin). A block gaining
        a second holder becomes shared: its per-holder counts move to ``shared``.
        """
        ops, blocks = self.ops, self.blocks
        m = len(ids)
        if m == 0:
            return True
        if m > blocks.n:  # too many for the marks of one read: some block comes twice
            if refuse is not None and ops.any(refuse):
                return False
            self.orders.stamp_access(ids, sizes)
        else:  # distinct? which are cached, held by another holder alone, shared; refused? One host read.
            owner = blocks.owner[ids]
            parts = [owner == NOBODY, (owner >= 0) & (owner != hids), owner == SHARED]
            if refuse is not None:
                parts.append(refuse)
            if m > 1:
                parts.append(blocks.repeats(ids))
            flags = ops.to_host(ops.concat(parts))
            if refuse is not None and any_true(flags[3 * m : 4 * m]):
                return False
            self.orders.stamp_access(ids, sizes)
            if not any_true(flags[(3 if refuse is None else 4) * m :]):
                self.pin_distinct(ids, hids, flags[:m], flags[m : 2 * m], flags[2 * m : 3 * m])
                return True
        if isinstance(hids, int):
            hids = ops.full(len(ids), hids)
        uk, ub, cnt = self._pair_counts(ids, hids)  # sorted by block, then holder
        uh = uk & HID_MASK
        k = len(ub)
        change = ub[1:] != ub[:-1]
        first, last = ops.concat([ops.full(1, 1) > 0, change]), ops.concat([change, ops.full(1, 1) > 0])
        current = blocks.owner[ub]
        # Per pair, in one host read: it stays its block's sole holder; its block (first pair) leaves a
        # sole holder for the shared counts; its block (first pair) is cached.
        alone = first & last & ((current == NOBODY) | (current == uh))
        flags = ops.to_host(ops.concat([alone, first & (current >= 0), first & (blocks.ref[ub] == 0)]))
        sole = flags[:k]
        convert = blocks.part(ub, flags[k : 2 * k] & ~sole)
        self.orders.uncache(blocks.part(ub, flags[2 * k :]))
        if len(convert):  # a sole holder's count moves to the shared counts
            self.shared.add(convert, blocks.owner[convert], blocks.ref[convert], distinct=True)
        if not all_true(sole):
            at = ops.asarray(positions(~sole))
            ops.fill_at(blocks.owner, ub[at], SHARED)
            self.shared.add(ub[at], uh[at], cnt[at])
        if any_true(sole):
            at = ops.asarray(positions(sole))
            ops.put(blocks.owner, ub[at], uh[at])
        ops.scatter_add(blocks.ref, ub, cnt)
        return True

    def pin_distinct(
        self, ids: Array, hids: Array | int, unheld: np.ndarray, other: np.ndarray, joined: np.ndarray
    ) -> None:
        """:meth:`pin` of pairwise distinct blocks, given (host flags, per position) which are cached,
        which another holder holds alone (they become shared) and which are shared already."""
        ops, blocks = self.ops, self.blocks
        self.orders.uncache(blocks.part(ids, unheld))
        to_shared = other | joined
        if any_true(to_shared):
            every = blocks.positions[: len(ids)]
            if any_true(other):  # the sole holder's count and the new one go to the shared counts, no read
                at = blocks.part(every, other)
                convert = ids[at]
                self.shared.share(
                    convert, blocks.owner[convert], blocks.ref[convert], hids if isinstance(hids, int) else hids[at], 1
                )
                ops.fill_at(blocks.owner, convert, SHARED)
            if any_true(joined):
                at = blocks.part(every, joined)
                self.shared.add(ids[at], hids if isinstance(hids, int) else hids[at], 1, distinct=True)
            if not all_true(to_shared):
                at = blocks.part(every, ~to_shared)
                ops.put(blocks.owner, ids[at], hids if isinstance(hids, int) else hids[at])
        else:
            ops.put(blocks.owner, ids, hids)
        blocks.ref[ids] += 1

    def clear(self) -> None:
        """No shared block (the blocks' references are cleared with the blocks)."""
        self.shared.clear()
