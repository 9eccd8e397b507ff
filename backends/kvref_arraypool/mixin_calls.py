"""The internal calls the array core's mixins make on one another, declared once (:class:`MixinCalls`).

:class:`~kvref_arraypool.state.ArrayPoolState` inherits these declarations; each raises
NotImplementedError here and is defined by exactly one mixin of
:class:`~kvref_arraypool.pool.ArrayBlockPool` (the module named in its docstring), so a mixin calls
another's method through a typed name instead of reaching into it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np

from kvref_arraypool.ops import Array

__all__ = ["MixinCalls"]


class MixinCalls:
    """The calls one mixin of the array core makes on another (see the module docstring)."""

    def _take(self, n: int, op: str) -> Array:
        """Pop ``n`` blocks: the free stack, then eviction victims (POOL-105); :mod:`.references`."""
        raise NotImplementedError

    def _hand_out(self, ids: Array, hids: Array | int, sizes: Sequence[int] | None = None) -> None:
        """One reference each on fresh ``ids`` for ``hids`` (``sizes``: a batch's calls); :mod:`.references`."""
        raise NotImplementedError

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
        """Refuse a release a holder cannot make, or return the ids, distinct, sole, flags; :mod:`.references`."""
        raise NotImplementedError

    def _release(
        self,
        ids: Array,
        hids: Array | int,
        distinct: bool,
        *,
        sole: bool = False,
        flags: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """Drop one reference per position of checked ``ids``; :mod:`.references`."""
        raise NotImplementedError

    def _pin(
        self, ids: Array, hids: Array | int, sizes: Sequence[int] | None = None, *, refuse: Array | None = None
    ) -> bool:
        """Add one reference per position of ``ids`` unless ``refuse`` flags one (False); :mod:`.pinning`."""
        raise NotImplementedError

    def _pin_distinct(
        self, ids: Array, hids: Array | int, unheld: np.ndarray, other: np.ndarray, joined: np.ndarray
    ) -> None:
        """Pin distinct ``ids`` given their host flags (cached, held by another alone, shared); :mod:`.pinning`."""
        raise NotImplementedError

    def _lookup(self, hs: np.ndarray, parent: int) -> Array:
        """Blocks of the longest resident prefix of a chain; :mod:`.lookup`."""
        raise NotImplementedError

    def _unregister(self, victims: Array) -> None:
        """Remove the hash registration of ``victims``; :mod:`.registration`."""
        raise NotImplementedError

    def _reclaimable(self) -> int:
        """How many cached blocks eviction could free now (POOL-106); :mod:`.eviction`."""
        raise NotImplementedError

    def _select_victims(self, k: int) -> tuple[Array, int]:
        """The first ``k`` blocks the policy evicts, and the reclaimable count; :mod:`.eviction`."""
        raise NotImplementedError

    def eviction_order(self) -> list[int]:
        """Cached blocks in release order, oldest first; :mod:`.pool`."""
        raise NotImplementedError
