"""The oracle request-level manager over any chapter 03 prefix cache (spec chapter 07).

:class:`RequestManager` does what vLLM's ``KVCacheManager`` does for one full-attention group:
it finds a request's cached prefix (REQ-704), pins those hits and allocates the rest when they
fit (REQ-708, REQ-709), registers full blocks as they fill (REQ-710, REQ-711), frees tail first
(REQ-713) and counts in tokens (REQ-716). It holds references in the pool under the request id,
keeps each request's table (vLLM's ``req_to_blocks``) and how many of its leading blocks are
registered (``num_cached_block``), and checks every argument before changing anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvref.contract.errors import ConfigError, InvalidTypeError, InvalidValueError
from kvref.contract.manager import LAST_BLOCK_MODES, KVCacheBlocks, ManagerEvent, RequestPrefixStats
from kvref.contract.protocol import PrefixCache
from kvref.contract.requests import Request, RequestStatus
from kvref.contract.validate import as_count, as_int
from kvref.oracle.manager.checks import checked_hits, token_count
from kvref.oracle.manager.ledger import ManagerLedger
from kvref.oracle.manager.tables import common_prefix_blocks, verify_tables

__all__ = ["RequestManager"]

_EMPTY = KVCacheBlocks(((),))


class RequestManager:
    """vLLM's ``KVCacheManager`` for one full-attention group, over ``pool`` (chapter 07).

    ``pool`` must be a chapter 03 prefix cache when ``enable_caching`` (with events on when
    ``enable_kv_cache_events``) and holds nothing yet. ``last_block`` chooses REQ-701's
    (``"recompute"``, vLLM) or REQ-705's (``"share"``, Megatron-Core) treatment of a prompt of
    whole blocks; ``use_eagle`` drops the last block of a hit (REQ-707).
    """

    def __init__(
        self,
        pool: PrefixCache,
        *,
        block_size: int,
        max_model_len: int,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = True,
        enable_kv_cache_events: bool = False,
        last_block: str = "recompute",
        stats_at: str = "admission",
    ) -> None:
        size = as_count(block_size, op="RequestManager", arg="block_size")
        limit = as_count(max_model_len, op="RequestManager", arg="max_model_len")
        if size == 0 or limit == 0:
            raise ConfigError("REQ-708", f"RequestManager: block_size {size} and max_model_len {limit} must be >= 1")
        if stats_at not in ("admission", "lookup"):
            raise ConfigError(
                "REQ-716", "RequestManager: stats_at must be 'admission' (vLLM 0.32) or 'lookup' (seed 004)"
            )
        if last_block not in LAST_BLOCK_MODES:
            raise ConfigError("REQ-705", f"RequestManager: last_block must be one of {sorted(LAST_BLOCK_MODES)}")
        if enable_caching and "prefix-cache" not in pool.capabilities():
            raise ConfigError("REQ-704", "RequestManager: caching needs a pool with the prefix-cache capability")
        if enable_kv_cache_events and not (enable_caching and "events" in pool.capabilities()):
            raise ConfigError("REQ-717", "RequestManager: events need caching and a pool with events on")
        if pool.num_in_use:
            raise ConfigError("REQ-721", f"RequestManager: the pool already has {pool.num_in_use} blocks in use")
        self.pool = pool
        self._block_size = size
        self._max_model_len = limit
        self.enable_caching = bool(enable_caching)
        self.use_eagle = bool(use_eagle)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.last_block = last_block
        self.stats_at = stats_at
        self._tables: dict[str, list[int]] = {}
        self._num_cached: dict[str, int] = {}
        self._requests: dict[str, Request] = {}
        self._ledger = ManagerLedger(log_stats=log_stats, block_size=size)
        if self.enable_kv_cache_events:
            pool.take_events()  # what happened before the manager is not its to report

    # ------------------------------------------------------------------ properties

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def max_model_len(self) -> int:
        """The most tokens a request's blocks may cover (REQ-720)."""
        return self._max_model_len

    @property
    def num_free_blocks(self) -> int:
        """Free plus cached unreferenced blocks: what an allocation could take now."""
        return self.pool.num_available

    @property
    def usage(self) -> float:
        """``1 - num_available / num_usable`` (REQ-723)."""
        usable = self.pool.num_usable
        return 1.0 - self.pool.num_available / usable if usable else 0.0

    def capabilities(self) -> frozenset[str]:
        """``request-manager``, with the pool's events where the manager reports them."""
        return frozenset({"request-manager"} | ({"events"} if self.enable_kv_cache_events else set()))

    # ------------------------------------------------------------------ checks

    def _request(self, request: object, op: str) -> Request:
        if not isinstance(request, Request):
            raise InvalidTypeError("REQ-703", f"{op}: expected a kvref Request, got {type(request).__name__}")
        if request.block_size != self._block_size:
            raise InvalidValueError(
                "REQ-703",
                f"{op}: request {request.request_id!r} is hashed in blocks of {request.block_size}, "
                f"the manager's blocks hold {self._block_size}",
            )
        known = self._requests.get(request.request_id)
        if known is not None and known is not request:
            raise InvalidValueError(
                "REQ-703", f"{op}: another request object with id {request.request_id!r} holds blocks here"
            )
        return request

    # ------------------------------------------------------------------ computed blocks

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The request's longest cached prefix and the tokens it covers (REQ-701, REQ-704..REQ-707).

        Pins nothing and changes nothing; with ``stats_at="lookup"`` counts the request in the
        statistics (REQ-706, REQ-716).
        """
        req = self._request(request, "get_computed_blocks")
        if not self.enable_caching or req.skip_reading_prefix_cache:
            return _EMPTY, 0
        n, size = req.num_tokens, self._block_size
        limit = self._hit_bound(n)
        hits = self.pool.lookup(req.block_hashes[:limit]) if limit else []
        if self.use_eagle and hits:
            hits = hits[:-1]
        computed = min(len(hits) * size, n - 1)
        if self.stats_at == "lookup":
            self._ledger.record(num_tokens=n, num_hits=computed, preempted=req.num_preemptions > 0)
        return (KVCacheBlocks((tuple(hits),)) if hits else _EMPTY), computed

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Count an admitted request and its hit tokens, as vLLM's scheduler does once it admits one (REQ-716).

        Counts nothing for a request that skips the cache, with caching off, or with
        ``stats_at="lookup"`` (where ``get_computed_blocks`` counted it already).
        """
        req = self._request(request, "record_prefix_cache_stats")
        hits = as_int(num_hits, op="record_prefix_cache_stats", arg="num_hits", rule="REQ-716")
        if not 0 <= hits < max(req.num_tokens, 1):
            raise InvalidValueError("REQ-716", f"record_prefix_cache_stats: {hits} hits for {req.num_tokens} tokens")
        if self.stats_at != "admission" or not self.enable_caching or req.skip_reading_prefix_cache:
            return
        self._ledger.record(num_tokens=req.num_tokens, num_hits=hits, preempted=req.num_preemptions > 0)

    def _hit_bound(self, num_tokens: int) -> int:
        """The most blocks a request of ``num_tokens`` tokens may hit (REQ-701, REQ-705)."""
        size = self._block_size
        return (num_tokens - 1) // size if self.last_block == "recompute" else num_tokens // size

    # ------------------------------------------------------------------ allocation

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_draft_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ) -> KVCacheBlocks | None:
        """Pin the hits, allocate the blocks the tokens need, cache the full ones (REQ-708..REQ-712, REQ-720, REQ-724).

        Returns the newly allocated blocks, or None, changing nothing, when they do not fit.
        """
        op = "allocate_slots"
        req = self._request(request, op)
        new = token_count(num_new_tokens, op, "num_new_tokens")
        new_computed = token_count(num_new_computed_tokens, op, "num_new_computed_tokens")
        lookahead = token_count(num_lookahead_tokens, op, "num_lookahead_tokens")
        external = token_count(num_external_computed_tokens, op, "num_external_computed_tokens")
        draft = token_count(num_draft_tokens, op, "num_draft_tokens")
        if new == 0 and new_computed == 0 and external == 0:
            raise InvalidValueError(
                "REQ-712", f"{op}: num_new_tokens must be > 0 when there are no computed tokens to adopt"
            )
        if draft > new:
            raise InvalidValueError("REQ-712", f"{op}: {draft} draft tokens among only {new} new tokens")
        hits = checked_hits(
            self.pool, req, new_computed_blocks, new_computed,
            holds=bool(self._tables.get(req.request_id)), bound=self._hit_bound(req.num_tokens), op=op,
        )  # fmt: skip
        rid, size = req.request_id, self._block_size
        table = self._tables.get(rid, [])
        computed = req.num_computed_tokens
        if computed > len(table) * size:
            raise InvalidValueError(
                "REQ-712",
                f"{op}: request {rid!r} says {computed} tokens are computed, its {len(table)} blocks hold fewer",
            )
        total = min(computed + new_computed + external, self._max_model_len)
        need_slot = min(total + new + lookahead, self._max_model_len)
        num_new_blocks = max(0, -(-need_slot // size) - len(table) - len(hits))
        pool = self.pool
        if full_sequence_must_fit:
            whole = min(req.num_tokens, self._max_model_len)
            if not self._fits(max(0, -(-whole // size) - len(table) - len(hits)), hits):
                return None
        if not self._fits(num_new_blocks, hits):
            return None
        if hits:
            pool.acquire(hits, holder=rid)
        fresh = pool.allocate(num_new_blocks, holder=rid) if num_new_blocks else []
        if rid not in self._tables:
            self._tables[rid] = table
            self._num_cached[rid] = 0
            self._requests[rid] = req
        if hits:
            table.extend(hits)
            self._num_cached[rid] = len(hits)
        table.extend(fresh)
        if self.enable_caching and not delay_cache_blocks:
            self._cache(req, min(total + new - draft, req.num_tokens, self._max_model_len))
        return KVCacheBlocks((tuple(fresh),)) if fresh else _EMPTY

    def _fits(self, num_new_blocks: int, hits: list[int]) -> bool:
        """Whether the new blocks and the hits fit; pinning a cached unreferenced hit takes a block (REQ-709)."""
        pool = self.pool
        pinned_cached = sum(1 for b in hits if pool.ref_count(b) == 0)
        return num_new_blocks + pinned_cached <= pool.num_available

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the blocks the first ``num_computed_tokens`` tokens fill wholly (REQ-711)."""
        req = self._request(request, "cache_blocks")
        count = as_int(num_computed_tokens, op="cache_blocks", arg="num_computed_tokens", rule="REQ-711")
        table = self._tables.get(req.request_id, [])
        if not 0 <= count <= min(req.num_tokens, len(table) * self._block_size):
            raise InvalidValueError(
                "REQ-711",
                f"cache_blocks: {count} tokens of request {req.request_id!r}, which has {req.num_tokens} tokens "
                f"and {len(table)} blocks",
            )
        if self.enable_caching:
            self._cache(req, count)

    def _cache(self, req: Request, num_tokens: int) -> None:
        rid = req.request_id
        start, end = self._num_cached[rid], num_tokens // self._block_size
        if end <= start:
            return
        hashes = req.block_hashes
        blocks = self._tables[rid][start:end]
        if self.enable_kv_cache_events:
            for i in range(start, end):
                self._ledger.remember(hashes[i], tuple(req.block_token_ids(i)), req.block_extra_keys(i))
        self.pool.register(blocks, hashes[start:end], parent_hash=hashes[start - 1] if start else None)
        self._num_cached[rid] = end

    # ------------------------------------------------------------------ free, preempt, reset

    def free(self, request: Request) -> None:
        """Release the request's blocks once each, tail first, and forget its table (REQ-713)."""
        rid = self._request(request, "free").request_id
        table = self._tables.pop(rid, None)
        self._num_cached.pop(rid, None)
        self._requests.pop(rid, None)
        if table:
            self._release(rid, table)

    def _release(self, request_id: str, table: list[int]) -> None:
        """Give the pool back a request's table, tail first (REQ-713, EVICT-402)."""
        self.pool.free(table[::-1], holder=request_id)

    def preempt(self, request: Request) -> None:
        """Free the request and mark it preempted: it recomputes from its first token on resume (REQ-714)."""
        self.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block and return True, or return False while any block is in use (REQ-715)."""
        if self.pool.num_in_use:
            return False
        if self.enable_caching:
            self.pool.reset()
        self._ledger.mark_reset()
        return True

    # ------------------------------------------------------------------ statistics, events

    def make_prefix_cache_stats(self) -> RequestPrefixStats | None:
        """The statistics since the last call, then new ones; None when off (REQ-716)."""
        return self._ledger.take_stats()

    def take_events(self) -> list[ManagerEvent]:
        """The events since the last call, oldest first; empty when events are off (REQ-717)."""
        if not self.enable_kv_cache_events:
            return []
        events = self.pool.take_events()
        return self._ledger.translate(events, self.pool.resident_hashes())

    # ------------------------------------------------------------------ tables

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's blocks in token order, one list per group (REQ-719)."""
        return (list(self._tables.get(request_id, ())),)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's blocks as :class:`KVCacheBlocks` (REQ-719)."""
        return KVCacheBlocks((tuple(self._tables.get(request_id, ())),))

    def get_unhashed_block_ids(self, blocks: KVCacheBlocks) -> list[int]:
        """The blocks of ``blocks`` not registered under any hash (REQ-719)."""
        return [b for group in blocks.blocks for b in group if self.pool.block_hash(b) is None]

    def block_hash(self, block_id: int) -> int | None:
        """The hash ``block_id`` is registered under, or None."""
        return self.pool.block_hash(block_id) if self.enable_caching else None

    def get_num_common_prefix_blocks(self, request_ids: Sequence[str], *, num_running: int | None = None) -> list[int]:
        """Leading blocks every named request holds at the same position, per group (REQ-718)."""
        tables = [self._tables.get(rid, []) for rid in request_ids]
        return [common_prefix_blocks(tables, self.pool.ref_count, num_running)]

    def num_cached_blocks(self, request_id: str) -> int:
        """How many leading blocks of the request's table are registered."""
        return self._num_cached.get(request_id, 0)

    def check_invariants(self) -> None:
        """Raise InvariantViolation naming the first broken part of REQ-721."""
        verify_tables(self.pool, self._tables, self._num_cached, self._requests, self._max_model_len)

    def snapshot(self) -> dict[str, Any]:
        """Tables, cached counts, statistics and the pool's own snapshot (or view), for ERR-501 checks."""
        pool = self.pool
        take = getattr(pool, "snapshot", None)
        pool_state = (
            take()
            if callable(take)
            else tuple(
                (pool.ref_count(b), pool.block_hash(b) if self.enable_caching else None) for b in range(pool.num_blocks)
            )
        )
        return {
            "tables": {rid: list(t) for rid, t in self._tables.items()},
            "num_cached": dict(self._num_cached),
            "ledger": self._ledger.snapshot(),
            "num_available": pool.num_available,
            "pool": pool_state,
        }

    def __repr__(self) -> str:
        return (
            f"RequestManager(block_size={self._block_size}, requests={len(self._tables)}, "
            f"usage={self.usage:.3f}, pool={self.pool!r})"
        )
