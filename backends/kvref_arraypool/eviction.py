"""The array core's eviction: which cached blocks go, and how many can (chapter 04).

``lru`` and ``ref-zero`` read the release order, ``fifo`` the registration order (both
:class:`~kvref_arraypool.orders.CacheOrders`), ``lru-leaf`` a window of the release order ranked by
:func:`~kvref_arraypool.leaf.leaf_order`, widened until it holds enough leaves, and
``lru-leaf-access`` every cached block ranked by the same function on access marks instead of
release stamps (access order does not follow the release queue, so no window of it will do).
"""

from __future__ import annotations

from kvref.contract.policies import EvictionPolicy
from kvref_arraypool.blocks import BlockArrays
from kvref_arraypool.leaf import leaf_order
from kvref_arraypool.ops import Array
from kvref_arraypool.orders import CacheOrders
from kvref_arraypool.prefix_index import PrefixIndex

__all__ = ["Eviction"]

_FIFO = EvictionPolicy.FIFO


class Eviction:
    """The reclaimable count (POOL-106) and the victims of the policy (EVICT-401..EVICT-408)."""

    def __init__(self, blocks: BlockArrays, orders: CacheOrders, index: PrefixIndex) -> None:
        self.ops = blocks.ops
        self.blocks = blocks
        self.orders = orders
        self.index = index
        self.policy = orders.policy

    def reclaimable(self) -> int:
        """How many cached blocks eviction could free now, under the policy (POOL-106)."""
        cached = self.orders.num_cached
        if not self.policy.prefix_closed or cached == 0:
            return cached
        return self._leaf_window(None)[1]

    def victims(self, k: int) -> tuple[Array, int]:
        """The first ``k`` blocks the policy evicts (fewer if fewer can go), and the reclaimable count."""
        cached = self.orders.num_cached
        if self.policy.prefix_closed:
            window = max(2 * k, 64)
            while True:
                victims, finite, exhausted = self._leaf_window(window)
                if finite >= k:
                    return victims[:k], finite
                if exhausted:
                    return victims, finite
                window *= 4
        if k > cached:
            return self.ops.zeros(0), cached
        if self.policy is _FIFO:
            ref = self.blocks.ref
            return self.orders.fifo.oldest(k, lambda qb: ref[qb] == 0), cached
        return self.orders.lru.oldest(k), cached

    def _leaf_window(self, m: int | None) -> tuple[Array, int, bool]:
        """Blocks of the ``m`` oldest cached blocks in lru-leaf order, how many are evictable, and
        whether the window was every cached block (always, under lru-leaf-access)."""
        by_access = self.policy.by_access
        blocks, stamps, exhausted = self.orders.lru.live_prefix(None if by_access else m)
        if by_access:
            stamps = self.blocks.accessed[blocks]  # distinct, as leaf_order needs: one mark per access
        index = self.index
        order, finite = leaf_order(
            self.ops,
            blocks,
            stamps,
            entry_of=self.blocks.entry,
            copies=index.copies,
            children=index.children,
            parent_entry=index.parent_entry,
            depth=index.depth,
            scratch=index.scratch,
            scratch2=index.scratch2,
        )
        return blocks[order[:finite]], finite, exhausted
