"""KV cache events and hit statistics (spec chapter 03, PFX-315..PFX-319).

Events describe which block hashes are *resident* (held by at least one cached block copy), so a
consumer (a KV-aware router) that applies them in order to a set reproduces the cache's resident
hashes exactly (PFX-316). ``BlockStored`` is due when a hash gains its first copy,
``BlockRemoved`` when it loses its last one (PFX-317), ``AllBlocksCleared`` on ``reset``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "CacheCounters",
    "KVEvent",
    "PrefixCacheStats",
    "apply_events",
]


@dataclass(frozen=True, slots=True)
class BlockStored:
    """``block_hash`` became resident; ``parent_hash`` is its chain parent (None: the root)."""

    block_hash: int
    parent_hash: int | None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """``block_hash`` is no longer resident: its last cached copy left the cache."""

    block_hash: int


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Every hash left the cache at once (``reset``)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def apply_events(resident: set[int], events: Iterable[KVEvent]) -> set[int]:
    """Apply ``events`` in order to a copy of ``resident`` and return it (the consumer's view)."""
    out = set(resident)
    for event in events:
        if isinstance(event, BlockStored):
            out.add(event.block_hash)
        elif isinstance(event, BlockRemoved):
            out.discard(event.block_hash)
        else:
            out.clear()
    return out


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """Cumulative prefix-cache counters (PFX-318).

    ``requests``: calls of ``match``; ``queries``: block hashes asked for by ``match``;
    ``hits``: blocks ``match`` returned; ``evictions``: cached blocks evicted to make room or
    dropped under ``ref-zero``; ``resets``: successful ``reset`` calls.
    """

    requests: int = 0
    queries: int = 0
    hits: int = 0
    evictions: int = 0
    resets: int = 0

    @property
    def hit_rate(self) -> float:
        """``hits / queries``, 0.0 before the first query."""
        return self.hits / self.queries if self.queries else 0.0


@dataclass(slots=True)
class CacheCounters:
    """The running counts behind :class:`PrefixCacheStats` (PFX-318, PFX-319), kept by a pool's parts."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    evictions: int = 0
    resets: int = 0

    def count_match(self, queried: int, hits: int) -> None:
        """One ``match`` of ``queried`` hashes that hit ``hits`` blocks."""
        self.requests += 1
        self.queries += queried
        self.hits += hits

    def stats(self) -> PrefixCacheStats:
        """The counts as the protocol reports them."""
        return PrefixCacheStats(self.requests, self.queries, self.hits, self.evictions, self.resets)
