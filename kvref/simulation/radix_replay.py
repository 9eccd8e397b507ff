"""Replay a trace through chapter 06's token-slot allocator and radix cache (TRACE-1021, TRACE-1022).

The hash-block replay (:mod:`kvref.simulation.replay`) asks how a vLLM-style prefix cache does on
a trace; this one asks the same of an SGLang-style radix cache, on the same requests, capacity
and warm-up, so that ``kvref replay --cache both`` puts the two side by side.

A block id stands for one page of one token slot: a request's key is its block ids, the
allocator has ``capacity`` slots in pages of one, and the tree's policy is one of chapter 06's
(``lru``, ``lfu``, ``fifo``, ``mru``, ``priority``). Each request goes as SGLang's scheduler drives
its cache: ``match`` the key, ``lock`` the hit, ``alloc`` the misses (evicting unlocked leaves
first when the free slots do not cover them; only as many as free plus evictable slots allow,
TRACE-1015), ``insert`` them, ``free`` the duplicate slots ``insert`` reports, ``unlock``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kvref.config.registry import load_backend
from kvref.contract.errors import InvalidValueError
from kvref.simulation.replay import ReplayResult, Tally, check_warmup, collector_paused
from kvref.simulation.traces import Trace

__all__ = ["RADIX_POLICIES", "radix_replay"]

#: The radix cache's eviction policies (RADIX-628), as ``kvref replay`` names them: ``radix-lru`` ...
RADIX_POLICIES = ("lru", "lfu", "fifo", "mru", "priority")


def radix_replay(
    trace: Trace,
    capacity: int,
    *,
    policy: str = "lru",
    warmup: float = 0.0,
    backend: str = "oracle",
    after_request: Callable[[Any], None] | None = None,
) -> ReplayResult:
    """Replay ``trace`` through a radix cache of ``capacity`` one-block pages under ``policy`` (TRACE-1021).

    Counts as the hash-block replay does (TRACE-1011..TRACE-1013, TRACE-1016); the result's
    policy is ``radix-<policy>`` and its backend ``<backend> (radix)``. The allocator and tree are
    ``backend``'s (``create_radix``, chapter 06: the oracle's, or a peer's such as SGLang's);
    ``after_request(tree)``, when given, is called after each request with KV events on, so that
    a caller can take the events the tree recorded for it.
    """
    if policy not in RADIX_POLICIES:
        raise InvalidValueError("TRACE-1021", f"radix_replay: policy must be one of {RADIX_POLICIES}, got {policy!r}")
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise InvalidValueError("TRACE-1021", f"radix_replay: capacity must be a positive int, got {capacity!r}")
    tally = Tally(trace, check_warmup(warmup, "radix_replay"))
    first = tally.first_counted
    chosen: Any = load_backend(backend)
    if "radix-cache" not in chosen.capabilities():
        raise InvalidValueError("TRACE-1021", f"radix_replay: backend {backend!r} offers no radix cache (radix-cache)")
    slots, tree = chosen.create_radix(capacity, policy=policy, enable_events=after_request is not None)
    peak = 0
    evicted = 0  # tokens evicted by the requests counted (the tree's evict() says how many it freed)
    with collector_paused():
        start = time.perf_counter()
        for index, request in enumerate(trace.requests):
            key = list(request.block_ids)
            hit = tree.match(key)
            lock = tree.lock(hit.node) if hit.node else None
            need = len(key) - hit.length
            room = min(need, slots.available_size() + tree.evictable_size())
            if room > slots.available_size():
                freed = tree.evict(room - slots.available_size())
                evicted += freed if index >= first else 0
            fresh = slots.alloc(room) or []
            row = hit.slots + fresh
            have = tree.insert(key[: hit.length + room], row)
            if have > hit.length:  # cached meanwhile: the tree keeps its own slots, ours go back (RADIX-623)
                slots.free(row[hit.length : have])
            peak = max(peak, capacity - slots.available_size())
            if lock is not None:
                tree.unlock(lock)
            if index >= first:
                tally.add(request, hit.length)
            if after_request is not None:
                after_request(tree)
        seconds = time.perf_counter() - start
    return tally.result(
        backend=f"{backend} (radix)",
        policy=f"radix-{policy}",
        capacity=capacity,
        evictions=evicted,
        peak=peak,
        seconds=seconds,
    )
