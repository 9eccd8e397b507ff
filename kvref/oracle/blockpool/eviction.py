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
from kvref.oracle.blockpool.orders import CacheOrders
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
        """How many cached blocks eviction could free now, under the policy (POOL-106)."""
        evictable = self.orders.evictable
        if not self.policy.prefix_closed:
            return len(evictable)
        # A hash with an in-use copy below it must keep one copy: mark the ancestors of every
        # in-use hashed block; each marked hash with no in-use copy of its own keeps one.
        hashes, parents = self.blocks.hash, self.index.parent
        own_use = {hashes[b] for b in self.orders.hashed_in_use}
        busy_below: set[int] = set()
        for h in own_use:
            p = parents[h]  # type: ignore[index]
            while p is not None and p not in busy_below:
                busy_below.add(p)
                p = parents[p]
        return len(evictable) - len(busy_below - own_use)

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
        whose hash has no resident child. lru-leaf-access (EVICT-411) reads the cached blocks in
        the order of last access instead, read off the order's heap (:class:`.orders.AccessOrdered`).

        Taken one at a time from the front, since removing a hash's last copy can make its parent
        a leaf. A pass over the release order does the same in one go: it counts the copies and
        children its victims take away, so each block is judged as if the victims before it were
        gone, and it starts over only when a victim's parent may be a block it already passed.
        """
        evictable, hashes = self.orders.evictable, self.blocks.hash
        copies, children, parents = self.index.copies, self.index.children, self.index.parent
        victims: list[int] = []
        while len(victims) < k:
            want = k - len(victims)
            taken: dict[int, int] = {}  # hash -> its copies this pass takes, for hashes of several copies
            lost: dict[int, int] = {}  # hash -> resident children this pass removes
            batch: list[int] = []
            passed = False
            order = self.orders.by_access() if self.policy.by_access else iter(evictable)
            for b in order:
                h: int = hashes[b]  # type: ignore[assignment]
                copies_of_h = len(copies[h])
                left = copies_of_h - taken.get(h, 0) if copies_of_h > 1 else 1  # this one and later ones
                if left == 1 and h in children and children[h] != lost.get(h, 0):
                    passed = True  # the last copy of a hash with a resident child: not a leaf (yet)
                    continue
                if copies_of_h > 1:
                    taken[h] = copies_of_h - left + 1
                batch.append(b)
                if len(batch) == want:
                    break
                if left == 1:
                    parent = parents[h]
                    if parent is not None:
                        lost[parent] = lost.get(parent, 0) + 1
                        if passed:
                            break  # the parent may be a block passed over: start again
            close = getattr(order, "close", None)
            if close is not None:
                close()  # an access-order read gives back the heap entries it took, before they change
            if not batch:
                raise InvariantViolation(
                    "POOL-106", f"check_invariants: no evictable leaf left after {len(victims)} of {k} victims"
                )
            self.index.unregister(batch)
            victims.extend(batch)
        return victims
