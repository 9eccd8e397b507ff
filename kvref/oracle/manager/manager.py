"""The oracle request-level manager over any chapter 03 prefix cache (spec chapter 07).

:class:`RequestManager` does what vLLM's ``KVCacheManager`` does: it finds a request's cached
prefix, the longest every KV cache group serves (REQ-704, REQ-732), pins those hits and
allocates the rest when they fit (REQ-708, REQ-709), registers full blocks as they fill (REQ-710,
REQ-711), releases what a sliding window leaves behind (REQ-730), frees tail first (REQ-713) and
counts in tokens (REQ-716). Each group (``groups.py``) keeps its tables (vLLM's
``req_to_blocks``) and cached counts (``num_cached_block``); every group holds its blocks under
the request id in the one pool, or in a pool of its own (REQ-735). Every argument is checked before
anything changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvref.contract.errors import ConfigError, InvalidTypeError, InvalidValueError
from kvref.contract.events import AllBlocksCleared, KVEvent
from kvref.contract.manager import (
    FULL_ATTENTION,
    LAST_BLOCK_MODES,
    NULL_BLOCK,
    CacheGroup,
    KVCacheBlocks,
    ManagerEvent,
    RequestPrefixStats,
)
from kvref.contract.protocol import PrefixCache
from kvref.contract.requests import Request, RequestStatus
from kvref.contract.validate import as_count, as_int
from kvref.oracle.manager.checks import checked_hits, checked_setup
from kvref.oracle.manager.groups import GroupTables, longest_common_hit
from kvref.oracle.manager.ledger import ManagerLedger
from kvref.oracle.manager.tables import common_prefix_blocks, verify_tables

__all__ = ["RequestManager"]


def pool_view(pool: PrefixCache, caching: bool) -> Any:
    """The pool's own snapshot, or its references and hashes block by block, for ERR-501 comparisons."""
    take = getattr(pool, "snapshot", None)
    if callable(take):
        return take()
    return tuple((pool.ref_count(b), pool.block_hash(b) if caching else None) for b in range(pool.num_blocks))


class RequestManager:
    """vLLM's ``KVCacheManager`` over ``pool`` (chapter 07), for ``groups`` (one full-attention group by default).

    ``pool`` must be a chapter 03 prefix cache when ``enable_caching`` (with events on when
    ``enable_kv_cache_events``) and holds nothing yet; with a sliding-window group its block 0 is
    reserved, the null block (REQ-730). ``last_block`` chooses REQ-701's (``"recompute"``,
    vLLM) or REQ-705's (``"share"``, Megatron-Core) treatment of a prompt of whole blocks;
    ``use_eagle`` drops the last block of a hit (REQ-707); ``stats_at`` where requests are
    counted (REQ-716). ``max_in_flight_tokens``: the most tokens scheduled and not yet settled
    (vLLM's ``VllmConfig.max_in_flight_tokens``, a step's token budget for one engine), which caps
    what a sliding-window group reserves at a full-sequence admission (REQ-724); ``max_model_len``
    when not given.
    """

    def __init__(
        self,
        pool: PrefixCache | Sequence[PrefixCache],
        *,
        block_size: int,
        max_model_len: int,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = True,
        enable_kv_cache_events: bool = False,
        last_block: str = "recompute",
        stats_at: str = "admission",
        groups: Sequence[CacheGroup] = (FULL_ATTENTION,),
        max_in_flight_tokens: int | None = None,
    ) -> None:
        size = as_count(block_size, op="RequestManager", arg="block_size")
        limit = as_count(max_model_len, op="RequestManager", arg="max_model_len")
        if size == 0 or limit == 0:
            raise ConfigError("REQ-708", f"RequestManager: block_size {size} and max_model_len {limit} must be >= 1")
        in_flight = limit
        if max_in_flight_tokens is not None:
            in_flight = as_count(max_in_flight_tokens, op="RequestManager", arg="max_in_flight_tokens", rule="REQ-724")
            if in_flight == 0:
                raise ConfigError("REQ-724", "RequestManager: max_in_flight_tokens must be >= 1")
        if stats_at not in ("admission", "lookup"):
            raise ConfigError(
                "REQ-716",
                "RequestManager: stats_at must be 'admission' (vLLM 0.32) or 'lookup' (every get_computed_blocks)",
            )
        if last_block not in LAST_BLOCK_MODES:
            raise ConfigError("REQ-705", f"RequestManager: last_block must be one of {sorted(LAST_BLOCK_MODES)}")
        specs, pools = checked_setup(
            pool,
            groups,
            enable_caching=enable_caching,
            enable_kv_cache_events=enable_kv_cache_events,
            use_eagle=use_eagle,
            last_block=last_block,
        )
        #: The pool of group 0; :attr:`pools` holds every distinct pool, in group order (REQ-735).
        self.pool = pools[0]
        self.pools = tuple({id(p): p for p in pools}.values())
        self._block_size = size
        self._max_model_len = limit
        self.enable_caching = bool(enable_caching)
        self.use_eagle = bool(use_eagle)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.last_block = last_block
        self.stats_at = stats_at
        self.groups = [GroupTables(i, spec, p, size) for i, (spec, p) in enumerate(zip(specs, pools, strict=True))]
        #: Per group, the most blocks a full-sequence admission reserves (vLLM's
        #: ``max_admission_blocks_per_request``): a window's tokens and those in flight, plus one (REQ-724).
        self.admission_caps = [
            None if spec.sliding_window is None else -(-min(spec.sliding_window - 1 + in_flight, limit) // size) + 1
            for spec in specs
        ]
        self._empty = KVCacheBlocks.empty(len(specs))
        self._requests: dict[str, Request] = {}
        self._pool_events: list[KVEvent] = []  # over several pools: their events in call order (REQ-735)
        self._ledger = ManagerLedger(log_stats=log_stats, block_size=size)
        if self.enable_kv_cache_events:
            for each in self.pools:
                each.take_events()  # what happened before the manager is not its to report

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
        """Free plus cached unreferenced blocks: what allocations could take now, summed over the pools (REQ-735)."""
        return sum(p.num_available for p in self.pools)

    @property
    def usage(self) -> float:
        """``1 - num_available / num_usable``, each summed over the pools (REQ-723, REQ-735)."""
        usable = sum(p.num_usable for p in self.pools)
        return 1.0 - self.num_free_blocks / usable if usable else 0.0

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
        """The request's longest cached prefix every group serves, and the tokens it covers (REQ-701,
        REQ-704..REQ-707, REQ-731, REQ-732).

        Pins nothing and changes nothing; with ``stats_at="lookup"`` counts the request in the
        statistics (REQ-706, REQ-716).
        """
        req = self._request(request, "get_computed_blocks")
        if not self.enable_caching or req.skip_reading_prefix_cache:
            return self._empty, 0
        n = req.num_tokens
        hits = longest_common_hit(self.groups, req, self._hit_bound(n))
        length = len(hits[0])
        if self.use_eagle and length:
            hits = [h[:-1] for h in hits]
            length -= 1
        computed = min(length * self._block_size, n - 1)
        if self.stats_at == "lookup":
            self._ledger.record(num_tokens=n, num_hits=computed, preempted=req.num_preemptions > 0)
        return (KVCacheBlocks(tuple(tuple(h) for h in hits)) if length else self._empty), computed

    def new_step_starts(self) -> None:
        """A scheduler step begins (vLLM's ``new_step_starts``): what mamba groups cached before it
        may now be hits that ``allocate_slots`` takes (REQ-759)."""
        for g in self.groups:
            g.cached_this_step.clear()

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
        new, new_computed, lookahead = num_new_tokens, num_new_computed_tokens, num_lookahead_tokens
        external, draft = num_external_computed_tokens, num_draft_tokens
        plain = type(new) is int and type(new_computed) is int and type(lookahead) is int
        if not (
            plain
            and type(external) is int
            and type(draft) is int
            and min(new, new_computed, lookahead, external, draft) >= 0
        ):
            new = as_count(num_new_tokens, op=op, arg="num_new_tokens", rule="REQ-712")
            new_computed = as_count(num_new_computed_tokens, op=op, arg="num_new_computed_tokens", rule="REQ-712")
            lookahead = as_count(num_lookahead_tokens, op=op, arg="num_lookahead_tokens", rule="REQ-712")
            external = as_count(num_external_computed_tokens, op=op, arg="num_external_computed_tokens", rule="REQ-712")
            draft = as_count(num_draft_tokens, op=op, arg="num_draft_tokens", rule="REQ-712")
        if new == 0 and new_computed == 0 and external == 0:
            raise InvalidValueError(
                "REQ-712", f"{op}: num_new_tokens must be > 0 when there are no computed tokens to adopt"
            )
        if draft > new:
            raise InvalidValueError("REQ-712", f"{op}: {draft} draft tokens among only {new} new tokens")
        rid = req.request_id
        groups = self.groups
        table = groups[0].tables.get(rid)  # every group adopts a request in the same call
        hits = checked_hits(
            req,
            new_computed_blocks,
            new_computed,
            groups=groups,
            holds=bool(table),
            bound=self._hit_bound(req.num_tokens),
            op=op,
        )
        if table and external:
            raise InvalidValueError(
                "REQ-712",
                f"{op}: request {rid!r} already holds blocks; external computed tokens join only at admission",
            )
        size = self._block_size
        computed = req.num_computed_tokens
        covered = len(table) if table is not None else 0
        if computed > covered * size:
            raise InvalidValueError(
                "REQ-712", f"{op}: request {rid!r} says {computed} tokens are computed, its {covered} blocks hold fewer"
            )
        total = min(computed + new_computed + external, self._max_model_len)
        for g in groups:  # before the fit check: these blocks are garbage whatever follows (REQ-730)
            g.release_skipped(rid, total)
        required = -(-min(total + new + lookahead, self._max_model_len) // size)
        if full_sequence_must_fit:
            whole = -(-min(req.num_tokens, self._max_model_len) // size)
            if not self._fits(rid, whole, hits, total, capped=True):
                self._drain()
                return None
        if not self._fits(rid, required, hits, total):
            self._drain()
            return None
        if table is None:
            for g, group_hits in zip(groups, hits, strict=True):
                g.adopt(rid, group_hits, total)
            if external:  # the connector's tokens: in the table, not returned (REQ-708)
                for g in groups:
                    g.extend(rid, -(-total // size))
            self._requests[rid] = req
        fresh = [g.extend(rid, required) for g in groups]
        if self.enable_caching and not delay_cache_blocks:
            self._cache(req, min(total + new - draft, req.num_tokens, self._max_model_len))
        self._drain()
        return KVCacheBlocks(tuple(tuple(f) for f in fresh)) if any(fresh) else self._empty

    def _fits(self, rid: str, required: int, hits: list[list[int]], num_computed: int, *, capped: bool = False) -> bool:
        """Whether every group's new blocks and the cached hits it pins fit, pool by pool, in the available
        blocks of the pool it draws from (REQ-709, REQ-734, REQ-735); ``capped``: a group with an
        admission cap counts at most that many blocks as required (REQ-724)."""
        need: dict[int, int] = {}
        for g, h, cap in zip(self.groups, hits, self.admission_caps, strict=True):
            wanted = required if cap is None or not capped else min(required, cap)
            need[id(g.pool)] = need.get(id(g.pool), 0) + g.blocks_to_take(rid, wanted, h, num_computed)
        return all(need.get(id(p), 0) <= p.num_available for p in self.pools)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the blocks the first ``num_computed_tokens`` tokens fill wholly (REQ-711)."""
        req = self._request(request, "cache_blocks")
        count = as_int(num_computed_tokens, op="cache_blocks", arg="num_computed_tokens", rule="REQ-711")
        held = min(len(g.tables.get(req.request_id, ())) for g in self.groups)
        if not 0 <= count <= min(req.num_tokens, held * self._block_size):
            raise InvalidValueError(
                "REQ-711",
                f"cache_blocks: {count} tokens of request {req.request_id!r}, which has {req.num_tokens} tokens "
                f"and {held} blocks",
            )
        if self.enable_caching:
            self._cache(req, count)
            self._drain()

    def _cache(self, req: Request, num_tokens: int) -> None:
        for g in self.groups:
            done = g.cache(req, num_tokens)
            if self.enable_kv_cache_events:
                for i, key in done:
                    self._ledger.remember(key, tuple(req.block_token_ids(i)), req.block_extra_keys(i), g.index)

    # ------------------------------------------------------------------ free, preempt, reset

    def free(self, request: Request) -> None:
        """Release the request's blocks once each, tail first, group by group, and forget its tables (REQ-713)."""
        rid = self._request(request, "free").request_id
        self._requests.pop(rid, None)
        for g in self.groups:
            g.free(rid)
        self._drain()

    def preempt(self, request: Request) -> None:
        """Free the request and mark it preempted: it recomputes from its first token on resume (REQ-714)."""
        self.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block and return True, or return False while any block is in use (REQ-715)."""
        if any(p.num_in_use for p in self.pools):
            return False
        if self.enable_caching:
            self._drain()
            for p in self.pools:
                p.reset()
            if len(self.pools) > 1 and self.enable_kv_cache_events:  # one reset, one AllBlocksCleared (REQ-735)
                for p in self.pools:
                    p.take_events()
                self._pool_events.append(AllBlocksCleared())
        self._ledger.mark_reset()
        return True

    # ------------------------------------------------------------------ read-only calls

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

    # ------------------------------------------------------------------ statistics, events

    def make_prefix_cache_stats(self) -> RequestPrefixStats | None:
        """The statistics since the last call, then new ones; None when off (REQ-716)."""
        return self._ledger.take_stats()

    def take_events(self) -> list[ManagerEvent]:
        """The events since the last call, oldest first; empty when events are off (REQ-717)."""
        if not self.enable_kv_cache_events:
            return []
        if len(self.pools) == 1:
            return self._ledger.translate(self.pool.take_events(), self.pool.resident_hashes())
        self._drain()
        events, self._pool_events = self._pool_events, []
        return self._ledger.translate(events, frozenset().union(*(p.resident_hashes() for p in self.pools)))

    def _drain(self) -> None:
        """Over several pools, move each pool's events to the manager's list after every call that
        changes a pool, so that they stay in call order (REQ-717, REQ-735); one pool keeps its own."""
        if len(self.pools) > 1 and self.enable_kv_cache_events:
            for p in self.pools:
                self._pool_events.extend(p.take_events())

    def __repr__(self) -> str:
        return (
            f"RequestManager(block_size={self._block_size}, requests={len(self._requests)}, groups={len(self.groups)}, "
            f"usage={self.usage:.3f}, pools={list(self.pools)!r})"
        )
