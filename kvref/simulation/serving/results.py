"""What a serving replay measured (TRACE-1039): hits, latencies by percentile, preemptions, blocks in use."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from kvref.simulation.serving.tiers import TierReport

if TYPE_CHECKING:
    from kvref.simulation.serving.workload import ServingWorkload

__all__ = [
    "PERCENTILES",
    "Percentiles",
    "RequestRecord",
    "ServingResult",
    "nearest_rank",
    "thin_timeline",
    "engine_result",
]

#: The percentiles every latency is reported at.
PERCENTILES = (50, 90, 99)


def nearest_rank(values: Sequence[float], percentile: float) -> float:
    """The nearest-rank percentile of ``values`` (0.0 when empty): the smallest value with at least
    ``percentile`` % of the values at or below it (TRACE-1039)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(percentile / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Percentiles:
    """p50, p90 and p99 of one latency in milliseconds."""

    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        """The nearest-rank percentiles of ``values``."""
        ordered = sorted(values)
        return cls(*(nearest_rank(ordered, p) for p in PERCENTILES))


@dataclass(frozen=True)
class RequestRecord:
    """What one request met in a serving replay, for comparing two replays request by request (TRACE-1050).

    ``index``: the request's place in the workload. ``cached_tokens``: prompt tokens hit at its first
    admission (TRACE-1039). ``preemptions``: how often it was preempted (TRACE-1035).
    ``first_token_step``: the step, counted from 1 over the whole replay, that sampled its first
    token (or ended its prefill, for a request with no output); ``first_token_us``: that step's end
    on the step model's clock. A rejected request has no record (TRACE-1037).
    """

    index: int
    cached_tokens: int
    preemptions: int
    first_token_step: int
    first_token_us: int


def thin_timeline(points: Sequence[tuple[int, int]], most: int = 2000) -> list[tuple[float, int]]:
    """At most about ``most`` (ms, blocks) points of a step-by-step timeline, each bucket's peak kept."""
    if len(points) <= most:
        return [(t / 1000, b) for t, b in points]
    per = math.ceil(len(points) / most)
    out = []
    for start in range(0, len(points), per):
        bucket = points[start : start + per]
        t, b = max(bucket, key=lambda p: p[1])
        out.append((t / 1000, b))
    return out


@dataclass(frozen=True)
class ServingResult:
    """One serving replay of a workload at one capacity and policy (TRACE-1039).

    Hit counts are over the counted requests (after the warm-up, not rejected) at their first
    admission; ``prefill_tokens_saved`` sums the hits of every admission, re-admissions after a
    preemption included, and ``prefill_tokens_computed`` every prompt (and recomputed) token run.
    Times are in milliseconds of the step model's clock; ``seconds`` is the replay's own wall time.
    """

    source: str
    backend: str
    policy: str
    capacity: int
    block_size: int
    preemption: str
    requests: int
    counted_requests: int
    rejected: int
    blocks: int
    block_hits: int
    tokens: int
    token_hits: int
    prefill_tokens_computed: int
    prefill_tokens_saved: int
    preemptions: int
    evictions: int
    ttft_ms: Percentiles
    queue_ms: Percentiles
    peak_blocks_in_use: int
    mean_blocks_in_use: float
    makespan_ms: float
    steps: int
    seconds: float
    outputs_hit: bool
    belady_token_hits: int | None = None
    belady_block_hits: int | None = None
    #: the tiers below the device pool, where the replay had any (TIER-1129)
    tiers: TierReport | None = None
    timeline: list[tuple[float, int]] = field(default_factory=list, compare=False)

    @property
    def block_hit_rate(self) -> float:
        """Prompt blocks hit over prompt blocks, counted requests."""
        return self.block_hits / self.blocks if self.blocks else 0.0

    @property
    def token_hit_rate(self) -> float:
        """Prompt tokens hit over prompt tokens, counted requests."""
        return self.token_hits / self.tokens if self.tokens else 0.0

    @property
    def belady_token_hit_rate(self) -> float | None:
        """Belady's offline token hit rate at the same capacity, where defined (TRACE-1039)."""
        return None if self.belady_token_hits is None or not self.tokens else self.belady_token_hits / self.tokens

    def counts(self) -> tuple[Any, ...]:
        """What two runs of the same replay must agree on (TRACE-1040, TRACE-1041): every count and time."""
        return (
            self.requests,
            self.counted_requests,
            self.rejected,
            self.blocks,
            self.block_hits,
            self.tokens,
            self.token_hits,
            self.prefill_tokens_computed,
            self.prefill_tokens_saved,
            self.preemptions,
            self.evictions,
            self.ttft_ms,
            self.queue_ms,
            self.peak_blocks_in_use,
            self.mean_blocks_in_use,
            self.makespan_ms,
            self.steps,
        )

    def to_json(self) -> dict[str, Any]:
        """Every field and rate, for ``--json`` and sweep files."""
        out = asdict(self)
        out["block_hit_rate"] = self.block_hit_rate
        out["token_hit_rate"] = self.token_hit_rate
        out["belady_token_hit_rate"] = self.belady_token_hit_rate
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServingResult:
        """The result ``to_json`` wrote (sweep files are read back by a rerun, TRACE-1043)."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["ttft_ms"] = Percentiles(**fields["ttft_ms"])
        fields["queue_ms"] = Percentiles(**fields["queue_ms"])
        fields["timeline"] = [tuple(p) for p in fields.get("timeline", [])]
        if fields.get("tiers") is not None:
            fields["tiers"] = TierReport.from_json(fields["tiers"])
        return cls(**fields)


def engine_result(
    workload: ServingWorkload,
    records: Sequence[RequestRecord],
    tally: dict[str, int],
    *,
    capacity: int,
    backend: str,
    policy: str,
    first_counted: int,
    timeline: list[tuple[int, int]],
    admitted: dict[int, int],
    seconds: float,
) -> ServingResult:
    """The result of a replay on an engine's own scheduler (TRACE-1039, TRACE-1050, TRACE-1054): hits and
    latencies from each finished request's ``records`` (the counted ones: index ``first_counted`` on),
    the step counts from ``tally`` (``steps``, ``now``, ``rejected``, ``peak``, ``in_use_time``,
    ``prefill_computed``, ``prefill_saved``, ``evictions``), each request's first admission from ``admitted``."""
    now = tally["now"]
    size = workload.block_size
    specs = workload.requests
    counted = [r for r in records if r.index >= first_counted]
    return ServingResult(
        source=workload.source,
        backend=backend,
        policy=policy,
        capacity=capacity,
        block_size=size,
        preemption="recompute",
        requests=len(specs),
        counted_requests=len(counted),
        rejected=tally["rejected"],
        blocks=sum(math.ceil(specs[r.index].prompt_length / size) for r in counted),
        block_hits=sum(r.cached_tokens // size for r in counted),
        tokens=sum(specs[r.index].prompt_length for r in counted),
        token_hits=sum(r.cached_tokens for r in counted),
        prefill_tokens_computed=tally["prefill_computed"],
        prefill_tokens_saved=tally["prefill_saved"],
        preemptions=sum(r.preemptions for r in records),
        evictions=tally["evictions"],
        ttft_ms=Percentiles.of([(r.first_token_us - specs[r.index].arrival_us) / 1000 for r in counted]),
        queue_ms=Percentiles.of([(admitted[r.index] - specs[r.index].arrival_us) / 1000 for r in counted]),
        peak_blocks_in_use=tally["peak"],
        mean_blocks_in_use=tally["in_use_time"] / now if now else 0.0,
        makespan_ms=now / 1000,
        steps=tally["steps"],
        seconds=seconds,
        outputs_hit=workload.outputs_hit,
        timeline=thin_timeline(timeline),
    )
