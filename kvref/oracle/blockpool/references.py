"""The oracle's reference counting: allocate, free, acquire and their checks (chapter 01).

Each call checks everything first (ERR-501): a plain pass over the arguments finds whether
anything is wrong, and the explainers of :mod:`kvref.contract.checks` name the first thing, in
the order of checks every implementation shares (ERR-509). Then the state changes, a few list
and dict operations per block.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import SupportsIndex

from kvref.contract.checks import explain_acquire, explain_generations, explain_release
from kvref.contract.errors import InvalidValueError, OutOfBlocksError, PausedHolderError
from kvref.contract.policies import EvictionPolicy
from kvref.contract.validate import IntsLike, as_block_id_list, as_count, as_holder
from kvref.oracle.blockpool.state import PoolState

__all__ = ["ReferenceCounting", "take_free"]

_REF_ZERO = EvictionPolicy.REF_ZERO


def take_free(free: list[int], n: int) -> list[int]:
    """Pop the top ``n`` blocks of the free stack ``free``, topmost first: what ``allocate`` hands out."""
    if not n:
        return []
    taken = free[-n:]
    del free[-n:]
    taken.reverse()
    return taken


class ReferenceCounting(PoolState):
    """``allocate``, ``free`` and ``acquire`` over the oracle's state (POOL-104..POOL-112, POOL-119)."""

    def allocate(self, count: SupportsIndex, *, holder: Hashable = None) -> list[int]:
        """Take ``count`` unhashed blocks with one reference each for ``holder``, or none.

        Free blocks are taken first; cached blocks are evicted only for the shortfall
        (EVICT-408) and come back without their hash (PFX-312). Raises OutOfBlocksError when
        ``count > num_available`` (POOL-105), PausedHolderError for a paused holder (POOL-114).
        """
        n = as_count(count, op="allocate")
        holder = as_holder(holder, op="allocate")
        if n and holder in self._paused:
            raise PausedHolderError("POOL-114", f"allocate: holder {holder!r} is paused")
        if n == 0:
            return []
        free = self._free
        victims: list[int] = []
        if n > len(free):
            reclaimable = self._reclaimable()
            if n > len(free) + reclaimable:
                raise OutOfBlocksError(
                    "POOL-105",
                    f"allocate: asked for {n} blocks, {len(free) + reclaimable} available "
                    f"({len(free)} free + {reclaimable} evictable) of {self.num_usable} usable; "
                    "nothing was taken",
                )
            victims = self._evict(n - len(free))
        ids = take_free(free, n - len(victims))
        ids.extend(victims)
        ref, gen, holders = self._ref, self._gen, self._holders
        for b in ids:
            ref[b] = 1
            gen[b] += 1
            holders[b] = {holder: 1}
        self._held[holder] = self._held.get(holder, 0) + n
        self._stamp_access(ids)
        return ids

    def _gen_list(self, generations: object, ids: list[int], op: str) -> list[int]:
        gens = as_block_id_list(generations, op=op, arg="generations")
        if len(gens) != len(ids):
            raise InvalidValueError(
                "ERR-506",
                f"{op}: {len(gens)} generations for {len(ids)} block ids; they must pair up",
            )
        return gens

    def _check_release(self, ids: list[int], holder: Hashable, gens: list[int] | None, op: str) -> None:
        """Every id is a block ``holder`` holds, as often as it occurs (POOL-108, POOL-109, POOL-112)."""
        if gens is not None:
            self._check_generations(ids, gens, op)
        n, holders = self._n, self._holders
        for b in ids:
            held = holders[b] if 0 <= b < n else None
            if held is None or holder not in held:
                explain_release(self, ids, holder, op)
        if len(ids) > 1 and len(set(ids)) != len(ids):
            for b, times in Counter(ids).items():
                if times > holders[b][holder]:  # type: ignore[index]
                    explain_release(self, ids, holder, op)

    def _check_generations(self, ids: list[int], gens: list[int], op: str) -> None:
        n, gen, reserved = self._n, self._gen, self._is_reserved
        for b, g in zip(ids, gens, strict=True):
            if 0 <= b < n and not reserved[b] and gen[b] != g:
                explain_generations(self, ids, gens, op)

    def free(
        self,
        block_ids: IntsLike,
        *,
        holder: Hashable = None,
        generations: IntsLike | None = None,
    ) -> None:
        """Drop one of ``holder``'s references per occurrence in ``block_ids``, in list order.

        A block whose last reference goes becomes free, or cached if hashed (PFX-311), or is
        dropped from the cache under ``ref-zero`` (EVICT-405). Positions earlier in the list count
        as released earlier (EVICT-401). All-or-nothing (POOL-107..POOL-109, POOL-112).
        """
        ids = as_block_id_list(block_ids, op="free")
        holder = as_holder(holder, op="free")
        gens = None if generations is None else self._gen_list(generations, ids, "free")
        self._check_release(ids, holder, gens, "free")
        self._release(ids, holder)

    def _release(self, ids: list[int], holder: Hashable) -> None:
        ref, holders, hashes, free = self._ref, self._holders, self._hash, self._free
        ref_zero = self._policy is _REF_ZERO
        dropped: list[int] = []  # ref-zero: hashed blocks whose last reference goes, in order
        for b in ids:
            held = holders[b]
            left = held[holder] - 1  # type: ignore[index]
            if left:
                held[holder] = left  # type: ignore[index]
            else:
                del held[holder]  # type: ignore[union-attr]
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                holders[b] = None
                if hashes[b] is None:
                    free.append(b)
                    continue
                self._hashed_in_use.discard(b)
                if ref_zero:
                    dropped.append(b)
                    free.append(b)
                else:
                    self._evictable[b] = None
        if dropped:
            self._unregister(dropped)
            self._evictions += len(dropped)
        if ids:
            left_held = self._held[holder] - len(ids)
            if left_held:
                self._held[holder] = left_held
            else:
                del self._held[holder]

    def acquire(
        self,
        block_ids: IntsLike,
        *,
        holder: Hashable = None,
        generations: IntsLike | None = None,
    ) -> None:
        """Add one reference for ``holder`` per occurrence; blocks must be in use or cached.

        A cached block so acquired is pinned: it leaves the evictable set (PFX-310, POOL-110).
        """
        ids = as_block_id_list(block_ids, op="acquire")
        holder = as_holder(holder, op="acquire")
        if holder in self._paused and ids:
            raise PausedHolderError("POOL-114", f"acquire: holder {holder!r} is paused")
        gens = None if generations is None else self._gen_list(generations, ids, "acquire")
        if gens is not None:
            self._check_generations(ids, gens, "acquire")
        n, ref, hashes, reserved = self._n, self._ref, self._hash, self._is_reserved
        for b in ids:
            if b < 0 or b >= n or reserved[b] or (ref[b] == 0 and hashes[b] is None):
                explain_acquire(self, ids, "acquire")
        self._pin(ids, holder)

    def _pin(self, ids: list[int], holder: Hashable) -> None:
        ref, holders, evictable = self._ref, self._holders, self._evictable
        for b in ids:
            r = ref[b]
            if r == 0:
                del evictable[b]
                self._hashed_in_use.add(b)
                holders[b] = {holder: 1}
            else:
                held = holders[b]
                held[holder] = held.get(holder, 0) + 1  # type: ignore[index,union-attr]
            ref[b] = r + 1
        if ids:
            self._held[holder] = self._held.get(holder, 0) + len(ids)
            self._stamp_access(ids)
