"""kvref's serving replay beside an engine's own scheduler on the same arrivals, request by request (TRACE-1051).

:func:`compare_with_engine` replays one workload at one capacity twice, through kvref's
:class:`~kvref.simulation.serving.ServingReplay` over the oracle's request manager and through the
engine's scheduler (:class:`~kvref.simulation.serving.vllm_scheduler.VllmSchedulerReplay`,
:class:`~kvref.simulation.serving.sglang_scheduler.SglangSchedulerReplay`), under one step model, and
holds the two side by side: for each request whether its cached tokens, preemptions and
first-token step are equal, and the aggregate token hit rates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvref.contract.errors import InvalidValueError
from kvref.contract.manager import FULL_ATTENTION, CacheGroup
from kvref.simulation.serving.model import StepModel
from kvref.simulation.serving.results import RequestRecord, ServingResult
from kvref.simulation.serving.workload import ServingWorkload

if TYPE_CHECKING:
    from kvref.simulation.serving.sglang_scheduler import SglangSchedulerReplay
    from kvref.simulation.serving.vllm_scheduler import VllmSchedulerReplay

__all__ = [
    "ENGINES",
    "Comparison",
    "RequestDifference",
    "compare_records",
    "compare_with_engine",
    "engine_replay",
    "kvref_replay",
]

#: How many differing requests a comparison keeps to show.
SHOWN_DIFFERENCES = 10


@dataclass(frozen=True)
class RequestDifference:
    """One request on which the two replays differ: each side's record, or None where it has none."""

    index: int
    kvref: RequestRecord | None
    engine: RequestRecord | None


@dataclass(frozen=True)
class Comparison:
    """Two replays of one workload, request by request (TRACE-1051).

    ``requests``: the requests either side finished; ``cached_equal``, ``preemptions_equal``,
    ``first_step_equal``: on how many of them the two agree on that field (a request one side
    has and the other has not agrees on none); ``exact``: on how many they agree on all three and
    on the first token's time. ``differences``: the first ten requests that are not exact.
    """

    kvref: ServingResult
    engine: ServingResult
    requests: int
    cached_equal: int
    preemptions_equal: int
    first_step_equal: int
    exact: int
    differences: tuple[RequestDifference, ...]

    @property
    def exact_share(self) -> float:
        """The share of requests exactly equal on both sides (0.0 when none was compared)."""
        return self.exact / self.requests if self.requests else 0.0

    @property
    def counts_equal(self) -> bool:
        """Whether every aggregate count and time of the two replays is equal (TRACE-1041's counts)."""
        return self.kvref.counts() == self.engine.counts()

    @property
    def agrees(self) -> bool:
        """Whether the two agree: some request compared, every one exact, every count equal (TRACE-1051)."""
        return self.requests > 0 and self.exact == self.requests and self.counts_equal

    @property
    def hit_rate_error_pp(self) -> float:
        """The aggregate token hit rates' difference, kvref's minus the engine's, in percentage points."""
        return 100 * (self.kvref.token_hit_rate - self.engine.token_hit_rate)


def compare_records(
    kvref: ServingResult,
    kvref_records: Sequence[RequestRecord],
    engine: ServingResult,
    engine_records: Sequence[RequestRecord],
) -> Comparison:
    """Hold two replays' records side by side, request by request (TRACE-1051)."""
    ours = {r.index: r for r in kvref_records}
    theirs = {r.index: r for r in engine_records}
    cached = preempted = first = exact = 0
    differences: list[RequestDifference] = []
    indices = sorted(ours.keys() | theirs.keys())
    for index in indices:
        a, b = ours.get(index), theirs.get(index)
        if a is not None and b is not None:
            cached += a.cached_tokens == b.cached_tokens
            preempted += a.preemptions == b.preemptions
            first += a.first_token_step == b.first_token_step
            if a == b:
                exact += 1
                continue
        if len(differences) < SHOWN_DIFFERENCES:
            differences.append(RequestDifference(index, a, b))
    return Comparison(kvref, engine, len(indices), cached, preempted, first, exact, tuple(differences))


def kvref_replay(
    workload: ServingWorkload,
    capacity: int,
    model: StepModel,
    *,
    prefix_caching: bool = True,
    groups: tuple[CacheGroup, ...] = (FULL_ATTENTION,),
    warmup: float = 0.0,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[ServingResult, tuple[RequestRecord, ...]]:
    """kvref's replay as vLLM's scheduler is configured: the oracle's pool under ``lru`` (vLLM's own
    eviction order), the manager with prefix caching on or off and ``groups`` over the one pool
    (TRACE-1030, TRACE-1051)."""
    from kvref.config.registry import create_pool
    from kvref.oracle.manager import RequestManager
    from kvref.simulation.serving.scheduler import ServingReplay

    pool = create_pool(capacity + 1, backend="oracle", policy="lru")
    manager = RequestManager(
        pool,
        block_size=workload.block_size,
        max_model_len=model.max_model_len,
        enable_caching=prefix_caching,
        groups=groups,
        max_in_flight_tokens=model.max_num_batched_tokens,  # one step in flight: vLLM's CPU build, no async
    )
    replay = ServingReplay(workload, manager, model, warmup=warmup, progress=progress)
    result = replay.run(backend="oracle", policy="lru" if prefix_caching else "none")
    return result, replay.records()


#: The engines whose own schedulers the serving replay drives (TRACE-1050, TRACE-1054).
ENGINES = ("vllm", "sglang")


def engine_replay(
    engine: str,
    workload: ServingWorkload,
    capacity: int,
    model: StepModel,
    *,
    prefix_caching: bool = True,
    groups: tuple[CacheGroup, ...] = (FULL_ATTENTION,),
    warmup: float = 0.0,
    progress: Callable[[int, int], None] | None = None,
    events: Path | None = None,
    snapshot: Path | None = None,
) -> VllmSchedulerReplay | SglangSchedulerReplay:
    """The replay of ``workload`` at ``capacity`` on ``engine``'s own scheduler (TRACE-1050, TRACE-1054).

    vLLM's takes KV cache groups beside full attention and records its event stream and final
    snapshot; SGLang's is driven with one full-attention tree and neither, and refuses them."""
    from kvref.simulation.serving.sglang_scheduler import SglangSchedulerReplay
    from kvref.simulation.serving.vllm_scheduler import VllmSchedulerReplay

    if engine == "vllm":
        return VllmSchedulerReplay(
            workload,
            capacity,
            model,
            prefix_caching=prefix_caching,
            groups=groups,
            warmup=warmup,
            progress=progress,
            events=events,
            snapshot=snapshot,
        )
    if engine != "sglang":
        raise InvalidValueError("TRACE-1050", f"engine must be one of {list(ENGINES)}, got {engine!r}")
    if groups != (FULL_ATTENTION,) or events is not None or snapshot is not None:
        raise InvalidValueError(
            "TRACE-1054",
            "SGLang's scheduler is driven with one full-attention radix tree: no window or mamba group, "
            "no event stream, no snapshot",
        )
    return SglangSchedulerReplay(
        workload, capacity, model, prefix_caching=prefix_caching, warmup=warmup, progress=progress
    )


def compare_with_engine(
    engine: str,
    workload: ServingWorkload,
    capacity: int,
    model: StepModel,
    *,
    prefix_caching: bool = True,
    groups: tuple[CacheGroup, ...] = (FULL_ATTENTION,),
    warmup: float = 0.0,
    progress: Callable[[int, int], None] | None = None,
    events: Path | None = None,
    snapshot: Path | None = None,
) -> Comparison:
    """Replay ``workload`` at ``capacity`` through kvref and through ``engine``'s own scheduler and compare
    them (TRACE-1051). ``progress(done, total)`` counts the requests of both replays; the other
    arguments are :func:`engine_replay`'s, which refuses what the engine cannot be asked before any replay."""
    replay = engine_replay(
        engine,
        workload,
        capacity,
        model,
        prefix_caching=prefix_caching,
        groups=groups,
        warmup=warmup,
        progress=progress,
        events=events,
        snapshot=snapshot,
    )
    ours, our_records = kvref_replay(
        workload, capacity, model, prefix_caching=prefix_caching, groups=groups, warmup=warmup, progress=progress
    )
    theirs = replay.run()
    return compare_records(ours, our_records, theirs, replay.records())
