"""Planted event-index bugs: kvref's index with one mistake each, as backends the suite must catch.

Each is the oracle backend with ``create_event_index`` building the mistaken index;
:data:`EVENT_INDEX_BUGS` names the rule each breaks (``test_event_index_planted_bugs.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import SupportsIndex

from kvref.contract.event_index import IndexedBlock
from kvref.oracle.backend import OracleBackend
from kvref.oracle.event_index import OracleEventIndex


class OneEntryPerBlock(OracleEventIndex):
    """Keeps one entry per block and cache: a second stored copy is not counted, so the first removal
    drops a block a copy of which is left (PFX-329)."""

    def store(self, cache: SupportsIndex, blocks: Sequence[IndexedBlock], parent: SupportsIndex | None) -> None:
        held = self.held(cache)
        super().store(cache, [b for b in blocks if b.hash not in held], parent)


class ClearEmptiesEveryCache(OracleEventIndex):
    """A clear of one cache empties all of them (PFX-330)."""

    def clear(self, cache: SupportsIndex) -> None:
        for other in list(self.caches()):
            super().clear(other)


class RemovalDropsDescendants(OracleEventIndex):
    """A removal also drops every block stored under the removed one, which the cache still holds (PFX-328)."""

    def __init__(self) -> None:
        super().__init__()
        self.parents: dict[int, int | None] = {}

    def store(self, cache: SupportsIndex, blocks: Sequence[IndexedBlock], parent: SupportsIndex | None) -> None:
        super().store(cache, blocks, parent)
        above = None if parent is None else int(parent)
        for block in blocks:
            self.parents[block.hash] = above
            above = block.hash

    def remove(self, cache: SupportsIndex, hashes: Sequence[int]) -> None:
        super().remove(cache, hashes)
        gone = set(hashes)
        for h in sorted(self.held(cache)):
            at = self.parents.get(h)
            while at is not None and at not in gone:
                at = self.parents.get(at)
            if at is not None:
                super().remove(cache, [h] * self.held(cache)[h])


def _backend(index: type[OracleEventIndex]) -> type[OracleBackend]:
    return type(index.__name__ + "Backend", (OracleBackend,), {"name": index.__name__, "event_index": index})


#: Each planted event-index bug and the rule the suite must name.
EVENT_INDEX_BUGS: dict[str, str] = {
    "OneEntryPerBlock": "PFX-329",
    "ClearEmptiesEveryCache": "PFX-330",
    "RemovalDropsDescendants": "PFX-328",
}

for _name in EVENT_INDEX_BUGS:
    globals()[_name] = _backend(globals()[_name])
