"""Chapter 10, serving replay: the scheduler's time model on hand-made requests, worked out by hand."""

from __future__ import annotations

from typing import Any

import pytest

from kvref.contract.errors import InvalidValueError
from kvref.contract.requests import Request
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager
from kvref.simulation.serving import ServedRequest, ServingReplay, ServingResult, ServingWorkload, StepModel
from kvref.simulation.serving.results import nearest_rank

rule = pytest.mark.rule


class RecordingManager(RequestManager):
    """The oracle manager, noting which request each call was for (the replay's calls, in order)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, str]] = []
        self.hits: dict[str, list[int]] = {}  # every lookup's answer
        self.admitted: dict[str, list[int]] = {}  # the hit of every admission that got its blocks

    def get_computed_blocks(self, request: Request) -> Any:
        blocks, hit = super().get_computed_blocks(request)
        self.calls.append(("lookup", request.request_id))
        self.hits.setdefault(request.request_id, []).append(hit)
        return blocks, hit

    def allocate_slots(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        got = super().allocate_slots(request, *args, **kwargs)
        self.calls.append(("allocate" if got is not None else "refused", request.request_id))
        if got is not None and len(args) >= 2:  # an admission: new tokens, then the hit's tokens and blocks
            self.admitted.setdefault(request.request_id, []).append(args[1])
        return got

    def preempt(self, request: Request) -> None:
        self.calls.append(("preempt", request.request_id))
        super().preempt(request)

    def free(self, request: Request) -> None:
        self.calls.append(("free", request.request_id))
        super().free(request)


def tokens_request(at_us: int, prompt: list[int], output: list[int]) -> ServedRequest:
    return ServedRequest(at_us, len(prompt), len(output), prompt_tokens=tuple(prompt), output_tokens=tuple(output))


def workload(*requests: ServedRequest, block_size: int = 16) -> ServingWorkload:
    return ServingWorkload(tuple(requests), block_size, "test", outputs_hit=True, fixed_block_size=False)


def replay(
    w: ServingWorkload, capacity: int, model: StepModel, *, fast_forward: bool = True, policy: str = "lru"
) -> tuple[ServingResult, RecordingManager]:
    pool = OracleBlockPool(capacity + 1, policy=policy)
    manager = RecordingManager(pool, block_size=w.block_size, max_model_len=4096)
    result = ServingReplay(w, manager, model, fast_forward=fast_forward).run()
    manager.check_invariants()
    assert manager.pool.num_in_use == 0, f"after the replay {manager.pool.num_in_use} blocks are still in use"
    return result, manager


#: A model that makes hand arithmetic easy: 1 ms a step, 0.01 ms a prefill token, 0.1 ms a decode token.
HAND = StepModel(max_num_batched_tokens=100, step_ms=1.0, prefill_ms_per_token=0.01, decode_ms_per_token=0.1)


@rule("TRACE-1031", "TRACE-1032", "TRACE-1033", "TRACE-1034", "TRACE-1039")
def test_two_prompts_share_a_token_budget_chunk_by_chunk_as_worked_out_by_hand() -> None:
    # r0: 150 prompt tokens, 2 outputs; r1: 150 prompt tokens, 1 output; both arrive at 0; budget 100.
    # step 1 (0 ms): r0 admitted, 100 tokens                          -> 1 + 1.00 = 2.00 ms
    # step 2 (2 ms): r0 its last 50; r1 admitted with 50               -> 1 + 1.00 = 2.00 ms; r0's first token
    # step 3 (4 ms): r0 decodes 1; r1 99 more                          -> 1 + 0.99 + 0.1 = 2.09 ms; r0 done
    # step 4 (6.09 ms): r1 its last token                              -> 1 + 0.01 = 1.01 ms; r1's first token
    w = workload(tokens_request(0, list(range(150)), [7, 8]), tokens_request(0, list(range(1000, 1150)), [9]))
    r, manager = replay(w, 100, HAND)
    assert r.steps == 4, f"4 steps worked out by hand, the replay took {r.steps}"
    assert r.makespan_ms == 7.1, f"the last step ends at 7.1 ms (times are whole microseconds), not {r.makespan_ms}"
    assert (r.ttft_ms.p50, r.ttft_ms.p90) == (4.0, 7.1), f"TTFT {r.ttft_ms}"
    assert (r.queue_ms.p50, r.queue_ms.p90) == (0.0, 2.0), f"r1 waits one step: {r.queue_ms}"
    assert r.prefill_tokens_computed == 300, "every prompt token is computed once"
    assert [c for c in manager.calls if c[0] == "free"] == [("free", "r0"), ("free", "r1")]


@rule("TRACE-1031")
def test_an_idle_server_moves_its_clock_to_the_next_arrival() -> None:
    w = workload(tokens_request(10_000_000, list(range(32)), [1]))  # arrives at 10 s
    r, _ = replay(w, 16, HAND)
    assert r.queue_ms.p50 == 0.0, "nothing runs before it: it is admitted in the step that starts at its arrival"
    assert r.ttft_ms.p50 == pytest.approx(1.32), "one step of 32 prefill tokens: 1 + 0.32 ms"
    assert r.makespan_ms == pytest.approx(10_001.32)


@rule("TRACE-1033")
def test_a_step_lasts_its_cost_in_whole_microseconds_and_at_least_one() -> None:
    assert StepModel(step_ms=0, prefill_ms_per_token=0, decode_ms_per_token=0).duration_us(100, 100) == 1
    assert StepModel(step_ms=0.0004).duration_us(0, 0) == 1
    exact_half = StepModel(step_ms=2, prefill_ms_per_token=0.0015, decode_ms_per_token=0.1)
    assert exact_half.duration_us(3, 2) == 2205, "2,204.5 us rounds half up, whatever floats make of 2.2045 ms"
    assert exact_half.duration_us(2, 2) == 2203, "2,203 us exactly"
    for bad in ({"step_ms": -1}, {"decode_ms_per_token": float("nan")}, {"prefill_ms_per_token": True}):
        with pytest.raises(InvalidValueError, match="TRACE-1033"):
            StepModel(**bad)
    with pytest.raises(InvalidValueError, match="TRACE-1032"):
        StepModel(max_num_batched_tokens=0)
    with pytest.raises(InvalidValueError, match="TRACE-1035"):
        StepModel(preemption="swap")


def growing_pair(block_size: int = 4) -> ServingWorkload:
    """Two requests of 7 prompt tokens and 6 outputs: two blocks each at first, three later."""
    return workload(tokens_request(0, [1] * 7, [2] * 6), tokens_request(0, [3] * 7, [4] * 6), block_size=block_size)


@rule("TRACE-1035")
def test_recompute_preempts_the_most_recently_admitted_and_resumes_it_first() -> None:
    w = workload(
        tokens_request(0, [1] * 7, [2] * 6),
        tokens_request(0, [3] * 7, [4] * 6),
        tokens_request(1, [5] * 3, [6]),  # arrives while both run; must wait behind the preempted r1
        block_size=4,
    )
    r, manager = replay(w, 4, StepModel(), policy="lru")
    preempted = [rid for kind, rid in manager.calls if kind == "preempt"]
    assert preempted and preempted[0] == "r1", f"r1 was admitted last, so it goes first; preempted {preempted}"
    first = manager.calls.index(("preempt", "r1"))
    admitted_after = [rid for kind, rid in manager.calls[first:] if kind == "lookup"]
    assert admitted_after[0] == "r1", f"the preempted request is at the queue's front; then {admitted_after}"
    assert r.preemptions == len(preempted) and r.counted_requests == 3, "every request still finishes"


@rule("TRACE-1036")
def test_pause_keeps_blocks_and_breaks_a_standstill_by_preempting_the_youngest() -> None:
    model = StepModel(preemption="pause")
    r, manager = replay(growing_pair(), 4, model)
    preempted = [rid for kind, rid in manager.calls if kind == "preempt"]
    assert preempted == ["r1"], f"both pause at their third block; only r1, the younger, is preempted: {preempted}"
    refused = [rid for kind, rid in manager.calls if kind == "refused"]
    assert refused[:2] == ["r0", "r1"], "each is refused its third block once and paused, keeping the two it has"
    assert r.counted_requests == 2 and r.preemptions == 1


@rule("TRACE-1036")
def test_no_request_is_admitted_while_one_is_paused() -> None:
    # Two seats. r1 is refused its second block and pauses; r0 later pauses too; the standstill
    # preempts r1. r2 waits for a seat all along and may only be admitted once nobody is paused.
    w = workload(
        tokens_request(0, [1] * 7, [2] * 9),
        tokens_request(0, [3] * 3, [4] * 6),
        tokens_request(0, [5] * 3, [6]),
        block_size=4,
    )
    r, manager = replay(w, 4, StepModel(preemption="pause", max_num_seqs=2))
    calls = manager.calls
    first_pause = next(i for i, (kind, _) in enumerate(calls) if kind == "refused")
    r0_paused = calls.index(("refused", "r0"))
    r0_resumed = next(i for i in range(r0_paused, len(calls)) if calls[i] == ("allocate", "r0"))
    between = [c for c in calls[first_pause:r0_resumed] if c[0] == "lookup"]
    assert calls[first_pause] == ("refused", "r1"), f"r1 pauses first: {calls[: first_pause + 1]}"
    assert not between, f"admissions while a request was paused: {between}"
    assert [rid for kind, rid in calls if kind == "preempt"] == ["r1"], "the standstill preempts the youngest"
    assert r.counted_requests == 3


@rule("TRACE-1037")
def test_a_request_that_could_never_fit_is_rejected_at_arrival_and_the_rest_run() -> None:
    big = tokens_request(0, list(range(60)), [1] * 10)  # 69 computed tokens: 5 blocks of 16
    small = tokens_request(0, list(range(20)), [1])
    r, manager = replay(workload(big, small), 4, StepModel())
    assert (r.rejected, r.counted_requests) == (1, 1), "the 5-block request is rejected, the other runs"
    assert all(rid == "r1" for _, rid in manager.calls), "the rejected request is never shown to the manager"
    too_long = ServingWorkload((big,), 16, "t", outputs_hit=True, fixed_block_size=False)
    plain = RequestManager(OracleBlockPool(100), block_size=16, max_model_len=64)
    r = ServingReplay(too_long, plain, StepModel(max_model_len=64)).run()
    assert r.rejected == 1, "70 tokens exceed max_model_len 64"


@rule("TRACE-1030", "TRACE-1039")
def test_hits_are_the_managers_answers_at_first_admission() -> None:
    system = list(range(64))  # 4 blocks of 16
    w = workload(
        tokens_request(0, [*system, 100, 101], [7] * 3),
        tokens_request(50_000, [*system, 200], [8]),  # after r0 has finished: hits its 4 blocks
        tokens_request(50_000, [*system, 300, 301, 302], [9]),
    )
    r, manager = replay(w, 64, StepModel())
    firsts = sum(hits[0] for hits in manager.admitted.values())
    assert r.token_hits == firsts == 2 * 64, f"replay counted {r.token_hits}, the manager answered {manager.admitted}"
    assert r.block_hits == 8 and r.blocks == 5 + 5 + 5
    assert r.peak_blocks_in_use <= 64 and 0 < r.mean_blocks_in_use <= r.peak_blocks_in_use


@rule("TRACE-1039")
def test_percentiles_are_nearest_rank() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert [nearest_rank(values, p) for p in (50, 90, 99, 100)] == [3.0, 5.0, 5.0, 5.0]
    assert nearest_rank([7.0], 50) == 7.0 and nearest_rank([], 90) == 0.0
    assert nearest_rank(list(range(1, 101)), 90) == 90, "the 90th of 1..100 is 90"


@rule("TRACE-1039")
def test_blocks_in_use_are_counted_during_each_step_and_weighted_by_time() -> None:
    w = workload(tokens_request(0, list(range(32)), [1]))  # 2 blocks during one step of 1.32 ms
    r, _ = replay(w, 8, HAND)
    assert r.peak_blocks_in_use == 2, "the request holds its 2 blocks while its step runs"
    assert r.mean_blocks_in_use == pytest.approx(2.0), "2 blocks for the whole 1.32 ms"
    assert r.timeline == [(0.0, 2)]


@rule("TRACE-1033")
def test_a_recomputed_last_sampled_token_costs_a_decode_token() -> None:
    # Blocks of 2, two usable blocks: r1 is preempted after its first output and re-admitted when r0
    # has finished, its prompt and first output cached: all it has left is that output, a decode token.
    w = workload(tokens_request(0, [0], [50, 51]), tokens_request(0, [100, 101], [150, 151]), block_size=2)
    r, _ = replay(w, 2, StepModel())
    assert r.preemptions == 1
    assert r.prefill_tokens_computed == 3, "the prompts' three tokens; the recomputed output token is a decode token"
    assert r.makespan_ms == 15.26, "5.06 + 5.1 (r0 decodes, r1 is preempted) + 5.1 (r1's last token as a decode)"


@rule("TRACE-1034", "TRACE-1039")
def test_a_request_that_generates_nothing_gets_its_first_answer_when_its_prompt_is_computed() -> None:
    r, _ = replay(workload(tokens_request(0, list(range(30)), [])), 8, HAND)
    assert r.steps == 1 and r.ttft_ms.p50 == 1.3, "one step of 30 prefill tokens: 1 + 0.3 ms, and it is done"


@rule("TRACE-1037")
def test_the_rejection_threshold_counts_all_but_the_last_output_token() -> None:
    fits = tokens_request(0, list(range(10)), [1] * 7)  # at most 16 computed tokens: 4 blocks of 4
    too_big = tokens_request(0, list(range(10)), [1] * 8)  # 17: 5 blocks
    r, _ = replay(workload(fits, block_size=4), 4, StepModel())
    assert (r.rejected, r.counted_requests) == (0, 1), "the last sampled token is never computed, so it needs no slot"
    r, _ = replay(workload(too_big, block_size=4), 4, StepModel())
    assert r.rejected == 1


@rule("TRACE-1034", "TRACE-1039")
def test_a_preempted_request_keeps_its_first_token_time_and_its_first_admission() -> None:
    # Both are admitted in step 1 (14 prompt tokens: 5.28 ms) and sample their first tokens then; r1 is
    # preempted later and re-admitted, but its time to first token and queueing delay stay those of step 1.
    r, manager = replay(growing_pair(), 4, StepModel())
    assert r.preemptions >= 1 and len(manager.admitted["r1"]) >= 2, "r1 was admitted twice"
    assert (r.ttft_ms.p50, r.ttft_ms.p99) == (5.28, 5.28), f"both first tokens come at the end of step 1: {r.ttft_ms}"
    assert r.queue_ms.p99 == 0.0, "both were first admitted in the step that starts at their arrival"
    assert r.token_hits == sum(h[0] for h in manager.admitted.values()), "hits are counted at the first admission"
    assert r.prefill_tokens_saved == sum(sum(h) for h in manager.admitted.values()), "saved counts every admission"
    assert r.token_hits < r.prefill_tokens_saved, "r1's second admission hit what its first computed"


@rule("TRACE-1031", "TRACE-1040")
def test_a_request_arriving_exactly_when_a_step_starts_is_seen_by_that_step() -> None:
    # r0 decodes alone; each decode step lasts 5.1 ms, so its 4th step starts at 5.08 + 3 * 5.1 ms.
    def req(at: int, prompt: int, output: int, base: int) -> ServedRequest:
        return tokens_request(at, list(range(base, base + prompt)), list(range(base + 1000, base + 1000 + output)))

    w = workload(req(0, 4, 100, 0), req(5080 + 3 * 5100, 4, 3, 5000), block_size=64)
    for fast in (True, False):
        r, _ = replay(w, 100, StepModel(), fast_forward=fast)
        assert r.queue_ms.p99 == 0.0, f"fast_forward={fast}: the arrival waited {r.queue_ms.p99} ms for a step"
