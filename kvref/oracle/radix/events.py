"""KV events of the radix tree, one per page (RADIX-634..RADIX-637): what a KV-aware router needs to mirror.

Every page a tree caches has chapter 02's hash of the key up to it, in blocks of a page
(``hash_token_blocks``, RADIX-635), with the namespace (``repr`` of it; none for the default
``None``) as the cache salt (RADIX-636). An insert that stores a node reports ``BlockStored`` for
each of its pages in order, an eviction ``BlockRemoved`` for each page it frees, a reset
``AllBlocksCleared`` (RADIX-634). Splitting a node changes no page, so it reports nothing
(RADIX-637). Pages of one key are unique in a tree, so applying
the events to a set (``apply_events``) gives exactly the hashes of the cached pages.
"""

from __future__ import annotations

from kvref.contract.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvref.contract.hashing import hash_token_blocks
from kvref.oracle.radix.nodes import Node

__all__ = ["PageEvents"]


class PageEvents:
    """The events of one tree, kept when ``enabled``, taken oldest first."""

    def __init__(self, page_size: int, *, enabled: bool) -> None:
        self.page = page_size
        self.enabled = enabled
        self._events: list[KVEvent] = []

    def page_hashes(self, node: Node) -> tuple[int | None, list[int]]:
        """The hash ``node``'s first page chains on (None: the root), and the hash of each of its pages:
        chapter 02's hashes of the whole key from the root, in pages, salted by the namespace."""
        tokens = [t for n in reversed(list(node.path())) for t in n.tokens]
        salt = None if node.namespace is None else repr(node.namespace)
        hashes = hash_token_blocks(tokens, self.page, cache_salt=salt)
        first = len(hashes) - len(node.tokens) // self.page
        return (hashes[first - 1] if first else None), hashes[first:]

    def stored(self, node: Node) -> None:
        """``node`` was made by an insert: one ``BlockStored`` per page, in order."""
        if self.enabled:
            parent, hashes = self.page_hashes(node)
            for h in hashes:
                self._events.append(BlockStored(h, parent))
                parent = h

    def removed(self, node: Node) -> None:
        """``node`` is being evicted: one ``BlockRemoved`` per page (its path is still whole)."""
        if self.enabled:
            self._events.extend(BlockRemoved(h) for h in self.page_hashes(node)[1])

    def cleared(self) -> None:
        """The tree was reset."""
        if self.enabled:
            self._events.append(AllBlocksCleared())

    def take(self) -> list[KVEvent]:
        """The events since the last call, oldest first."""
        events, self._events = self._events, []
        return events
