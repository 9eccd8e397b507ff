"""The built-in demo workload: shared system prompts and multi-turn chats through a prefix cache.

Seeded and self-contained (no trace file needed). Each request is hashed with
:mod:`kvref.hashing`, matched against the cache, given blocks for its misses, registers its full
blocks and releases everything tail first (EVICT-402), as an engine's scheduler would. The trace
replay of the workload issue supersedes this as kvref's main job.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from kvref.hashing import BlockHasher

__all__ = ["DemoResult", "demo_requests", "run_demo"]


def demo_requests(
    *, seed: int = 0, groups: int = 8, sessions: int = 6, turns: int = 5, block_size: int = 16
) -> list[list[int]]:
    """Token lists: ``groups`` system prompts, each shared by ``sessions`` chats of ``turns`` turns.

    Every turn re-sends the whole conversation so far, so its prefix is the previous turn's
    prompt plus that turn's reply; requests are interleaved across sessions as a server sees them.
    """
    rng = random.Random(seed)
    vocab = 32_000
    system = [[rng.randrange(vocab) for _ in range(rng.randint(4, 12) * block_size)] for _ in range(groups)]
    chats = []
    for g in range(groups):
        for _ in range(sessions):
            context = list(system[g])
            history = []
            for _ in range(turns):
                context += [rng.randrange(vocab) for _ in range(rng.randint(8, 80))]
                history.append(list(context))
                context += [rng.randrange(vocab) for _ in range(rng.randint(16, 120))]
            chats.append(history)
    order = [(c, t) for t in range(turns) for c in range(len(chats))]
    rng.shuffle(order)
    order.sort(key=lambda ct: ct[1])  # turn t of every chat before turn t+1 of any
    return [chats[c][t] for c, t in order]


@dataclass(frozen=True)
class DemoResult:
    """What one run of the demo measured."""

    policy: str
    capacity: int
    requests: int
    blocks: int
    hits: int
    evictions: int
    seconds: float

    @property
    def hit_rate(self) -> float:
        """Blocks served from the cache over full blocks asked for."""
        return self.hits / self.blocks if self.blocks else 0.0

    @property
    def block_ops_per_second(self) -> float:
        """Block references handled per second (lookup, allocate, register, free)."""
        return self.blocks / self.seconds if self.seconds else 0.0


def run_demo(pool: Any, requests: list[list[int]], *, block_size: int, hash_algorithm: str) -> DemoResult:
    """Replay ``requests`` through ``pool`` (a :class:`~kvref.protocol.PrefixCache`)."""
    hashed = []
    for tokens in requests:
        hasher = BlockHasher(block_size, algorithm=hash_algorithm)
        hashed.append(hasher.extend(tokens))
    blocks = hits = 0
    start = time.perf_counter()
    for i, hashes in enumerate(hashed):
        holder = i
        hit = pool.match(hashes, holder=holder)
        fresh = pool.allocate(len(hashes) - len(hit), holder=holder)
        parent = hashes[len(hit) - 1] if hit else None
        pool.register(fresh, hashes[len(hit) :], parent_hash=parent)
        pool.free((hit + fresh)[::-1], holder=holder)
        blocks += len(hashes)
        hits += len(hit)
    seconds = time.perf_counter() - start
    return DemoResult(
        policy=pool.policy.value,
        capacity=pool.num_usable,
        requests=len(hashed),
        blocks=blocks,
        hits=hits,
        evictions=pool.stats.evictions,
        seconds=seconds,
    )
