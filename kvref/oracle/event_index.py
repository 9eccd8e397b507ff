"""kvref's event index: what a router rebuilds of each cache from its KV-event stream (PFX-328..PFX-330).

Each cache is a count of copies per block hash: a store adds a copy of each block it names, a
removal takes one away, a clear (or the cache's removal) empties it. Counting copies serves both
kinds of stream: one that keeps PFX-322 never stores a held block, so every count stays 0 or 1; one
that reports every copy (PFX-324) keeps a block while a copy is left (PFX-329). ``match`` walks a
chain from its first block and stops, per cache, at the first block the cache does not hold
(PFX-328). The caches share nothing (PFX-330).

An event no conforming cache sends (a store under a parent the cache does not hold, a removal of
a block it does not hold) is refused before anything changes, citing PFX-324; what an index does
with one is implementation-defined.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import SupportsIndex

from kvref.contract.errors import BlockStateError
from kvref.contract.event_index import IndexedBlock, as_indexed_blocks
from kvref.contract.validate import as_int, as_list

__all__ = ["OracleEventIndex"]


class OracleEventIndex:
    """Every cache's blocks rebuilt from its events, copies counted (PFX-328..PFX-330); see the module."""

    def __init__(self) -> None:
        self._caches: dict[int, dict[int, int]] = {}  # cache -> block hash -> stored copies left

    def store(self, cache: SupportsIndex, blocks: Sequence[IndexedBlock], parent: SupportsIndex | None) -> None:
        """``blocks`` stored in ``cache`` as a chain under ``parent`` (None: a root), one copy each (PFX-329)."""
        op = "store"
        name = as_int(cache, op=op, arg="cache")
        chain = as_indexed_blocks(blocks, op=op)
        held = self._caches.get(name, {})
        if parent is not None:
            top = as_int(parent, op=op, arg="parent")
            if not held.get(top):
                raise BlockStateError(
                    "PFX-324", f"{op}: parent {top} has no stored copy in cache {name}: no cache stores under it"
                )
        if not chain:
            return
        held = self._caches.setdefault(name, held)
        for block in chain:
            held[block.hash] = held.get(block.hash, 0) + 1

    def remove(self, cache: SupportsIndex, hashes: Sequence[int]) -> None:
        """One copy of each of ``hashes`` gone from ``cache``; a block with none left is no longer held."""
        op = "remove"
        name = as_int(cache, op=op, arg="cache")
        taken = Counter(
            as_int(h, op=op, arg=f"hashes[{i}]") for i, h in enumerate(as_list(hashes, op=op, arg="hashes"))
        )
        held = self._caches.get(name, {})
        for h, n in taken.items():
            if held.get(h, 0) < n:
                raise BlockStateError(
                    "PFX-324", f"{op}: cache {name} holds {held.get(h, 0)} copies of {h}, fewer than the {n} removed"
                )
        for h, n in taken.items():
            left = held[h] - n
            if left:
                held[h] = left
            else:
                del held[h]

    def clear(self, cache: SupportsIndex) -> None:
        """``cache`` emptied: it holds no block (PFX-328); the other caches keep theirs (PFX-330)."""
        self._caches.pop(as_int(cache, op="clear", arg="cache"), None)

    def remove_cache(self, cache: SupportsIndex) -> None:
        """``cache`` gone: everything it held forgotten; the other caches keep theirs (PFX-330)."""
        self._caches.pop(as_int(cache, op="remove_cache", arg="cache"), None)

    def match(self, blocks: Sequence[IndexedBlock]) -> dict[int, int]:
        """Per cache holding the first of ``blocks``, how many leading blocks it holds (PFX-328)."""
        chain = [block.hash for block in as_indexed_blocks(blocks, op="match")]
        answers = {}
        for name, held in self._caches.items():
            count = 0
            for h in chain:
                if not held.get(h):
                    break
                count += 1
            if count:
                answers[name] = count
        return answers

    def caches(self) -> list[int]:
        """The caches that hold a block or did since their last clear, in the order first named."""
        return list(self._caches)

    def held(self, cache: SupportsIndex) -> dict[int, int]:
        """A copy of ``cache``'s blocks: each hash and its stored copies."""
        return dict(self._caches.get(as_int(cache, op="held", arg="cache"), {}))

    def __repr__(self) -> str:
        return f"OracleEventIndex({len(self._caches)} caches)"
