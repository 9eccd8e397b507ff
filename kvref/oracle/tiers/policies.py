"""The policies of chapter 11's tier store: which keys a store evicts, and how uses reorder them.

A policy sees every key of its tier that is pending or ready, never a slot or a pin count: the
store tells it which keys may go (``evictable``) and applies what it chose. :class:`LruTierPolicy`
orders the keys by their last use (TIER-1116, TIER-1117); :class:`ArcTierPolicy` keeps ARC's lists
T1 and T2, ghost lists B1 and B2 and its adaptive ``target`` (TIER-1118..TIER-1122).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

__all__ = ["ArcTierPolicy", "LruTierPolicy", "TierPolicy", "tier_policy"]


class TierPolicy(Protocol):
    """What the tier store asks of its policy; every key named is pending or ready unless said otherwise."""

    name: str

    def insert(self, key: int) -> None:
        """A store made ``key`` pending: its first use."""

    def remove(self, key: int) -> None:
        """A failed store dropped ``key`` (no ghost remembers it)."""

    def store_missed(self, keys: Sequence[int]) -> None:
        """A request is about to store these absent keys, each for the first time in that request."""

    def victims(self, count: int, evictable: Callable[[int], bool]) -> list[int] | None:
        """Choose ``count`` keys for which ``evictable`` holds, and forget them; None, changing nothing, if too few."""

    def touch(self, keys: Sequence[int], ready: Callable[[int], bool]) -> None:
        """Use ``keys`` now, the first most recent; ``ready`` tells a ready key from a pending one."""

    def request_finished(self, keys: Sequence[int], stored_only: set[int], reused: set[int]) -> None:
        """A request that named ``keys`` (first named first) ended; which it only stored, which it reused."""

    def clear(self) -> None:
        """Forget every key and every adaptive state (TIER-1124)."""


class LruTierPolicy:
    """Least recently used first (TIER-1116): one recency order over the tier's keys, oldest first."""

    name = "lru"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.recency: OrderedDict[int, None] = OrderedDict()

    def insert(self, key: int) -> None:
        """The store's prepare is the key's first use."""
        self.recency[key] = None

    def remove(self, key: int) -> None:
        """A failed store: the key leaves the order."""
        del self.recency[key]

    def store_missed(self, keys: Sequence[int]) -> None:
        """Nothing: lru keeps no memory of absent keys."""

    def victims(self, count: int, evictable: Callable[[int], bool]) -> list[int] | None:
        """The ``count`` oldest evictable keys, oldest first, or None when fewer are evictable."""
        chosen: list[int] = []
        if count > 0:
            for key in self.recency:
                if evictable(key):
                    chosen.append(key)
                    if len(chosen) == count:
                        break
        if len(chosen) < count:
            return None
        for key in chosen:
            del self.recency[key]
        return chosen

    def touch(self, keys: Sequence[int], ready: Callable[[int], bool]) -> None:
        """Use the resident keys of ``keys`` from the last to the first (TIER-1117), pending or ready."""
        for key in reversed(keys):
            if key in self.recency:
                self.recency.move_to_end(key)

    def request_finished(self, keys: Sequence[int], stored_only: set[int], reused: set[int]) -> None:
        """Every key the request named is used at its end, from the last to the first (TIER-1116, TIER-1117)."""
        for key in reversed(keys):
            if key in self.recency:
                self.recency.move_to_end(key)

    def clear(self) -> None:
        """Forget every key."""
        self.recency.clear()


class ArcTierPolicy:
    """Adaptive replacement (TIER-1118..TIER-1122): T1 and T2 in recency order, ghosts B1 and B2, ``target``."""

    name = "arc"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.target = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def insert(self, key: int) -> None:
        """A stored key enters T1 at its most recent end and leaves the ghost lists (TIER-1118)."""
        self.t1[key] = None
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: int) -> None:
        """A failed store: the key leaves its list without a ghost."""
        if key in self.t1:
            del self.t1[key]
        else:
            self.t2.pop(key, None)

    def _adapt(self, key: int) -> None:
        """A ghost hit moves ``target`` towards the list that lost the key (TIER-1121)."""
        if key in self.b1:
            self.target = min(self.target + max(1, len(self.b2) / len(self.b1)), self.capacity)
            self.b1.move_to_end(key)
        elif key in self.b2:
            self.target = max(self.target - max(1, len(self.b1) / len(self.b2)), 0)
            self.b2.move_to_end(key)

    def store_missed(self, keys: Sequence[int]) -> None:
        """Adapt ``target`` to each ghost hit, from the last key to the first (TIER-1121)."""
        for key in reversed(keys):
            self._adapt(key)

    def victims(self, count: int, evictable: Callable[[int], bool]) -> list[int] | None:
        """Take from T1 while it holds at least ``int(target)`` keys, else from T2, else the other (TIER-1120)."""
        if count <= 0:
            return []
        t1_size = len(self.t1)
        t1_keys, t2_keys = iter(self.t1), iter(self.t2)
        chosen: list[tuple[int, bool]] = []  # (key, from T1)

        def next_evictable(keys: Iterator[int]) -> int | None:
            return next((key for key in keys if evictable(key)), None)

        for _ in range(count):
            key = None
            from_t1 = t1_size >= int(self.target)
            if from_t1:
                key = next_evictable(t1_keys)
            if key is None:
                from_t1 = False
                key = next_evictable(t2_keys)
            if key is None:
                from_t1 = True
                key = next_evictable(t1_keys)
                if key is None:
                    return None
            if from_t1:
                t1_size -= 1
            chosen.append((key, from_t1))
        for key, from_t1 in chosen:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
        for ghosts in (self.b1, self.b2):
            while len(ghosts) > self.capacity:  # TIER-1122
                ghosts.popitem(last=False)
        return [key for key, _ in chosen]

    def touch(self, keys: Sequence[int], ready: Callable[[int], bool]) -> None:
        """From the last key to the first: a ready key in T1 moves to T2 (its second use), a pending one
        to T1's most recent end, a key in T2 to T2's most recent end; an absent key is a ghost hit."""
        for key in reversed(keys):
            if key in self.t1:
                del self.t1[key]
                (self.t2 if ready(key) else self.t1)[key] = None
            elif key in self.t2:
                self.t2.move_to_end(key)
            else:
                self._adapt(key)

    def request_finished(self, keys: Sequence[int], stored_only: set[int], reused: set[int]) -> None:
        """Reused keys move to T2's most recent end, keys only stored to their own list's (TIER-1119)."""
        for key in reversed(keys):
            if key in stored_only:
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
            elif key in reused:
                if key in self.t1:
                    del self.t1[key]
                    self.t2[key] = None
                elif key in self.t2:
                    self.t2.move_to_end(key)

    def clear(self) -> None:
        """Forget every key, both ghost lists and ``target``."""
        for keys in (self.t1, self.t2, self.b1, self.b2):
            keys.clear()
        self.target = 0.0


def tier_policy(name: str, capacity: int) -> LruTierPolicy | ArcTierPolicy:
    """The policy called ``name`` for a tier of ``capacity`` slots (TIER-1101 checks the name first)."""
    return LruTierPolicy(capacity) if name == "lru" else ArcTierPolicy(capacity)
