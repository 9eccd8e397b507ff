"""KV events of the radix tree, one per page (RADIX-634): what a KV-aware router needs to mirror it.

Every page a tree caches has a hash chained as chapter 02 chains block hashes: ``hash_block`` of
its parent page's hash (:data:`ROOT_HASH` for a namespace's first page) and its tokens, the first
page of a namespace other than the default ``None`` carrying it as a cache salt (``repr`` of it),
as chapter 02 puts a request's salt in its first block only. An insert that stores a node reports
``BlockStored`` for each of its pages in order, an eviction ``BlockRemoved`` for each page it
frees, a reset ``AllBlocksCleared``. Splitting a node changes no page, so it reports nothing.
Pages of one key are unique in a tree, so applying the events to a set (``apply_events``) gives
exactly the hashes of the cached pages.
"""

from __future__ import annotations

from collections.abc import Hashable

from kvref.contract.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvref.contract.hashing import ROOT_HASH, BlockExtraKeys, hash_block
from kvref.oracle.radix.nodes import Node

__all__ = ["PageEvents", "first_page_keys"]


def first_page_keys(namespace: Hashable) -> BlockExtraKeys | None:
    """The extra keys of a namespace's first page (RADIX-634): its ``repr`` as a cache salt."""
    return None if namespace is None else BlockExtraKeys(cache_salt=repr(namespace))


class PageEvents:
    """The events of one tree, kept when ``enabled``, taken oldest first."""

    def __init__(self, page_size: int, *, enabled: bool) -> None:
        self.page = page_size
        self.enabled = enabled
        self._events: list[KVEvent] = []

    def page_hashes(self, node: Node) -> tuple[int | None, list[int]]:
        """The hash ``node``'s first page chains on (None: the root), and the hash of each of its pages."""
        parent: int | None = None
        out: list[int] = []
        for n in reversed(list(node.path())):
            if out:
                parent = out[-1]
            out = []
            for start in range(0, len(n.tokens), self.page):
                before = out[-1] if out else parent
                extra = first_page_keys(n.namespace) if before is None else None
                out.append(
                    hash_block(ROOT_HASH if before is None else before, n.tokens[start : start + self.page], extra)
                )
        return parent, out

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
