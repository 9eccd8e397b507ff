"""Paused holders and their soft limit (POOL-113, POOL-114, POOL-120, POOL-121), an object a pool holds.

:class:`PausedHolders` keeps which holders are paused and the soft limit on the references they
hold; it asks the pool how many references a holder holds through the function it was given. A
pool holds one and answers the :class:`~kvref.contract.protocol.SupportsPause` protocol through it
(:class:`PauseCalls`: the protocol's six members, each the call of ``self.paused`` it names).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from kvref.contract.errors import PausedHolderError
from kvref.contract.validate import as_holder

__all__ = ["PauseCalls", "PausedHolders", "budget_line", "pool_budget_line"]


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
    """Which holders are paused, and the soft limit on the references they hold (POOL-113, POOL-114).

    ``PausedHolders(limit, references_of)``: ``limit`` the soft limit, already checked by the pool;
    ``references_of(holder)`` how many references ``holder`` holds now.
    """

    def __init__(self, limit: int, references_of: Callable[[Hashable], int]) -> None:
        #: The soft limit on references held by paused holders (POOL-113).
        self.limit = limit
        #: The paused holders.
        self.holders: set[Hashable] = set()
        self.references_of = references_of

    def used(self) -> int:
        """References held by paused holders (POOL-113)."""
        return sum(self.references_of(h) for h in self.holders)

    def excess(self) -> int:
        """How far paused holders are over the soft limit; never makes a call fail (POOL-113, POOL-120)."""
        return max(0, self.used() - self.limit)

    def pause(self, holder: Hashable) -> None:
        """Mark ``holder`` paused: it keeps its references but may take no new ones (POOL-114, POOL-121)."""
        holder = as_holder(holder, op="pause")
        if holder in self.holders:
            raise PausedHolderError("POOL-121", f"pause: holder {holder!r} is already paused")
        self.holders.add(holder)

    def resume(self, holder: Hashable) -> None:
        """Mark a paused ``holder`` active again (POOL-121)."""
        holder = as_holder(holder, op="resume")
        if holder not in self.holders:
            raise PausedHolderError("POOL-121", f"resume: holder {holder!r} is not paused")
        self.holders.discard(holder)

    def is_paused(self, holder: Hashable) -> bool:
        """Whether ``holder`` is paused (``holder`` checked as every call checks it)."""
        return as_holder(holder, op="is_paused") in self.holders

    def refuse(self, holder: Hashable, count: int, op: str) -> None:
        """POOL-114: a paused holder may not obtain ``count`` > 0 new references."""
        if count and holder in self.holders:
            raise PausedHolderError("POOL-114", f"{op}: holder {holder!r} is paused")

    def clear(self) -> None:
        """No holder is paused (POOL-124)."""
        self.holders.clear()


class PauseCalls:
    """The :class:`~kvref.contract.protocol.SupportsPause` members of a pool that holds its paused
    holders as ``self.paused`` (a :class:`PausedHolders`): each answers through it, written once for
    the oracle, the array core and the adapters."""

    paused: PausedHolders

    @property
    def paused_limit(self) -> int:
        """The soft limit on references held by paused holders (POOL-113)."""
        return self.paused.limit

    @property
    def paused_used(self) -> int:
        """References held by paused holders (POOL-113)."""
        return self.paused.used()

    @property
    def paused_excess(self) -> int:
        """How far paused holders are over the soft limit; never makes a call fail (POOL-113, POOL-120)."""
        return self.paused.excess()

    def pause(self, holder: Hashable) -> None:
        """Mark ``holder`` paused: it keeps its references but may take no new ones (POOL-114, POOL-121)."""
        self.paused.pause(holder)

    def resume(self, holder: Hashable) -> None:
        """Mark a paused ``holder`` active again (POOL-121)."""
        self.paused.resume(holder)

    def is_paused(self, holder: Hashable) -> bool:
        """Whether ``holder`` is paused."""
        return self.paused.is_paused(holder)
