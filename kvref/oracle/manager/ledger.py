"""The manager's statistics in tokens (REQ-716) and its events with tokens (REQ-717).

:class:`ManagerLedger` counts what ``get_computed_blocks`` found and turns the pool's residency
events (PFX-317) into the manager's: a ``BlockStored`` of the pool gains the tokens, block size
and extra keys the manager recorded when it registered the hash.
"""

from __future__ import annotations

from dataclasses import replace

from kvref.contract.events import BlockStored, KVEvent
from kvref.contract.hashing import BlockExtraKeys
from kvref.contract.manager import ManagerEvent, RequestBlockStored, RequestPrefixStats

__all__ = ["ManagerLedger"]


class ManagerLedger:
    """Statistics since the last take, and what the manager knows of each hash it registered."""

    def __init__(self, *, log_stats: bool, block_size: int) -> None:
        self.log_stats = log_stats
        self.block_size = block_size
        self.stats = RequestPrefixStats()
        self._content: dict[int, tuple[tuple[int, ...], BlockExtraKeys, int]] = {}

    # -------------------------------------------------------------- statistics (REQ-716)

    def record(self, *, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """Count one ``get_computed_blocks`` of a request that read the cache."""
        s = self.stats
        if preempted:
            self.stats = replace(
                s,
                preempted_requests=s.preempted_requests + 1,
                preempted_queries=s.preempted_queries + num_tokens,
                preempted_hits=s.preempted_hits + num_hits,
            )
        else:
            self.stats = replace(s, requests=s.requests + 1, queries=s.queries + num_tokens, hits=s.hits + num_hits)

    def mark_reset(self) -> None:
        """A ``reset_prefix_cache`` succeeded in this period."""
        self.stats = replace(self.stats, reset=True)

    def take_stats(self) -> RequestPrefixStats | None:
        """The statistics so far, then new ones; None when statistics are off."""
        if not self.log_stats:
            return None
        out, self.stats = self.stats, RequestPrefixStats()
        return out

    # -------------------------------------------------------------- events (REQ-717)

    def remember(self, key: int, token_ids: tuple[int, ...], extra_keys: BlockExtraKeys, group: int) -> None:
        """What the block registered under ``key`` in ``group`` holds, for its ``BlockStored``."""
        self._content[key] = (token_ids, extra_keys, group)

    def translate(self, pool_events: list[KVEvent], resident: frozenset[int]) -> list[ManagerEvent]:
        """The pool's residency events with the tokens of each stored hash.

        A hash names its content for good (chapter 02), so what was remembered of it stays valid;
        afterwards only the hashes in ``resident`` are kept (no event of the others is pending).
        """
        content = self._content
        out: list[ManagerEvent] = []
        for event in pool_events:
            if isinstance(event, BlockStored):
                tokens, extras, group = content[event.block_hash]
                out.append(
                    RequestBlockStored(event.block_hash, event.parent_hash, tokens, self.block_size, extras, group)
                )
            else:
                out.append(event)
        self._content = {h: c for h, c in content.items() if h in resident}
        return out

    def snapshot(self) -> tuple[RequestPrefixStats, dict[int, tuple[tuple[int, ...], BlockExtraKeys, int]]]:
        """The statistics and the remembered contents, for before/after comparison."""
        return self.stats, dict(self._content)
