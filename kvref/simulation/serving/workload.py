"""What a serving replay replays: requests with arrival times, prompts and outputs (TRACE-1031, TRACE-1038).

A request's prompt is known either by its tokens (the built-in workloads: output tokens then have
an identity, so a later turn that re-sends them can hit their blocks) or by the ids a trace gives
its blocks (Mooncake's ``hash_ids``, the Azure traces' synthetic prefixes): the prompt's full
blocks then take those ids as their hashes and the output tokens are the request's own, so output
blocks are cached but never hit (TRACE-1038).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvref.contract.errors import InvalidValueError
from kvref.contract.hashing import DEFAULT_ALGORITHM
from kvref.contract.requests import Request
from kvref.simulation.traces import Trace
from kvref.simulation.workloads import VOCAB, WORKLOADS

__all__ = [
    "OWN_OUTPUT_TOKEN_BASE",
    "SERVING_WORKLOADS",
    "ServedRequest",
    "ServingWorkload",
    "serving_workload",
    "workload_from_trace",
]

#: Output tokens of a request whose trace gives them no identity: ``OWN_OUTPUT_TOKEN_BASE + index``,
#: a token no prompt and no other request uses (TRACE-1038).
OWN_OUTPUT_TOKEN_BASE = 1 << 40
_OWN_BLOCK_BASE = (1 << 62) + 12345  # Belady's stand-in blocks, one per request, never shared


@dataclass(frozen=True, slots=True)
class ServedRequest:
    """One request of a serving replay.

    ``arrival_us``: arrival in microseconds from the trace's start. The prompt is
    ``prompt_tokens`` or, for a trace naming its blocks, ``prompt_length`` tokens whose blocks are
    ``block_ids`` (one per block, the last partial one included, as TRACE-1002). ``output_tokens``
    gives the output an identity; without it the request generates ``output_length`` tokens of
    its own (TRACE-1038).
    """

    arrival_us: int
    prompt_length: int
    output_length: int
    block_ids: tuple[int, ...] | None = None
    prompt_tokens: tuple[int, ...] | None = None
    output_tokens: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if (self.block_ids is None) == (self.prompt_tokens is None):
            raise InvalidValueError("TRACE-1038", "ServedRequest: give exactly one of block_ids and prompt_tokens")
        if self.prompt_length < 1 or self.output_length < 0 or self.arrival_us < 0:
            raise InvalidValueError(
                "TRACE-1031",
                f"ServedRequest: arrival {self.arrival_us} us, prompt {self.prompt_length} and output "
                f"{self.output_length} tokens must be >= 0 (the prompt >= 1)",
            )
        if self.prompt_tokens is not None and len(self.prompt_tokens) != self.prompt_length:
            raise InvalidValueError("TRACE-1038", "ServedRequest: prompt_length must be len(prompt_tokens)")
        if self.output_tokens is not None and len(self.output_tokens) != self.output_length:
            raise InvalidValueError("TRACE-1038", "ServedRequest: output_length must be len(output_tokens)")

    def make_request(self, index: int, block_size: int, algorithm: str) -> Request:
        """The chapter 07 request the manager sees (REQ-702), id ``r<index>``."""
        rid = f"r{index}"
        if self.block_ids is None:
            return Request(rid, list(self.prompt_tokens or ()), block_size=block_size, algorithm=algorithm)
        full = self.prompt_length // block_size
        return Request.from_block_hashes(
            rid, self.prompt_length, self.block_ids[:full], block_size=block_size, algorithm=algorithm
        )

    def output_token(self, index: int, position: int) -> int:
        """The output token at ``position`` (0 = the first sampled) of the request numbered ``index``."""
        if self.output_tokens is not None:
            return self.output_tokens[position]
        return OWN_OUTPUT_TOKEN_BASE + index

    def output_token_span(self, index: int, start: int, stop: int) -> list[int]:
        """The output tokens at positions ``start .. stop - 1`` of the request numbered ``index``:
        ``output_token`` of each, taken as one slice."""
        if self.output_tokens is not None:
            return list(self.output_tokens[start:stop])
        return [OWN_OUTPUT_TOKEN_BASE + index] * (stop - start)

    def max_computed_tokens(self) -> int:
        """The most tokens the request ever has computed: its prompt and every output token but the last."""
        return self.prompt_length + max(self.output_length - 1, 0)

    def fits(self, block_size: int, capacity: int, max_model_len: int, *, groups: int = 1) -> bool:
        """Whether the request could ever run in ``capacity`` blocks of ``block_size`` tokens shared by
        ``groups`` KV cache groups, each counted as holding a block per block of tokens, with its prompt
        and output (at least one token: an engine keeps room for the one it samples) within
        ``max_model_len`` (TRACE-1037)."""
        return (
            groups * -(-self.max_computed_tokens() // block_size) <= capacity
            and self.prompt_length + max(self.output_length, 1) <= max_model_len
        )


@dataclass(frozen=True)
class ServingWorkload:
    """Requests in arrival order, the block size their prompts are cut into, where they came from.

    ``outputs_hit``: whether output tokens have an identity (a later request may hit them);
    ``fixed_block_size``: whether the block size is the trace's own (Mooncake: 512) rather than
    a free choice; ``note``: what a report must say about how the workload was made.
    """

    requests: tuple[ServedRequest, ...]
    block_size: int
    source: str
    outputs_hit: bool
    fixed_block_size: bool
    algorithm: str = DEFAULT_ALGORITHM
    note: str = ""

    def __post_init__(self) -> None:
        size = self.block_size
        if type(size) is not int or size < 1:
            raise InvalidValueError("TRACE-1002", f"ServingWorkload: block_size must be an integer >= 1, got {size!r}")
        last = 0
        for index, r in enumerate(self.requests):
            if r.arrival_us < last:
                raise InvalidValueError(
                    "TRACE-1003", f"ServingWorkload: request {index} arrives at {r.arrival_us} us, before {last} us"
                )
            last = r.arrival_us
            if r.block_ids is not None and len(r.block_ids) != -(-r.prompt_length // size):
                raise InvalidValueError(
                    "TRACE-1002",
                    f"ServingWorkload: request {index} names {len(r.block_ids)} blocks for {r.prompt_length} "
                    f"tokens in blocks of {size}",
                )

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens over all requests."""
        return sum(r.prompt_length for r in self.requests)

    def block_trace(self) -> Trace:
        """The prompts as a trace of their block ids, for ``kvref replay`` (TRACE-1011): a workload that
        names its blocks (a Mooncake or Azure trace, TRACE-1038), arrivals in whole milliseconds."""
        from kvref.simulation.traces import TraceRequest

        named = [r for r in self.requests if r.block_ids is not None]
        if len(named) != len(self.requests):
            raise InvalidValueError("TRACE-1038", f"{self.source}: its prompts are tokens, not named blocks")
        requests = tuple(
            TraceRequest(r.arrival_us // 1000, r.prompt_length, r.output_length, r.block_ids or ()) for r in named
        )
        return Trace(requests, self.block_size, self.source)

    def prompt_trace(self) -> Trace:
        """The prompts as a trace of block ids, for Belady's offline reference (TRACE-1039).

        Each request keeps the blocks a hit can cover (the full blocks before its last prompt
        token, REQ-701) and one block of its own standing for the rest, which is never hit; so
        a hit of ``k`` blocks weighs ``k * block_size`` tokens, as the manager counts them.
        """
        from kvref.contract.hashing import ROOT_HASH, hash_block
        from kvref.simulation.traces import TraceRequest

        size = self.block_size
        out = []
        for index, r in enumerate(self.requests):
            hittable = (r.prompt_length - 1) // size
            if r.block_ids is not None:
                ids = list(r.block_ids[:hittable])
            else:
                tokens = r.prompt_tokens or ()
                ids = []
                parent = ROOT_HASH
                for k in range(hittable):
                    parent = hash_block(parent, tokens[k * size : (k + 1) * size], algorithm=self.algorithm)
                    ids.append(parent)
            ids.append(_OWN_BLOCK_BASE + index)
            out.append(TraceRequest(r.arrival_us // 1000, len(ids) * size, 0, tuple(ids)))
        return Trace(tuple(out), size, self.source)


def workload_from_trace(trace: Trace, *, algorithm: str = DEFAULT_ALGORITHM) -> ServingWorkload:
    """A JSON Lines trace (Mooncake's format) as a serving workload: named blocks, outputs of their own."""
    requests = tuple(
        ServedRequest(r.timestamp * 1000, r.input_length, r.output_length, block_ids=r.block_ids)
        for r in trace.requests
    )
    return ServingWorkload(
        requests,
        trace.block_size,
        trace.source,
        outputs_hit=False,
        fixed_block_size=True,
        algorithm=algorithm,
        note=(
            f"the trace names prompt blocks of {trace.block_size} tokens by id and gives output tokens no "
            "identity: output blocks are cached but never hit, and the block size is the trace's own (TRACE-1038)"
        ),
    )


def _tokens(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(rng.randint(low, high))]


def _serving_chat(
    *, seed: int, block_size: int, groups: int = 8, sessions: int = 6, turns: int = 5
) -> list[tuple[int, list[int], list[int]]]:
    """Chats sharing system prompts; turn t+1 re-sends turn t's prompt and its reply (the reply is turn t's output)."""
    rng = random.Random(seed)
    system = [[rng.randrange(VOCAB) for _ in range(rng.randint(4, 12) * block_size)] for _ in range(groups)]
    out = []
    for g in range(groups):
        for _ in range(sessions):
            start = rng.uniform(0.0, 60.0)  # seconds: chats open over a minute
            context = list(system[g])
            t = start
            for _ in range(turns):
                context += _tokens(rng, 8, 80)
                reply = _tokens(rng, 16, 120)
                out.append((round(t * 1e6), list(context), reply))
                context += reply
                t += rng.uniform(5.0, 30.0)  # the user reads and types
    out.sort(key=lambda item: item[0])
    return out


def serving_workload(
    name: str, *, seed: int = 0, block_size: int = 16, algorithm: str = DEFAULT_ALGORITHM, rate_per_s: float = 4.0
) -> ServingWorkload:
    """A built-in workload with arrival times and output tokens (TRACE-1005, TRACE-1038).

    ``chat``: 48 chats of 5 turns opening over a minute, a turn 5 to 30 s after the one before;
    each turn's output is the reply the next turn re-sends, so it can hit. The other workloads of
    :data:`kvref.simulation.workloads.WORKLOADS` arrive as a Poisson stream of ``rate_per_s``
    requests a second, each generating 16 to 128 tokens of its own.
    """
    if name not in SERVING_WORKLOADS:
        raise InvalidValueError("TRACE-1005", f"unknown workload {name!r}; known: {sorted(SERVING_WORKLOADS)}")
    if name == "chat":
        items = _serving_chat(seed=seed, block_size=block_size)
    else:
        if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, (int, float)) or not rate_per_s > 0:
            raise InvalidValueError("TRACE-1031", f"rate_per_s must be a number > 0, got {rate_per_s!r}")
        rng = random.Random(seed + 1)
        t = 0.0
        items = []
        for prompt in WORKLOADS[name](seed=seed, block_size=block_size):
            if prompt:
                items.append((round(t * 1e6), prompt, _tokens(rng, 16, 128)))
                t += rng.expovariate(rate_per_s)
    requests = tuple(
        ServedRequest(at, len(prompt), len(reply), prompt_tokens=tuple(prompt), output_tokens=tuple(reply))
        for at, prompt, reply in items
    )
    return ServingWorkload(
        requests,
        block_size,
        f"built-in {name} workload",
        outputs_hit=True,
        fixed_block_size=False,
        algorithm=algorithm,
        note="token-level: output tokens are the workload's own, so a later turn hits them once cached",
    )


#: Built-in workloads a serving replay knows (those of the sequential replay, with outputs and arrivals).
SERVING_WORKLOADS = ("chat", *[w for w in WORKLOADS if w != "chat"])
