"""The radix tree's nodes and its evictable leaves in policy order (chapter 06).

A :class:`Node` holds a run of whole pages of tokens and the slots they occupy. Evictable leaves
(unlocked, childless, not a root) wait in :class:`EvictableLeaves`, a heap ordered by the
policy's key with lazy deletion: a node's entry is current while its ``stamp`` matches, so an
eviction costs O(log n) per node evicted, however many leaves there are (RADIX-628).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field

from kvref.contract.errors import InvalidTypeError, InvalidValueError

__all__ = ["RADIX_POLICIES", "EvictableLeaves", "Node", "as_radix_policy", "page_key"]

#: Eviction policies of the radix cache (RADIX-628): which unlocked leaf goes first.
RADIX_POLICIES = ("lru", "lfu", "fifo", "mru", "priority")


def as_radix_policy(value: object) -> str:
    """``value`` as one of :data:`RADIX_POLICIES`, or the error naming RADIX-628."""
    if not isinstance(value, str):
        raise InvalidTypeError("RADIX-628", f"policy must be a string, one of {RADIX_POLICIES}; got {value!r}")
    if value not in RADIX_POLICIES:
        raise InvalidValueError("RADIX-628", f"unknown radix eviction policy {value!r}; one of {RADIX_POLICIES}")
    return value


def page_key(tokens: array[int], at: int, page: int) -> bytes:
    """The key a node's parent files it under: the bytes of its first page, ``tokens[at : at + page]``."""
    return tokens[at : at + page].tobytes()


@dataclass(eq=False)
class Node:
    """A run of whole pages: its tokens, the slots holding them, its place in the tree and its keys.

    ``access`` is the logical time of the last match or insert through it, ``created`` of its
    creation, ``hits`` the matches that reached it, ``priority`` the insert's priority (RADIX-628).
    ``locks`` counts the locks held on it or on a descendant (RADIX-624). ``stamp`` changes when
    its eviction key does, which invalidates its older heap entries.
    """

    ident: int
    namespace: Hashable
    tokens: array[int]  # array("Q"): slices compare at C speed
    slots: list[int]
    parent: Node | None
    children: dict[bytes, Node] = field(default_factory=dict)  # by page_key of each child's first page
    locks: int = 0
    access: int = 0
    created: int = 0
    hits: int = 0
    priority: int = 0
    stamp: int = 0
    alive: bool = True

    @property
    def is_root(self) -> bool:
        """A namespace's root: no tokens, never evicted."""
        return self.parent is None

    def path(self) -> Iterator[Node]:
        """This node and its ancestors up to, not including, the root."""
        node: Node | None = self
        while node is not None and not node.is_root:
            yield node
            node = node.parent


class EvictableLeaves:
    """Unlocked leaves in the policy's order; stale entries are dropped when they surface."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self._heap: list[tuple[tuple[int, ...], int, int, Node]] = []
        self._stamps = 0

    def _key(self, node: Node) -> tuple[int, ...]:
        if self.policy == "lru":
            return (node.access,)
        if self.policy == "mru":
            return (-node.access,)
        if self.policy == "fifo":
            return (node.created,)
        if self.policy == "lfu":
            return (node.hits, node.access)
        return (node.priority, node.access)  # priority: lowest first, then least recently used

    @staticmethod
    def evictable(node: Node) -> bool:
        """Alive, not a root, unlocked and childless."""
        return node.alive and not node.is_root and node.locks == 0 and not node.children

    def offer(self, node: Node) -> None:
        """(Re)enter ``node`` with its current key if it is an evictable leaf now."""
        self._stamps += 1
        node.stamp = self._stamps
        if self.evictable(node):
            heapq.heappush(self._heap, (self._key(node), node.stamp, node.ident, node))

    def pop(self) -> Node | None:
        """The first evictable leaf in policy order, taken out; None when there is none."""
        heap = self._heap
        while heap:
            _, stamp, _, node = heapq.heappop(heap)
            if stamp == node.stamp and self.evictable(node):
                node.stamp = -1  # taken: any other entry of it is stale
                return node
        return None

    def compact(self, live: int) -> None:
        """Drop stale entries once they outnumber the live nodes (keeps memory flat)."""
        if len(self._heap) > 2 * live + 64:
            self._heap = [e for e in self._heap if e[1] == e[3].stamp and self.evictable(e[3])]
            heapq.heapify(self._heap)

    def clear(self) -> None:
        """Forget every entry."""
        self._heap.clear()
