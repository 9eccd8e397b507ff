"""One serving replay from plain parameters: what a sweep point is and how it runs anywhere (TRACE-1041).

A :class:`ServingPoint` names everything a replay depends on (the workload by how to load it,
capacity, policy, step model, warm-up, backend), so it can be sent to another process or a Dask
worker, and keyed in a results file (TRACE-1043). :func:`run_point` loads the workload (once per
process), builds the backend's pool and the oracle's request manager over it, replays, and adds
Belady's offline reference where asked.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvref.contract.errors import InvalidValueError
from kvref.contract.hashing import DEFAULT_ALGORITHM
from kvref.simulation.replay import warmup_cut
from kvref.simulation.serving.model import StepModel
from kvref.simulation.serving.results import ServingResult
from kvref.simulation.serving.scheduler import ServingReplay
from kvref.simulation.serving.tiers import DEFAULT_KV_BYTES_PER_TOKEN, TierCascade, TierSpec
from kvref.simulation.serving.workload import SERVING_WORKLOADS, ServingWorkload

__all__ = ["WORKLOAD_KINDS", "ServingPoint", "WorkloadSpec", "load_workload", "run_point"]

#: How a workload is named: a built-in workload, a JSON Lines trace (Mooncake's format), an Azure CSV.
WORKLOAD_KINDS = ("builtin", "jsonl", "azure")


@dataclass(frozen=True)
class WorkloadSpec:
    """How to load a workload: ``kind`` and ``name`` (a built-in name or a file path), the block size
    and the knobs of the kinds that have them (seed, hash, the Azure prefixes of TRACE-1045)."""

    kind: str
    name: str
    block_size: int
    seed: int = 0
    hash: str = DEFAULT_ALGORITHM
    azure_shared: float = 0.5
    azure_prefixes: int = 8

    def __post_init__(self) -> None:
        if self.kind not in WORKLOAD_KINDS:
            kinds = list(WORKLOAD_KINDS)
            raise InvalidValueError("TRACE-1041", f"workload kind must be one of {kinds}, got {self.kind!r}")
        if self.kind == "builtin" and self.name not in SERVING_WORKLOADS:
            raise InvalidValueError("TRACE-1005", f"unknown workload {self.name!r}; known: {list(SERVING_WORKLOADS)}")
        if type(self.block_size) is not int or self.block_size < 1:
            raise InvalidValueError("TRACE-1002", f"block_size must be a positive integer, got {self.block_size!r}")


@functools.lru_cache(maxsize=4)
def load_workload(spec: WorkloadSpec) -> ServingWorkload:
    """The workload ``spec`` names, loaded once per process."""
    if spec.kind == "builtin":
        from kvref.simulation.serving.workload import serving_workload

        return serving_workload(spec.name, seed=spec.seed, block_size=spec.block_size, algorithm=spec.hash)
    if spec.kind == "azure":
        from kvref.simulation.serving.azure import AzurePrefixes, load_azure_trace

        structure = AzurePrefixes(shared=spec.azure_shared, count=spec.azure_prefixes, seed=spec.seed)
        return load_azure_trace(spec.name, block_size=spec.block_size, prefixes=structure, algorithm=spec.hash)
    from kvref.simulation.serving.workload import workload_from_trace
    from kvref.simulation.traces import load_trace

    trace = load_trace(spec.name, block_size=spec.block_size, algorithm=spec.hash)
    return workload_from_trace(trace, algorithm=spec.hash)


@dataclass(frozen=True)
class ServingPoint:
    """One replay of a sweep: everything its counts depend on (TRACE-1041)."""

    workload: WorkloadSpec
    capacity: int
    policy: str
    model: StepModel = field(default_factory=StepModel)
    warmup: float = 0.0
    backend: str = "oracle"
    belady: bool = True
    #: tiers below the device pool, first tier first (TIER-1126..TIER-1130), and one token's KV bytes
    tiers: tuple[TierSpec, ...] = ()
    kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN

    def key(self) -> str:
        """The point's parameters as canonical JSON: its key in a results file (TRACE-1049).

        A point without tiers leaves them out, so its key is the one it had before tiers existed."""
        fields = dataclasses.asdict(self)
        if not self.tiers:
            del fields["tiers"], fields["kv_bytes_per_token"]
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))

    def describe(self) -> str:
        """A short label for progress bars."""
        return f"{self.policy} at {self.capacity:,} blocks"


def run_point(
    point: ServingPoint, *, fast_forward: bool = True, progress: Callable[[int, int], None] | None = None
) -> ServingResult:
    """Replay ``point``: the backend's pool of ``capacity`` usable blocks under the oracle's manager (TRACE-1030).

    ``progress(done, total)`` is called as requests finish (``done`` of them since the last call).
    """
    from kvref.config.registry import create_pool
    from kvref.oracle.manager import RequestManager

    workload = load_workload(point.workload)
    if type(point.capacity) is not int or point.capacity < 1:
        raise InvalidValueError("TRACE-1030", f"capacity must be a positive integer, got {point.capacity!r}")
    pool = create_pool(point.capacity + 1, backend=point.backend, policy=point.policy)
    manager = RequestManager(pool, block_size=workload.block_size, max_model_len=point.model.max_model_len)
    tiers = None
    if point.tiers:
        tiers = TierCascade(
            point.tiers,
            block_size=workload.block_size,
            kv_bytes_per_token=point.kv_bytes_per_token,
            prefill_ms_per_token=point.model.prefill_ms_per_token,
        )
    replay = ServingReplay(
        workload, manager, point.model, warmup=point.warmup, fast_forward=fast_forward, progress=progress, tiers=tiers
    )
    result = replay.run(backend=point.backend, policy=point.policy)
    if point.belady and not workload.outputs_hit:
        result = with_belady(result, workload, point)
    return result


def with_belady(result: ServingResult, workload: ServingWorkload, point: ServingPoint) -> ServingResult:
    """``result`` with Belady's offline hits at the same capacity beside it (TRACE-1017, TRACE-1039).

    Over the requests the replay did not reject, and only the blocks a hit can cover. Defined for
    workloads whose outputs have no identity: where outputs hit later prompts, a sequential MIN
    over the prompts alone is no reference, and none is given.
    """
    from kvref.simulation.belady import belady_replay

    size = workload.block_size
    first = warmup_cut(point.warmup, len(workload.requests))  # the replay's cut, over every request (TRACE-1013)
    limit = point.model.max_model_len
    kept_at = [i for i, r in enumerate(workload.requests) if r.fits(size, point.capacity, limit)]
    if not kept_at:
        return result
    kept = tuple(workload.requests[i] for i in kept_at)
    trace = dataclasses.replace(workload, requests=kept).prompt_trace()
    offline = belady_replay(trace, point.capacity, first_counted=sum(1 for i in kept_at if i < first))
    return dataclasses.replace(result, belady_token_hits=offline.token_hits, belady_block_hits=offline.block_hits)


def point_from_json(data: dict[str, Any]) -> ServingPoint:
    """The point :meth:`ServingPoint.key` wrote."""
    return ServingPoint(
        workload=WorkloadSpec(**data["workload"]),
        capacity=data["capacity"],
        policy=data["policy"],
        model=StepModel(**data["model"]),
        warmup=data["warmup"],
        backend=data["backend"],
        belady=data["belady"],
        tiers=tuple(TierSpec(**tier) for tier in data.get("tiers", ())),
        kv_bytes_per_token=data.get("kv_bytes_per_token", DEFAULT_KV_BYTES_PER_TOKEN),
    )
