"""Paused holders and their soft limit (POOL-113, POOL-114, POOL-120, POOL-121), as a mixin.

A class mixing this in keeps ``_paused`` (a set of holders) and ``_paused_limit`` and says how
many references a holder holds (``_references_of``); the mixin supplies the rest of the
:class:`~kvref.contract.protocol.SupportsPause` protocol.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from kvref.contract.errors import PausedHolderError
from kvref.contract.validate import as_holder

__all__ = ["PausedHolders", "budget_line", "pool_budget_line"]


def budget_line(total_used: int, total: int, active_used: int, paused_used: int, paused: int) -> str:
    """The one line every implementation prints of its budgets (REQ-746), as Megatron-Core's
    ``KVBlockAllocator`` prints itself: ``using: total U/T; active A/(T - P); paused Q/P``, with ``U``
    the usable blocks not free (in use or cached) of ``T``, ``A`` and ``Q`` the distinct blocks
    that active and paused holders hold, ``P`` the paused budget."""
    return f"using: total {total_used}/{total}; active {active_used}/{total - paused}; paused {paused_used}/{paused}"


def pool_budget_line(pool: Any) -> str:
    """:func:`budget_line` of a chapter 01 pool with paused holders (REQ-746), read through its protocol:
    ``num_usable``, ``num_free``, ``holders(block)``, ``is_paused(holder)`` and ``paused_limit``."""
    active: set[int] = set()
    paused: set[int] = set()
    for block in range(pool.num_blocks):
        for holder in pool.holders(block):
            (paused if pool.is_paused(holder) else active).add(block)
    usable = pool.num_usable
    return budget_line(usable - pool.num_free, usable, len(active), len(paused), pool.paused_limit)


class PausedHolders:
    """``pause``/``resume`` and the soft-limit counts over ``_references_of``."""

    _paused: set[Hashable]
    _paused_limit: int

    def _references_of(self, holder: Hashable) -> int:
        raise NotImplementedError

    @property
    def paused_limit(self) -> int:
        """The soft limit on references held by paused holders (POOL-113)."""
        return self._paused_limit

    @property
    def paused_used(self) -> int:
        """References held by paused holders (POOL-113)."""
        return sum(self._references_of(h) for h in self._paused)

    @property
    def paused_excess(self) -> int:
        """How far paused holders are over the soft limit; never makes a call fail (POOL-113, POOL-120)."""
        return max(0, self.paused_used - self._paused_limit)

    def pause(self, holder: Hashable) -> None:
        """Mark ``holder`` paused: it keeps its references but may take no new ones (POOL-114)."""
        holder = as_holder(holder, op="pause")
        if holder in self._paused:
            raise PausedHolderError("POOL-121", f"pause: holder {holder!r} is already paused")
        self._paused.add(holder)

    def resume(self, holder: Hashable) -> None:
        """Mark a paused ``holder`` active again (POOL-121)."""
        holder = as_holder(holder, op="resume")
        if holder not in self._paused:
            raise PausedHolderError("POOL-121", f"resume: holder {holder!r} is not paused")
        self._paused.discard(holder)

    def is_paused(self, holder: Hashable) -> bool:
        """Whether ``holder`` is paused."""
        return as_holder(holder, op="is_paused") in self._paused

    def _refuse_if_paused(self, holder: Hashable, count: int, op: str) -> None:
        """POOL-114: a paused holder may not obtain ``count`` > 0 new references."""
        if count and holder in self._paused:
            raise PausedHolderError("POOL-114", f"{op}: holder {holder!r} is paused")
