"""Generated workloads, seeded and self-contained: no trace file needed.

:func:`chat_sessions` is the built-in default workload of ``kvref replay``: groups of chats that
share a system prompt, each re-sending its whole growing conversation every turn. The other
workloads of the replay issue (agent loops, few-shot prompts, unique prompts) join it here.
"""

from __future__ import annotations

import random

__all__ = ["chat_sessions"]


def chat_sessions(
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
