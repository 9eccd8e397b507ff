"""The oracle's eviction orders: which cached blocks go, and how many can (chapter 04).

``lru`` and ``ref-zero`` read the release order (``_evictable``), ``fifo`` the registration order
(``_registered``), ``lru-leaf`` the release order restricted to leaves of the resident tree, and
``lru-leaf-access`` the order of last access (``_access``) restricted likewise.
"""

from __future__ import annotations

from itertools import islice
from typing import SupportsIndex

from kvref.contract.policies import EvictionPolicy
from kvref.contract.validate import as_count
from kvref.oracle.blockpool.state import PoolState

__all__ = ["Eviction"]

_FIFO = EvictionPolicy.FIFO


class Eviction(PoolState):
    """The reclaimable count (POOL-106) and the victims of each policy (EVICT-401..EVICT-408)."""

    def evict(self, count: SupportsIndex) -> bool:
        """Evict the ``count`` cached blocks an allocation lacking ``count`` free blocks would (EVICT-412).

        They leave the cache as that allocation's victims would (in the policy's order, counted as
        evictions, with ``BlockRemoved`` for each last copy) and become free. When fewer than
        ``count`` can be evicted (POOL-106), nothing is evicted and the answer is False:
        Megatron-Core's ``evict_lru_blocks``.
        """
        n = as_count(count, op="evict")
        if n > self._reclaimable():
            return False
        if n:
            self._free.extend(reversed(self._evict(n)))  # the first victim on top: handed out first
        return True

    def _reclaimable(self) -> int:
        """How many cached blocks eviction could free now, under the policy (POOL-106)."""
        if not self._policy.prefix_closed:
            return len(self._evictable)
        # A hash with an in-use copy below it must keep one copy: mark the ancestors of every
        # in-use hashed block; each marked hash with no in-use copy of its own keeps one.
        hashes, parents = self._hash, self._parent
        own_use = {hashes[b] for b in self._hashed_in_use}
        busy_below: set[int] = set()
        for h in own_use:
            p = parents[h]  # type: ignore[index]
            while p is not None and p not in busy_below:
                busy_below.add(p)
                p = parents[p]
        return len(self._evictable) - len(busy_below - own_use)

    def _evict(self, k: int, *, keep_tree: bool = True) -> list[int]:
        """Evict ``k`` cached blocks by the policy; they come back unhashed, off every list.

        The caller has checked that ``k`` blocks are reclaimable (POOL-106). ``keep_tree`` is as
        for :meth:`_unregister`; lru-leaf always keeps the tree, which it reads.
        """
        if self._policy.prefix_closed:
            victims = self._evict_leaves(k)
        else:
            if self._policy is _FIFO:
                ref = self._ref
                victims = list(islice((b for b in self._registered if ref[b] == 0), k))
            else:
                victims = list(islice(self._evictable, k))
            self._unregister(victims, keep_tree=keep_tree)
        self._evictions += k
        return victims

    def _evict_leaves(self, k: int) -> list[int]:
        """lru-leaf (EVICT-403): ``k`` times, unregister the least recently released block whose
        removal keeps the resident hashes prefix-closed: one that is not its hash's last copy, or
        whose hash has no resident child. lru-leaf-access (EVICT-411) reads the cached blocks in
        the order of last access instead, sorted afresh at each pass.

        Taken one at a time from the front, since removing a hash's last copy can make its parent
        a leaf. A pass over the release order does the same in one go: it counts the copies and
        children its victims take away, so each block is judged as if the victims before it were
        gone, and it starts over only when a victim's parent may be a block it already passed.
        """
        evictable, hashes, copies, children, parents = (
            self._evictable,
            self._hash,
            self._copies,
            self._children,
            self._parent,
        )
        victims: list[int] = []
        while len(victims) < k:
            want = k - len(victims)
            taken: dict[int, int] = {}  # hash -> its copies this pass takes, for hashes of several copies
            lost: dict[int, int] = {}  # hash -> resident children this pass removes
            batch: list[int] = []
            passed = False
            order = sorted(evictable, key=self._access.__getitem__) if self._policy.by_access else evictable
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
            if not batch:
                raise self._violation("POOL-106", f"no evictable leaf left after {len(victims)} of {k} victims")
            self._unregister(batch)
            victims.extend(batch)
        return victims
