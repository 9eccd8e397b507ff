"""Replay a trace through a prefix cache with exact semantics (spec chapter 10, TRACE-101x).

For each request in order: its hit is the longest cached prefix of its blocks (TRACE-1011); the
hit is pinned, the misses are allocated (evicting by the pool's policy, never the request's own
blocks) and registered, then everything is released tail first (TRACE-1014). The first
``floor(warmup * n)`` requests only warm the cache (TRACE-1013). Hits are counted per block and
per token (TRACE-1012), beside the hit rate of a cache that never evicts (TRACE-1016).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from kvref.errors import InvalidValueError
from kvref.traces import Trace, TraceRequest

__all__ = ["ReplayResult", "Tally", "check_warmup", "infinite_capacity_hits", "replay", "token_weights"]


@dataclass(frozen=True)
class ReplayResult:
    """What one replay measured; rates are over the counted (post-warm-up) requests."""

    source: str
    backend: str
    policy: str
    capacity: int
    block_size: int
    requests: int
    counted_requests: int
    blocks: int
    block_hits: int
    tokens: int
    token_hits: int
    infinite_block_hits: int
    infinite_token_hits: int
    evictions: int
    peak_occupancy: int
    seconds: float
    block_references: int

    @property
    def block_hit_rate(self) -> float:
        return self.block_hits / self.blocks if self.blocks else 0.0

    @property
    def token_hit_rate(self) -> float:
        return self.token_hits / self.tokens if self.tokens else 0.0

    @property
    def infinite_block_hit_rate(self) -> float:
        return self.infinite_block_hits / self.blocks if self.blocks else 0.0

    @property
    def infinite_token_hit_rate(self) -> float:
        return self.infinite_token_hits / self.tokens if self.tokens else 0.0

    @property
    def block_ops_per_second(self) -> float:
        """Block references replayed per second (lookup, hold, register, release each)."""
        return self.block_references / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        """Every field and rate, for ``--json``."""
        out = asdict(self)
        for name in (
            "block_hit_rate", "token_hit_rate", "infinite_block_hit_rate", "infinite_token_hit_rate",
            "block_ops_per_second",
        ):  # fmt: skip
            out[name] = getattr(self, name)
        return out


def token_weights(input_length: int, blocks: int, block_size: int) -> list[int]:
    """Tokens each block of a request stands for: ``block_size``, the last the rest (TRACE-1012)."""
    weights = [block_size] * blocks
    if blocks:
        weights[-1] = input_length - block_size * (blocks - 1)
    return weights


def infinite_capacity_hits(trace: Trace, warmup: float = 0.0) -> tuple[int, int]:
    """Block and token hits of the counted requests with a cache that never evicts (TRACE-1016)."""
    seen: set[int] = set()
    first = math.floor(warmup * len(trace.requests))
    block_hits = token_hits = 0
    for index, request in enumerate(trace.requests):
        ids = request.block_ids
        hit = 0
        while hit < len(ids) and ids[hit] in seen:
            hit += 1
        if index >= first:
            block_hits += hit
            token_hits += sum(token_weights(request.input_length, len(ids), trace.block_size)[:hit])
        seen.update(ids)
    return block_hits, token_hits


def check_warmup(warmup: object, op: str) -> float:
    """``warmup`` as a fraction in [0, 1), or InvalidValueError (TRACE-1013)."""
    if isinstance(warmup, bool) or not isinstance(warmup, (int, float)) or not 0.0 <= warmup < 1.0:
        raise InvalidValueError("TRACE-1013", f"{op}: warmup must be a fraction in [0, 1), got {warmup!r}")
    return float(warmup)


@dataclass
class Tally:
    """The counts of one replay over its counted requests, and the result they make."""

    trace: Trace
    warmup: float
    blocks: int = 0
    block_hits: int = 0
    tokens: int = 0
    token_hits: int = 0

    @property
    def first_counted(self) -> int:
        """Index of the first request counted (TRACE-1013)."""
        return math.floor(self.warmup * len(self.trace.requests))

    def add(self, request: TraceRequest, hit: int) -> None:
        """Count one request whose first ``hit`` blocks were cached (TRACE-1011, TRACE-1012)."""
        weights = token_weights(request.input_length, len(request.block_ids), self.trace.block_size)
        self.blocks += len(request.block_ids)
        self.block_hits += hit
        self.tokens += request.input_length
        self.token_hits += sum(weights[:hit])

    def result(
        self, *, backend: str, policy: str, capacity: int, evictions: int, peak: int, seconds: float
    ) -> ReplayResult:
        """The ReplayResult of these counts, with the infinite-capacity hits beside them."""
        inf_blocks, inf_tokens = infinite_capacity_hits(self.trace, self.warmup)
        return ReplayResult(
            source=self.trace.source,
            backend=backend,
            policy=policy,
            capacity=capacity,
            block_size=self.trace.block_size,
            requests=len(self.trace.requests),
            counted_requests=len(self.trace.requests) - self.first_counted,
            blocks=self.blocks,
            block_hits=self.block_hits,
            tokens=self.tokens,
            token_hits=self.token_hits,
            infinite_block_hits=inf_blocks,
            infinite_token_hits=inf_tokens,
            evictions=evictions,
            peak_occupancy=peak,
            seconds=seconds,
            block_references=self.trace.block_references,
        )


def replay(trace: Trace, pool: Any, *, warmup: float = 0.0, backend: str = "oracle") -> ReplayResult:
    """Replay ``trace`` through ``pool`` (an empty :class:`~kvref.protocol.PrefixCache`)."""
    tally = Tally(trace, check_warmup(warmup, "replay"))
    capacity = pool.num_usable
    first = tally.first_counted
    peak = evictions_at_start = 0
    start = time.perf_counter()
    for index, request in enumerate(trace.requests):
        if index == first:
            evictions_at_start = pool.stats.evictions
        ids = request.block_ids
        hit = pool.match(ids, holder=index)
        need = len(ids) - len(hit)
        # TRACE-1015: beyond capacity, not cached. num_available can cost a scan under lru-leaf;
        # it is only needed when the free blocks do not cover the request.
        room = need if need <= pool.num_free else min(need, pool.num_available)
        fresh = pool.allocate(room, holder=index)
        if fresh:
            parent = ids[len(hit) - 1] if hit else None
            pool.register(fresh, ids[len(hit) : len(hit) + room], parent_hash=parent)
        peak = max(peak, capacity - pool.num_free)
        pool.free((hit + fresh)[::-1], holder=index)
        if index >= first:
            tally.add(request, len(hit))
    seconds = time.perf_counter() - start
    return tally.result(
        backend=backend,
        policy=pool.policy.value,
        capacity=capacity,
        evictions=pool.stats.evictions - evictions_at_start,
        peak=peak,
        seconds=seconds,
    )
