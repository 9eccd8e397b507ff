"""The offline reference curve of a sweep: Belady's MIN over block ids (TRACE-1017).

It replays a trace with the same rules as :func:`kvref.replay.replay` (longest cached prefix,
the request's blocks held while it runs, at most ``capacity`` of them cached), but evicts the
cached block whose next use lies farthest in the future, knowing the whole trace. A block's
parent is next used no later than the block itself (every request using a block uses its
prefix), and ties go to the deepest block first, so the cached blocks stay prefix-closed and no
parent leaves before a child that is needed as soon. It is the usual offline reference curve;
it is not proven optimal for prefix hits, which an online policy may approach but rarely pass.
"""

from __future__ import annotations

import heapq
import math
import time

from kvref.errors import InvalidValueError
from kvref.replay import ReplayResult, infinite_capacity_hits, token_weights
from kvref.traces import Trace

__all__ = ["belady_replay"]

_NEVER = math.inf


def _next_uses(trace: Trace) -> list[list[float]]:
    """For each request and position, the index of the next request using that block id."""
    upcoming: dict[int, float] = {}
    out: list[list[float]] = [[] for _ in trace.requests]
    for index in range(len(trace.requests) - 1, -1, -1):
        ids = trace.requests[index].block_ids
        out[index] = [upcoming.get(h, _NEVER) for h in ids]
        for h in ids:
            upcoming[h] = index
    return out


def belady_replay(trace: Trace, capacity: int, *, warmup: float = 0.0) -> ReplayResult:
    """Replay ``trace`` through an offline-optimal (MIN) cache of ``capacity`` blocks."""
    if type(capacity) is not int or capacity < 1:
        raise InvalidValueError("TRACE-1017", f"belady_replay: capacity must be a positive integer, got {capacity!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, (int, float)) or not 0.0 <= warmup < 1.0:
        raise InvalidValueError("TRACE-1013", f"belady_replay: warmup must be a fraction in [0, 1), got {warmup!r}")
    next_uses = _next_uses(trace)
    first = math.floor(warmup * len(trace.requests))
    cached: dict[int, float] = {}  # block id -> its next use
    heap: list[tuple[float, int, int]] = []  # (-next use, -position, id); stale entries skipped
    blocks = block_hits = tokens = token_hits = evictions = counted_evictions = 0
    start = time.perf_counter()
    for index, request in enumerate(trace.requests):
        ids = request.block_ids
        hit = 0
        while hit < len(ids) and ids[hit] in cached:
            hit += 1
        held = ids[:capacity]
        for position, (h, nxt) in enumerate(zip(held, next_uses[index], strict=False)):
            cached[h] = nxt
            heapq.heappush(heap, (-nxt, -position, h))
        keep = set(held)
        deferred = []
        while len(cached) > capacity:
            entry = heapq.heappop(heap)
            neg, _, h = entry
            if cached.get(h) != -neg:
                continue  # stale entry
            if h in keep:
                deferred.append(entry)
                continue
            del cached[h]
            evictions += 1
            if index >= first:
                counted_evictions += 1
        for entry in deferred:
            heapq.heappush(heap, entry)
        if index >= first:
            blocks += len(ids)
            block_hits += hit
            tokens += request.input_length
            token_hits += sum(token_weights(request.input_length, len(ids), trace.block_size)[:hit])
    seconds = time.perf_counter() - start
    inf_blocks, inf_tokens = infinite_capacity_hits(trace, warmup)
    return ReplayResult(
        source=trace.source,
        backend="offline",
        policy="belady",
        capacity=capacity,
        block_size=trace.block_size,
        requests=len(trace.requests),
        counted_requests=len(trace.requests) - first,
        blocks=blocks,
        block_hits=block_hits,
        tokens=tokens,
        token_hits=token_hits,
        infinite_block_hits=inf_blocks,
        infinite_token_hits=inf_tokens,
        evictions=counted_evictions,
        peak_occupancy=min(capacity, len({h for r in trace.requests for h in r.block_ids})),
        seconds=seconds,
        block_references=trace.block_references,
    )
