"""Chapter 10, serving replay: the scheduler's rules watched call by call on random workloads."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from kvref.contract.requests import Request
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager
from kvref.simulation.serving import ServingReplay, ServingWorkload, StepModel

from .test_serving_equivalence import workloads

rule = pytest.mark.rule


class Watcher(RequestManager):
    """The oracle manager, checking at each call what the scheduler must not do at that moment."""

    replay: ServingReplay

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.broken: list[str] = []
        self.order: dict[str, int] = {}  # request id -> when it was last admitted
        self.admissions = 0
        self.preempted_at = -1
        self.first_hits: dict[str, int] = {}
        self.every_hit = 0

    def get_computed_blocks(self, request: Request) -> Any:
        now = self.replay.now_us
        seats = self.replay.model.max_num_seqs
        if len(self.replay.running()) >= seats:
            self.broken.append(f"TRACE-1032: {request.request_id} looked up with all {seats} seats taken")
        if self.preempted_at == now:
            self.broken.append(f"TRACE-1032: {request.request_id} looked up in a step that preempted")
        paused = [rid for rid, p in self.replay.running() if p]
        if paused:
            self.broken.append(f"TRACE-1036: {request.request_id} looked up while {paused} are paused")
        return super().get_computed_blocks(request)

    def allocate_slots(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        got = super().allocate_slots(request, *args, **kwargs)
        if got is not None and len(args) >= 2:  # an admission with its hit
            rid = request.request_id
            self.admissions += 1
            self.order[rid] = self.admissions
            self.first_hits.setdefault(rid, args[1])
            self.every_hit += args[1]
        return got

    def preempt(self, request: Request) -> None:
        rid = request.request_id
        still = [r for r, _ in self.replay.running()]
        younger = [r for r in still if self.order.get(r, -1) > self.order.get(rid, -1)]
        if younger:
            self.broken.append(f"TRACE-1035/1036: preempted {rid} while the younger {younger} run")
        self.preempted_at = self.replay.now_us
        super().preempt(request)


def watched(w: ServingWorkload, capacity: int, model: StepModel, policy: str) -> tuple[Any, Watcher]:
    manager = Watcher(OracleBlockPool(capacity + 1, policy=policy), block_size=w.block_size, max_model_len=4096)
    replay = ServingReplay(w, manager, model)
    manager.replay = replay
    return replay.run(), manager


@rule("TRACE-1032", "TRACE-1035", "TRACE-1036", "TRACE-1039")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_the_scheduler_admits_preempts_and_counts_as_the_rules_say(
    case: tuple[ServingWorkload, int, StepModel, str],
) -> None:
    w, capacity, model, policy = case
    result, manager = watched(w, capacity, model, policy)
    assert not manager.broken, "\n".join(manager.broken[:5])
    assert result.token_hits == sum(manager.first_hits.values()), "hits are those of each first admission"
    assert result.prefill_tokens_saved == manager.every_hit, "saved tokens are the hits of every admission"
