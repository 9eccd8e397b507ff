"""Generated workloads, seeded and self-contained: no trace file needed.

:func:`chat_sessions` is the built-in default workload of ``kvref replay``: groups of chats that
share a system prompt, each re-sending its whole growing conversation every turn. The other
workloads of the replay issue (agent loops, few-shot prompts, unique prompts) join it here.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from kvref.contract.hashing import DEFAULT_ALGORITHM
from kvref.simulation.traces import Trace, requests_from_tokens

__all__ = [
    "WORKLOADS",
    "agent_loops",
    "chat_sessions",
    "few_shot",
    "system_prompt_groups",
    "unique_prompts",
    "workload_trace",
]

VOCAB = 32_000


def _tokens(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(rng.randint(low, high))]


def chat_sessions(
    *, seed: int = 0, groups: int = 8, sessions: int = 6, turns: int = 5, block_size: int = 16
) -> list[list[int]]:
    """Token lists: ``groups`` system prompts, each shared by ``sessions`` chats of ``turns`` turns.

    Every turn re-sends the whole conversation so far, so its prefix is the previous turn's
    prompt plus that turn's reply; requests are interleaved across sessions as a server sees them.
    """
    rng = random.Random(seed)
    system = [[rng.randrange(VOCAB) for _ in range(rng.randint(4, 12) * block_size)] for _ in range(groups)]
    chats = []
    for g in range(groups):
        for _ in range(sessions):
            context = list(system[g])
            history = []
            for _ in range(turns):
                context += _tokens(rng, 8, 80)
                history.append(list(context))
                context += _tokens(rng, 16, 120)
            chats.append(history)
    order = [(c, t) for t in range(turns) for c in range(len(chats))]
    rng.shuffle(order)
    order.sort(key=lambda ct: ct[1])  # turn t of every chat before turn t+1 of any
    return [chats[c][t] for c, t in order]


def system_prompt_groups(
    *, seed: int = 0, groups: int = 6, requests: int = 240, block_size: int = 16
) -> list[list[int]]:
    """Single-turn requests, each opening with one of ``groups`` long system prompts."""
    rng = random.Random(seed)
    system = [_tokens(rng, 8 * block_size, 32 * block_size) for _ in range(groups)]
    return [[*system[rng.randrange(groups)], *_tokens(rng, 8, 200)] for _ in range(requests)]


def agent_loops(*, seed: int = 0, agents: int = 12, steps: int = 8, block_size: int = 16) -> list[list[int]]:
    """Agents sharing one tool-use preamble; each step re-sends the transcript plus a tool result.

    Steps of different agents interleave round-robin, as concurrent agents reach a server.
    """
    rng = random.Random(seed)
    preamble = _tokens(rng, 6 * block_size, 10 * block_size)
    transcripts = [[*preamble, *_tokens(rng, 10, 60)] for _ in range(agents)]
    out = []
    for _ in range(steps):
        for transcript in transcripts:
            out.append(list(transcript))
            transcript += _tokens(rng, 20, 90)  # the model's call and the tool's result
    return out


def few_shot(*, seed: int = 0, tasks: int = 4, questions: int = 40, block_size: int = 16) -> list[list[int]]:
    """Per task, one block of worked examples shared by every question asked under it."""
    rng = random.Random(seed)
    examples = [_tokens(rng, 12 * block_size, 24 * block_size) for _ in range(tasks)]
    prompts = [[*examples[rng.randrange(tasks)], *_tokens(rng, 8, 64)] for _ in range(questions * tasks)]
    return prompts


def unique_prompts(*, seed: int = 0, count: int = 200, block_size: int = 16) -> list[list[int]]:
    """Prompts with nothing in common."""
    rng = random.Random(seed)
    return [_tokens(rng, 2 * block_size, 20 * block_size) for _ in range(count)]


#: Generated workloads by name; each takes ``seed`` and ``block_size`` keywords.
WORKLOADS: dict[str, Callable[..., list[list[int]]]] = {
    "chat": chat_sessions,
    "system-prompt": system_prompt_groups,
    "agent": agent_loops,
    "few-shot": few_shot,
    "unique": unique_prompts,
}


def workload_trace(name: str, *, seed: int = 0, block_size: int = 16, algorithm: str = DEFAULT_ALGORITHM) -> Trace:
    """The generated workload ``name`` as a trace, its prompts hashed into chained block ids.

    Seeded, so the same on every machine (TRACE-1005); token lists hashed as a token-level trace
    line is (TRACE-1004), with ``algorithm``.
    """
    prompts = WORKLOADS[name](seed=seed, block_size=block_size)
    return requests_from_tokens(prompts, block_size, source=f"built-in {name} workload", algorithm=algorithm)
