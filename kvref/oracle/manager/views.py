"""What the oracle manager shows without changing anything (REQ-718, REQ-719, REQ-721, REQ-735): tables,
keys, common prefixes, its self-check and a snapshot, over one pool or one pool per group.

:class:`ManagerViews` is a mixin of :class:`~kvref.oracle.manager.manager.RequestManager`; it reads
the groups (each with its pool), the distinct pools, the requests and the ledger that the manager keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvref.contract.errors import InvalidValueError
from kvref.contract.manager import NULL_BLOCK, KVCacheBlocks
from kvref.contract.protocol import PrefixCache
from kvref.contract.requests import Request
from kvref.contract.validate import as_int
from kvref.oracle.manager.groups import GroupTables
from kvref.oracle.manager.ledger import ManagerLedger
from kvref.oracle.manager.tables import common_prefix_blocks, verify_tables

__all__ = ["ManagerViews", "pool_view"]


def pool_view(pool: PrefixCache, caching: bool) -> Any:
    """The pool's own snapshot, or its references and hashes block by block, for ERR-501 comparisons."""
    take = getattr(pool, "snapshot", None)
    if callable(take):
        return take()
    return tuple((pool.ref_count(b), pool.block_hash(b) if caching else None) for b in range(pool.num_blocks))


class ManagerViews:
    """The manager's read-only calls; every block id is read in the pool of its group."""

    groups: list[GroupTables]
    pools: tuple[PrefixCache, ...]
    enable_caching: bool
    _requests: dict[str, Request]
    _max_model_len: int
    _ledger: ManagerLedger

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's blocks in token order, one list per group, the null block included (REQ-719)."""
        return tuple(list(g.tables.get(request_id, ())) for g in self.groups)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's blocks as :class:`KVCacheBlocks` (REQ-719)."""
        return KVCacheBlocks(tuple(tuple(g.tables.get(request_id, ())) for g in self.groups))

    def get_unhashed_block_ids(self, blocks: KVCacheBlocks) -> list[int]:
        """The blocks of ``blocks`` not registered under any hash in their group's pool, the null block
        left out (REQ-719)."""
        return [
            b
            for g, group in zip(self.groups, blocks.blocks, strict=False)
            for b in group
            if b != NULL_BLOCK and g.pool.block_hash(b) is None
        ]

    def block_hash(self, block_id: int, *, group: int = 0) -> int | None:
        """The key ``block_id`` of group ``group`` is registered under (the block's hash in group 0), or
        None; ``group`` names the pool where each group has its own (REQ-735)."""
        g = as_int(group, op="block_hash", arg="group", rule="REQ-735")
        if not 0 <= g < len(self.groups):
            raise InvalidValueError("REQ-735", f"block_hash: group {g} outside [0, {len(self.groups)})")
        return self.groups[g].pool.block_hash(block_id) if self.enable_caching else None

    def get_num_common_prefix_blocks(self, request_ids: Sequence[str], *, num_running: int | None = None) -> list[int]:
        """Leading blocks every named request holds at the same position, per group (REQ-718)."""
        return [
            common_prefix_blocks([g.tables.get(rid, []) for rid in request_ids], g.pool.ref_count, num_running)
            for g in self.groups
        ]

    def num_cached_blocks(self, request_id: str, group: int = 0) -> int:
        """How many leading positions of the request's table in ``group`` are cached (or skipped)."""
        return self.groups[group].num_cached.get(request_id, 0)

    def check_invariants(self) -> None:
        """Raise InvariantViolation naming the first broken part of REQ-721, pool by pool."""
        for pool in self.pools:
            verify_tables(pool, [g for g in self.groups if g.pool is pool], self._requests, self._max_model_len)

    def snapshot(self) -> dict[str, Any]:
        """Tables, cached counts, statistics and each pool's own snapshot (or view), for ERR-501 checks."""
        return {
            "tables": [{rid: list(t) for rid, t in g.tables.items()} for g in self.groups],
            "num_cached": [dict(g.num_cached) for g in self.groups],
            "cached_this_step": [sorted(g.cached_this_step) for g in self.groups],
            "ledger": self._ledger.snapshot(),
            "num_available": [pool.num_available for pool in self.pools],
            "pools": [pool_view(pool, self.enable_caching) for pool in self.pools],
        }
