"""The offline reference curve of a sweep: Belady's MIN over block ids (TRACE-1017).

It replays a trace with the same rules as :func:`kvref.simulation.replay.replay` (longest cached prefix,
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

from kvref.contract.errors import InvalidValueError
from kvref.simulation.replay import ReplayResult, Tally, check_warmup
from kvref.simulation.traces import Trace

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


def belady_replay(
    trace: Trace, capacity: int, *, warmup: float = 0.0, first_counted: int | None = None
) -> ReplayResult:
    """Replay ``trace`` through an offline-optimal (MIN) cache of ``capacity`` blocks.

    ``first_counted`` replaces the warm-up's cut where a caller's trace is a subset of the one
    whose warm-up it follows (the serving replay's requests that were not rejected).
    """
    if type(capacity) is not int or capacity < 1:
        raise InvalidValueError("TRACE-1017", f"belady_replay: capacity must be a positive integer, got {capacity!r}")
    if first_counted is not None and (type(first_counted) is not int or not 0 <= first_counted <= len(trace.requests)):
        raise InvalidValueError("TRACE-1013", f"belady_replay: first_counted {first_counted!r} outside the trace")
    tally = Tally(trace, check_warmup(warmup, "belady_replay"), first_counted)
    next_uses = _next_uses(trace)
    first = tally.first_counted
    cached: dict[int, float] = {}  # block id -> its next use
    heap: list[tuple[float, int, int]] = []  # (-next use, -position, id); stale entries skipped
    counted_evictions = 0
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
            if index >= first:
                counted_evictions += 1
        for entry in deferred:
            heapq.heappush(heap, entry)
        if index >= first:
            tally.add(request, hit)
    seconds = time.perf_counter() - start
    peak = min(capacity, len({h for r in trace.requests for h in r.block_ids}))
    return tally.result(
        backend="offline", policy="belady", capacity=capacity, evictions=counted_evictions, peak=peak, seconds=seconds
    )
