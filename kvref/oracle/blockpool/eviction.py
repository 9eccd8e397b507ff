"""The oracle's eviction: which cached blocks go, and how many can (chapter 04).

``lru`` and ``ref-zero`` read the release order (``evictable``), ``fifo`` the registration order
(``registered``), ``lru-leaf`` the release order restricted to leaves of the resident tree, and
``lru-leaf-access`` the order of last access restricted likewise (:mod:`.orders`).
"""

from __future__ import annotations

from itertools import islice

from kvref.contract.errors import InvariantViolation
from kvref.contract.events import CacheCounters
from kvref.contract.policies import EvictionPolicy
from kvref.oracle.blockpool.blocks import BlockLists
from kvref.oracle.blockpool.orders import CacheOrders, LeafCandidates
from kvref.oracle.blockpool.prefix import PrefixIndex

__all__ = ["Eviction"]

_FIFO = EvictionPolicy.FIFO


class Eviction:
    """The reclaimable count (POOL-106) and the victims of the policy (EVICT-401..EVICT-408)."""

    def __init__(self, blocks: BlockLists, orders: CacheOrders, index: PrefixIndex, counters: CacheCounters) -> None:
        self.blocks = blocks
        self.orders = orders
        self.index = index
        self.counters = counters
        self.policy = orders.policy

    def evict(self, n: int) -> bool:
        """Evict the ``n`` cached blocks an allocation lacking ``n`` free blocks would (EVICT-412).

        They leave the cache as that allocation's victims would (in the policy's order, counted as
        evictions, with ``BlockRemoved`` for each last copy) and become free. When fewer than
        ``n`` can be evicted (POOL-106), nothing is evicted and the answer is False:
        Megatron-Core's ``evict_lru_blocks``.
        """
        if n > self.reclaimable():
            return False
        if n:
            self.blocks.free.extend(reversed(self.victims(n)))  # the first victim on top: handed out first
        return True

    def reclaimable(self) -> int:
        """How many cached blocks eviction could free now, under the policy (POOL-106): all of them,
        but under lru-leaf and lru-leaf-access one copy of each hash with an in-use copy below it
        and none of its own (:class:`.prefix.KeptHashes`)."""
        kept = self.index.kept
        return len(self.orders.evictable) - (0 if kept is None else kept.count)

    def victims(self, k: int, *, keep_tree: bool = True) -> list[int]:
        """Evict ``k`` cached blocks by the policy; they come back unhashed, off every list.

        The caller has checked that ``k`` blocks are reclaimable (POOL-106). ``keep_tree`` is as
        for :meth:`PrefixIndex.unregister`; lru-leaf always keeps the tree, which it reads.
        """
        if self.policy.prefix_closed:
            victims = self._evict_leaves(k)
        else:
            if self.policy is _FIFO:
                ref = self.blocks.ref
                victims = list(islice((b for b in self.orders.registered if ref[b] == 0), k))
            else:
                victims = list(islice(self.orders.evictable, k))
            self.index.unregister(victims, keep_tree=keep_tree)
        self.counters.evictions += k
        return victims

    def _evict_leaves(self, k: int) -> list[int]:
        """lru-leaf (EVICT-403): ``k`` times, unregister the least recently released block whose
        removal keeps the resident hashes prefix-closed: one that is not its hash's last copy, or
        whose hash has no resident child. lru-leaf-access (EVICT-411) reads the order of last access
        instead. Both read the order's heap (:class:`.orders.LeafCandidates`): a block found not to
        be a leaf leaves the heap until it becomes one, and removing a hash's last copy puts its
        parent's copies back (:meth:`PrefixIndex.unregister`), so the next pop sees them.
        """
        leaves = self.orders.evictable
        if not isinstance(leaves, LeafCandidates):
            raise InvariantViolation("EVICT-403", f"check_invariants: {self.policy.value} keeps no leaf heap")
        hashes, copies, children = self.blocks.hash, self.index.copies, self.index.children
        victims: list[int] = []
        while len(victims) < k:
            b = leaves.pop_least()
            if b is None:
                raise InvariantViolation(
                    "POOL-106", f"check_invariants: no evictable leaf left after {len(victims)} of {k} victims"
                )
            h: int = hashes[b]  # type: ignore[assignment]
            if h in children and len(copies[h]) == 1:
                continue  # the last copy of a hash with a resident child: not a leaf (yet)
            self.index.unregister((b,))
            victims.append(b)
        return victims
