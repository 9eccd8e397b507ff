"""Replay a trace through a prefix cache with exact semantics (spec chapter 10, TRACE-101x).

For each request in order: its hit is the longest cached prefix of its blocks (TRACE-1011); the
hit is pinned, the misses are allocated (evicting by the pool's policy, never the request's own
blocks) and registered, then everything is released tail first (TRACE-1014). The first
``floor(warmup * n)`` requests only warm the cache (TRACE-1013). Hits are counted per block and
per token (TRACE-1012), beside the hit rate of a cache that never evicts (TRACE-1016).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from kvref.contract.errors import InvalidValueError
from kvref.contract.protocol import ReplayedBatch
from kvref.simulation.traces import Trace, TraceRequest

__all__ = [
    "ReplayResult",
    "Tally",
    "check_warmup",
    "collector_paused",
    "hit_tokens",
    "infinite_capacity_hits",
    "replay",
    "replay_stepwise",
    "warmup_cut",
]


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
    mode: str = "stepwise"

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

    def counts(self) -> tuple[int, int, int, int]:
        """What every backend must agree on (TRACE-1018): block and token hits, evictions, peak."""
        return (self.block_hits, self.token_hits, self.evictions, self.peak_occupancy)

    def to_json(self) -> dict[str, Any]:
        """Every field and rate, for ``--json``."""
        out = asdict(self)
        for name in (
            "block_hit_rate",
            "token_hit_rate",
            "infinite_block_hit_rate",
            "infinite_token_hit_rate",
            "block_ops_per_second",
        ):
            out[name] = getattr(self, name)
        return out


def hit_tokens(input_length: int, blocks: int, hit: int, block_size: int) -> int:
    """Tokens the first ``hit`` of a request's ``blocks`` stand for (TRACE-1012).

    Each block weighs ``block_size`` tokens but the last, which weighs the rest of
    ``input_length``: a whole hit is the whole prompt.
    """
    return input_length if hit == blocks else hit * block_size


def infinite_capacity_hits(trace: Trace, warmup: float = 0.0) -> tuple[int, int]:
    """Block and token hits of the counted requests with a cache that never evicts (TRACE-1016)."""
    seen: set[int] = set()
    first = warmup_cut(warmup, len(trace.requests))
    block_hits = token_hits = 0
    for index, request in enumerate(trace.requests):
        ids = request.block_ids
        hit = 0
        while hit < len(ids) and ids[hit] in seen:
            hit += 1
        if index >= first:
            block_hits += hit
            token_hits += hit_tokens(request.input_length, len(ids), hit, trace.block_size)
        seen.update(ids)
    return block_hits, token_hits


def warmup_cut(warmup: float, requests: int) -> int:
    """Index of the first counted of ``requests`` requests when a ``warmup`` fraction only warms (TRACE-1013)."""
    return math.floor(warmup * requests)


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
    start: int | None = None  # the first counted request when given, else the warm-up's cut
    blocks: int = 0
    block_hits: int = 0
    tokens: int = 0
    token_hits: int = 0

    @property
    def first_counted(self) -> int:
        """Index of the first request counted (TRACE-1013), or ``start`` where the caller cut elsewhere."""
        return warmup_cut(self.warmup, len(self.trace.requests)) if self.start is None else self.start

    def add(self, request: TraceRequest, hit: int) -> None:
        """Count one request whose first ``hit`` blocks were cached (TRACE-1011, TRACE-1012)."""
        blocks = len(request.block_ids)
        self.blocks += blocks
        self.block_hits += hit
        self.tokens += request.input_length
        self.token_hits += hit_tokens(request.input_length, blocks, hit, self.trace.block_size)

    def result(
        self,
        *,
        backend: str,
        policy: str,
        capacity: int,
        evictions: int,
        peak: int,
        seconds: float,
        mode: str = "stepwise",
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
            mode=mode,
        )


def replay_stepwise(pool: Any, block_lists: Sequence[Sequence[int]], *, first_holder: int = 0) -> ReplayedBatch:
    """Replay ``block_lists`` through ``pool`` by protocol calls: what TRACE-1014 means.

    Request ``i`` is made by holder ``first_holder + i``: ``match`` its blocks, ``allocate`` the
    misses (as many as ``num_available`` allows, TRACE-1015), ``register`` them after the hit,
    note the occupancy, ``free`` everything tail first. Works on every :class:`PrefixCache`; a
    backend's fused ``replay_requests`` must give the same result and state (TRACE-1019).
    """
    hits: list[int] = []
    peak = 0
    capacity = pool.num_usable
    for index, ids in enumerate(block_lists, first_holder):
        hit = pool.match(ids, holder=index)
        need = len(ids) - len(hit)
        # num_available can cost a scan under lru-leaf; it is only needed when the free blocks
        # do not cover the request.
        room = need if need <= pool.num_free else min(need, pool.num_available)
        fresh = pool.allocate(room, holder=index)
        if fresh:
            parent = ids[len(hit) - 1] if hit else None
            pool.register(fresh, ids[len(hit) : len(hit) + room], parent_hash=parent)
        peak = max(peak, capacity - pool.num_free)
        pool.free((hit + fresh)[::-1], holder=index)
        hits.append(len(hit))
    return ReplayedBatch(hits, peak)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a timed replay, as :mod:`timeit` does.

    A replay makes no reference cycles; what a collection pass would cost is a scan of the
    millions of objects the pool and the trace keep alive, which is not replay time.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def replay(
    trace: Trace, pool: Any, *, warmup: float = 0.0, backend: str = "oracle", stepwise: bool = False
) -> ReplayResult:
    """Replay ``trace`` through ``pool`` (an empty :class:`~kvref.contract.protocol.PrefixCache`).

    A pool with the ``replay`` capability replays the warm-up and the counted requests in one
    ``replay_requests`` call each (TRACE-1019); others, or any pool with ``stepwise=True``, go
    through :func:`replay_stepwise`. Both count the same (TRACE-1018); only the speed differs.
    """
    tally = Tally(trace, check_warmup(warmup, "replay"))
    first = tally.first_counted
    lists = [request.block_ids for request in trace.requests]
    fused = not stepwise and "replay" in pool.capabilities()
    with collector_paused():
        start = time.perf_counter()
        if fused:
            warm = pool.replay_requests(lists[:first])
            evictions_at_start = pool.stats.evictions
            counted = pool.replay_requests(lists[first:])
        else:
            warm = replay_stepwise(pool, lists[:first])
            evictions_at_start = pool.stats.evictions
            counted = replay_stepwise(pool, lists[first:], first_holder=first)
        seconds = time.perf_counter() - start
    for request, hit in zip(trace.requests[first:], counted.hits, strict=True):
        tally.add(request, hit)
    return tally.result(
        backend=backend,
        policy=pool.policy.value,
        capacity=pool.num_usable,
        evictions=pool.stats.evictions - evictions_at_start,
        peak=max(warm.peak_occupied, counted.peak_occupied),
        seconds=seconds,
        mode="fused" if fused else "stepwise",
    )
