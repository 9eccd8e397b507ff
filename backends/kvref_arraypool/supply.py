"""Where the array core's blocks come from and where they go (POOL-105, PFX-311, EVICT-405, EVICT-408).

:class:`BlockSupply` takes blocks for an allocation (the free stack top-down, then the policy's
victims for the shortfall, which leave the cache) and settles the blocks whose last reference
just went (free, cached in release order, or dropped under ``ref-zero``).
"""

from __future__ import annotations

import numpy as np

from kvref.contract.errors import OutOfBlocksError
from kvref.contract.events import CacheCounters
from kvref.contract.policies import EvictionPolicy
from kvref_arraypool.blocks import BlockArrays
from kvref_arraypool.eviction import Eviction
from kvref_arraypool.host_flags import count_true
from kvref_arraypool.ops import Array

__all__ = ["BlockSupply"]

_REF_ZERO = EvictionPolicy.REF_ZERO


class BlockSupply:
    """Takes blocks for allocations and settles released ones, over the free stack and the cache."""

    def __init__(self, blocks: BlockArrays, eviction: Eviction, counters: CacheCounters) -> None:
        self.ops = blocks.ops
        self.blocks = blocks
        self.eviction = eviction
        self.orders = eviction.orders
        self.index = eviction.index
        self.counters = counters
        self.policy = eviction.policy

    def available(self) -> int:
        """The largest count an allocation gets now: free plus reclaimable (POOL-106)."""
        return self.blocks.num_free + self.eviction.reclaimable()

    def take(self, n: int, op: str) -> Array:
        """Pop ``n`` blocks: the free stack top-down, then eviction victims (POOL-105, EVICT-408)."""
        blocks = self.blocks
        num_free = blocks.num_free
        if n <= num_free:
            return blocks.pop_free(n)
        short = n - num_free
        victims, reclaimable = self.eviction.victims(short)
        if len(victims) < short:
            raise OutOfBlocksError(
                "POOL-105",
                f"{op}: asked for {n} blocks, {num_free + reclaimable} available "
                f"({num_free} free + {reclaimable} evictable) of {blocks.num_usable} usable; nothing was taken",
            )
        ids = self.ops.concat([self.ops.flip(blocks.free_blocks()), victims])  # every free block, top first
        blocks.num_free = 0
        self.index.unregister(victims)
        self.counters.evictions += short
        return ids

    def evict(self, count: int) -> bool:
        """Evict the ``count`` cached blocks an allocation lacking ``count`` free blocks would (EVICT-412):
        they leave the cache as its victims would and become free, the first on top; False, evicting
        nothing, when fewer than ``count`` can be evicted (POOL-106)."""
        victims, _ = self.eviction.victims(count)
        if len(victims) < count:
            return False
        self.index.unregister(victims)
        self.counters.evictions += count
        self.blocks.push_free(self.ops.flip(victims))
        return True

    def settle(self, zeroed: Array, hashed: np.ndarray | None = None) -> None:
        """Blocks whose last reference just went, in release order: free, cached or dropped.

        ``hashed``: whether each is hashed, where the caller read it already (else one read here).
        """
        if len(zeroed) == 0:
            return
        blocks = self.blocks
        if hashed is None:
            hashed = self.ops.to_host(blocks.hash[zeroed] >= 0)
        k = count_true(hashed)
        if k == 0:  # the common release of unhashed blocks: all free, in order
            blocks.push_free(zeroed)
            return
        if self.policy is _REF_ZERO:
            dropped = blocks.part(zeroed, hashed)
            if len(dropped):
                self.index.unregister(dropped)
                self.counters.evictions += len(dropped)
            blocks.push_free(zeroed)
            return
        if k < len(zeroed):
            blocks.push_free(blocks.part(zeroed, ~hashed))
        self.orders.cache(blocks.part(zeroed, hashed))
