"""The array core's eviction and block supply: which cached blocks go, and where blocks come from (chapter 04).

:class:`Eviction` answers how many cached blocks can go (POOL-106) and which go first:
``lru`` and ``ref-zero`` read the release order, ``fifo`` the registration order (both
:class:`~kvref_arraypool.orders.CacheOrders`), ``lru-leaf`` a window of the release order ranked by
:func:`leaf_order`, widened until it holds enough leaves, and ``lru-leaf-access`` every cached
block ranked by the same function on access marks instead of release stamps (access order does
not follow the release queue, so no window of it will do).

:class:`BlockSupply` takes blocks for an allocation (the free stack top-down, then the policy's
victims for the shortfall, which leave the cache) and settles the blocks whose last reference
just went (free, cached in release order, or dropped under ``ref-zero``): POOL-105, PFX-311,
EVICT-405, EVICT-408.
"""

from __future__ import annotations

import numpy as np

from kvref.contract.errors import OutOfBlocksError
from kvref.contract.events import CacheCounters
from kvref.contract.policies import EvictionPolicy
from kvref_arraypool.blocks import BlockArrays
from kvref_arraypool.host_arrays import count_true
from kvref_arraypool.ops import Array, ArrayOps
from kvref_arraypool.orders import CacheOrders
from kvref_arraypool.prefix_index import PrefixIndex

__all__ = ["INF_TIME", "BlockSupply", "Eviction", "leaf_order"]

_FIFO = EvictionPolicy.FIFO
_REF_ZERO = EvictionPolicy.REF_ZERO
#: Effective time of a block that cannot be evicted now; larger than any stamp.
INF_TIME = 1 << 42
_DEPTH_BITS = 20
_DEPTH_MAX = (1 << _DEPTH_BITS) - 1


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


def leaf_order(
    ops: ArrayOps,
    blocks: Array,
    stamps: Array,
    *,
    entry_of: Array,
    copies: Array,
    children: Array,
    parent_entry: Array,
    depth: Array,
    scratch: Array,
    scratch2: Array,
) -> tuple[Array, int]:
    """Positions of ``blocks`` in lru-leaf eviction order, and how many of them are evictable now,
    without a per-victim loop (EVICT-402, EVICT-403, EVICT-404).

    ``blocks``/``stamps``: the window, oldest release first. The per-entry arrays describe hash
    entries (copies, resident children, parent entry or -1, depth). ``scratch`` must be all 0 and
    ``scratch2`` all -1 over the entries; both are restored before returning.

    The oracle evicts one block at a time: the least recently released block whose eviction keeps
    the resident hashes prefix-closed (a copy of a hash with other copies, or the last copy of a
    hash with no resident child). Evicting a last copy can make its parent's last copy eligible, so
    the order is not simply release order. It is, though, a sort. Give every cached block ``u`` an
    *effective time*:

    * a copy that is not its hash's last copy (the hash has an in-use copy, or a younger cached
      copy) is eligible now: ``eff(u) = stamp(u)``;
    * the last copy of a hash is eligible once every resident child hash is gone, so
      ``eff(u) = max(stamp(u), eff of each child hash's last copy)``, and infinite when a child hash
      has a copy in use (it never goes).

    Stamps are distinct, so equal effective times occur only along one ancestor chain (a node and
    the ancestors that inherited its time), and there the deeper goes first. The oracle's order is
    then exactly ascending ``(eff, -depth)``: the smallest pair is always eligible and always the
    least recently released eligible block. See ``spec/04-eviction.md`` (EVICT-403).

    This function computes it for a *window*: the ``m`` least recently released cached
    blocks. A dependency outside the window (a younger last copy, a child whose last copy is
    younger) counts as infinite; every finite effective time inside the window is then exact, and
    every block outside has a larger one, so the window's finite blocks, in order, are the first
    victims. The subtree maxima are taken by pointer doubling: ``log2(depth)`` rounds of one
    gather and one scatter-max each, over the window only.
    """
    m = len(blocks)
    if m == 0:
        return ops.zeros(0), 0
    e = entry_of[blocks]
    # Copies of each entry inside the window; a hash's last copy is in the window only if all its
    # copies are (an in-use copy or a younger cached one keeps the hash resident).
    ops.scatter_add(scratch, e, 1)
    all_in = scratch[e] == copies[e]
    ops.fill_at(scratch, e, 0)
    ops.scatter_max(scratch2, e, stamps)
    last = all_in & (stamps == scratch2[e])
    ops.fill_at(scratch2, e, -1)

    lb = ops.nonzero(last)
    le = e[lb]
    lpe = parent_entry[le]
    with_parent = lpe >= 0
    pe = lpe[with_parent]
    ops.scatter_add(scratch, pe, 1)
    blocked = scratch[le] != children[le]
    ops.fill_at(scratch, pe, 0)
    value = ops.where(blocked, INF_TIME, stamps[lb])

    # Parent of each last copy, as a position among the last copies (-1: none in the window).
    scratch2[le] = ops.arange(len(lb))
    anc = ops.full(len(lb), -1)
    anc[with_parent] = scratch2[pe]
    ops.fill_at(scratch2, le, -1)
    while True:
        src = ops.nonzero(anc >= 0)
        if len(src) == 0:
            break
        up = anc[src]
        pushed = ops.copy(value)
        ops.scatter_max(pushed, up, value[src])
        value = pushed
        jumped = ops.copy(anc)
        jumped[src] = anc[up]
        anc = jumped

    eff = ops.copy(stamps)
    eff[lb] = value
    d = depth[e]
    d = ops.where(d > _DEPTH_MAX, _DEPTH_MAX, d)
    key = (eff << _DEPTH_BITS) | (_DEPTH_MAX - d)
    order = ops.argsort(key)
    return order, ops.count(eff < INF_TIME)
