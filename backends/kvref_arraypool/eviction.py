"""The array core's eviction orders: which cached blocks go, and how many can (chapter 04).

``lru`` and ``ref-zero`` read the release order, ``fifo`` the registration order (both
:class:`~kvref_arraypool.queue.StampQueue`), ``lru-leaf`` a window of the release order ranked by
:func:`~kvref_arraypool.leaf.leaf_order`, widened until it holds enough leaves, and
``lru-leaf-access`` every cached block ranked by the same function on access marks instead of
release stamps (access order does not follow the release queue, so no window of it will do).
"""

from __future__ import annotations

from typing import SupportsIndex

from kvref.contract.policies import EvictionPolicy
from kvref.contract.validate import as_count
from kvref_arraypool.leaf import leaf_order
from kvref_arraypool.ops import Array
from kvref_arraypool.state import ArrayPoolState

__all__ = ["Eviction"]

_FIFO = EvictionPolicy.FIFO


class Eviction(ArrayPoolState):
    """The reclaimable count (POOL-106) and the victims of each policy (EVICT-401..EVICT-408)."""

    def _leaf_window(self, m: int | None) -> tuple[Array, int, bool]:
        """Blocks of the ``m`` oldest cached blocks in lru-leaf order, how many are evictable, and
        whether the window was every cached block (always, under lru-leaf-access)."""
        by_access = self._policy.by_access
        blocks, stamps, exhausted = self._lru_order.live_prefix(None if by_access else m)
        if by_access:
            stamps = self._access[blocks]  # distinct, as leaf_order needs: one mark per access
        order, finite = leaf_order(
            self.ops,
            blocks,
            stamps,
            entry_of=self._bentry,
            copies=self._ecopies,
            children=self._echildren,
            parent_entry=self._epentry,
            depth=self._edepth,
            scratch=self._escratch,
            scratch2=self._escratch2,
        )
        return blocks[order[:finite]], finite, exhausted

    def evict(self, count: SupportsIndex) -> bool:
        """Evict the ``count`` cached blocks an allocation lacking ``count`` free blocks would (EVICT-412):
        they leave the cache as its victims would and become free, the first on top; False, evicting
        nothing, when fewer than ``count`` can be evicted (POOL-106)."""
        n = as_count(count, op="evict")
        if n == 0:
            return True
        victims, _ = self._select_victims(n)
        if len(victims) < n:
            return False
        self._unregister(victims)
        self._evictions += n
        self._push_free(self.ops.flip(victims))
        return True

    def _reclaimable(self) -> int:
        """How many cached blocks eviction could free now, under the policy (POOL-106)."""
        if not self._policy.prefix_closed or self._ncached == 0:
            return self._ncached
        return self._leaf_window(None)[1]

    def _select_victims(self, k: int) -> tuple[Array, int]:
        """The first ``k`` blocks the policy evicts (fewer if fewer can go), and the reclaimable count."""
        if self._policy.prefix_closed:
            window = max(2 * k, 64)
            while True:
                victims, finite, exhausted = self._leaf_window(window)
                if finite >= k:
                    return victims[:k], finite
                if exhausted:
                    return victims, finite
                window *= 4
        if k > self._ncached:
            return self.ops.zeros(0), self._ncached
        if self._policy is _FIFO:
            ref = self._ref
            return self._fifo_order.oldest(k, lambda qb: ref[qb] == 0), self._ncached
        return self._lru_order.oldest(k), self._ncached
