"""The exact LRU hit-rate curve of a trace, every capacity in one pass (TRACE-1023).

Under ``lru`` (and ``lru-leaf``, which then evicts the same blocks) a replay of a prefix-tree trace
keeps the cache an LRU stack of one copy per hash: every request holds its whole chain and
releases it tail first, so a parent is always more recent than its children and the cache holds
the ``capacity`` hashes released last. A block is then cached at capacity ``c`` exactly when its
**stack distance** (how many distinct hashes were released since it was, itself included) is at
most ``c``, and a request's hit at ``c`` is the longest prefix of its chain whose distances are all
at most ``c`` (TRACE-1011). Mattson's stack algorithm gives every distance in one pass: a Fenwick
tree over release times counts the hashes released since a given time, O(log n) a block.

This holds while every request fits the cache (capacity at least the longest request, in blocks);
below that, TRACE-1015 caches a request only in part and the replay differs, so the curve starts
there (:attr:`HitRateCurve.smallest`). Each point equals ``kvref replay`` at that capacity under
``lru`` and ``lru-leaf`` (tests/test_curves.py checks 16 capacities per trace).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvref.contract.validate import prefix_tree_violation
from kvref.simulation.replay import check_warmup, warmup_cut
from kvref.simulation.traces import Trace, TraceError

__all__ = ["HitRateCurve", "lru_curve"]


@dataclass(frozen=True)
class HitRateCurve:
    """Block and token hits of the counted requests at every capacity from ``smallest`` to ``largest``.

    ``block_hits[c - smallest]`` and ``token_hits[c - smallest]`` are the hits at capacity ``c``;
    beyond ``largest`` (the trace's distinct blocks) nothing is ever evicted and the hits stay.
    """

    source: str
    block_size: int
    requests: int
    counted_requests: int
    blocks: int
    tokens: int
    smallest: int
    largest: int
    block_hits: tuple[int, ...]
    token_hits: tuple[int, ...]

    def at(self, capacity: int) -> tuple[int, int]:
        """``(block hits, token hits)`` at ``capacity`` blocks (at least :attr:`smallest`)."""
        if capacity < self.smallest:
            raise TraceError(
                "TRACE-1023",
                f"curve: capacity {capacity} is below the longest request ({self.smallest} blocks), "
                "where a request is cached only in part (TRACE-1015): replay that capacity instead",
            )
        i = min(capacity, self.largest) - self.smallest
        return self.block_hits[i], self.token_hits[i]

    def hit_rates(self, capacity: int) -> tuple[float, float]:
        """``(block hit rate, token hit rate)`` at ``capacity``."""
        blocks, tokens = self.at(capacity)
        return (blocks / self.blocks if self.blocks else 0.0, tokens / self.tokens if self.tokens else 0.0)


def lru_curve(trace: Trace, warmup: float = 0.0) -> HitRateCurve:
    """The exact hit-rate curve of ``trace`` under ``lru`` and ``lru-leaf`` (TRACE-1023), warm-up cut
    as a replay cuts it (TRACE-1013).

    Refuses (TraceError, TRACE-1006) a trace that is not a prefix tree: a block twice in one request,
    or after different blocks in two requests.
    """
    first = warmup_cut(check_warmup(warmup, "curve"), len(trace.requests))
    size = sum(len(r.block_ids) for r in trace.requests)
    fenwick = [0] * (size + 1)  # 1 at each hash's last release time
    released_at: dict[int, int] = {}
    parent_of: dict[int, int | None] = {}
    block_weight: dict[int, int] = {}  # stack distance -> counted blocks with it
    token_weight: dict[int, int] = {}
    clock = live = blocks = tokens = longest = 0
    for index, request in enumerate(trace.requests):
        ids, n = request.block_ids, len(request.block_ids)
        longest = max(longest, n)
        violation = prefix_tree_violation(ids, parent_of)
        if violation is not None:
            raise TraceError("TRACE-1006", f"curve: request {index}: {violation[1]}")
        if index >= first:
            blocks += n
            tokens += request.input_length
            farthest = 0
            for j, h in enumerate(ids):
                t = released_at.get(h)
                if t is None:
                    break  # never released: a miss at every capacity, and so is the rest of the chain
                below, k = 0, t - 1  # released at or before t - 1, from the Fenwick tree
                while k:
                    below += fenwick[k]
                    k &= k - 1
                farthest = max(farthest, live - below)  # the hit is a prefix: its farthest block decides
                weight = trace.block_size if j < n - 1 else request.input_length - (n - 1) * trace.block_size
                block_weight[farthest] = block_weight.get(farthest, 0) + 1
                token_weight[farthest] = token_weight.get(farthest, 0) + weight
        for h in reversed(ids):  # released tail first: the chain's root is the most recent
            t = released_at.get(h)
            if t is None:
                live += 1
            else:
                while t <= size:
                    fenwick[t] -= 1
                    t += t & -t
            clock += 1
            released_at[h] = t = clock
            while t <= size:
                fenwick[t] += 1
                t += t & -t
    largest = max(live, longest)
    block_hits, token_hits = _cumulative(block_weight, longest, largest), _cumulative(token_weight, longest, largest)
    return HitRateCurve(
        source=trace.source,
        block_size=trace.block_size,
        requests=len(trace.requests),
        counted_requests=len(trace.requests) - first,
        blocks=blocks,
        tokens=tokens,
        smallest=longest,
        largest=largest,
        block_hits=block_hits,
        token_hits=token_hits,
    )


def _cumulative(weights: dict[int, int], smallest: int, largest: int) -> tuple[int, ...]:
    """``sum(weights[d] for d <= c)`` for each capacity ``c`` from ``smallest`` to ``largest``."""
    below = sum(w for d, w in weights.items() if d <= smallest)
    out = [below]
    for c in range(smallest + 1, largest + 1):
        below += weights.get(c, 0)
        out.append(below)
    return tuple(out)
