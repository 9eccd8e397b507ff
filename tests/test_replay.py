"""Chapter 10, replay: exact hit counting on hand-made traces, and the real Mooncake trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvref.contract.errors import InvalidValueError
from kvref.oracle import OracleBlockPool
from kvref.simulation.belady import belady_replay
from kvref.simulation.replay import replay
from kvref.simulation.traces import Trace, TraceRequest, load_trace

rule = pytest.mark.rule
MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def trace_of(*requests: tuple[int, tuple[int, ...]], block_size: int = 4) -> Trace:
    """Requests as (input_length, block ids)."""
    return Trace(tuple(TraceRequest(i, n, 1, ids) for i, (n, ids) in enumerate(requests)), block_size, "test")


@rule("TRACE-1011", "TRACE-1012")
def test_hits_stop_at_the_first_miss_and_the_last_block_weighs_the_rest() -> None:
    t = trace_of((10, (1, 2, 3)), (10, (1, 2, 9)), (6, (1, 7)))
    r = replay(t, OracleBlockPool(101))
    assert (r.blocks, r.block_hits) == (8, 2 + 1), "request 2 hits 1, 2; request 3 hits 1 only"
    assert (r.tokens, r.token_hits) == (26, 8 + 4), "blocks weigh 4 tokens; the last block of 10 weighs 2"


@rule("TRACE-1011")
def test_a_hole_in_the_prefix_ends_the_hit() -> None:
    t = trace_of((12, (1, 2, 3)), (4, (5,)), (12, (1, 2, 3)))
    pool = OracleBlockPool(4, policy="fifo")  # 3 usable blocks: request 2 evicts the first registered, 1
    r = replay(t, pool)
    assert r.block_hits == 0, "with block 1 evicted, 2 and 3 cannot be hits even though they are cached"


@rule("TRACE-1013")
def test_warm_up_requests_fill_the_cache_but_are_not_counted() -> None:
    t = trace_of((8, (1, 2)), (8, (1, 2)), (8, (1, 2)), (8, (1, 2)))
    r = replay(t, OracleBlockPool(11), warmup=0.5)
    assert (r.counted_requests, r.blocks, r.block_hits) == (2, 4, 4)


@rule("TRACE-1013")
@pytest.mark.parametrize("warmup", [-0.1, 1.0, 2, "0.5", True])
def test_a_warm_up_fraction_outside_zero_to_one_is_refused(warmup: object) -> None:
    with pytest.raises(InvalidValueError, match="TRACE-1013"):
        replay(trace_of((4, (1,))), OracleBlockPool(4), warmup=warmup)  # type: ignore[arg-type]


@rule("TRACE-1014")
def test_a_request_releases_tail_first_so_lru_evicts_its_tail_before_its_head() -> None:
    t = trace_of((12, (1, 2, 3)), (4, (9,)), (12, (1, 2, 3)))
    r = replay(t, OracleBlockPool(4, policy="lru"), backend="oracle")
    assert r.block_hits == 2, "request 2 evicted the tail block 3, so request 3 still hits 1 and 2"


@rule("TRACE-1015")
def test_a_request_larger_than_the_cache_caches_only_its_head() -> None:
    t = trace_of((20, (1, 2, 3, 4, 5)), (20, (1, 2, 3, 4, 5)))
    r = replay(t, OracleBlockPool(4))
    assert r.block_hits == 3, "only the first 3 blocks fit the cache"


@rule("TRACE-1016")
def test_the_infinite_capacity_rate_bounds_every_finite_one() -> None:
    t = trace_of((12, (1, 2, 3)), (4, (5,)), (12, (1, 2, 3)), (8, (1, 2)))
    r = replay(t, OracleBlockPool(3))
    assert r.infinite_block_hits == 3 + 2 and r.block_hits <= r.infinite_block_hits


@rule("TRACE-1011", "TRACE-1016")
def test_the_mooncake_conversation_trace_replays_with_both_hit_rates() -> None:
    if not MOONCAKE.is_file():
        pytest.skip(f"{MOONCAKE} is not here")
    trace = load_trace(MOONCAKE)
    r = replay(trace, OracleBlockPool(10_001, policy="lru-leaf"))
    assert r.blocks == 288_500 and r.peak_occupancy == 10_000
    assert 0.0 < r.token_hit_rate <= r.infinite_token_hit_rate < 1.0
    assert abs(r.token_hit_rate - 0.2157) < 0.001, f"token hit rate {r.token_hit_rate:.4f} moved"


@rule("TRACE-1017")
def test_belady_keeps_the_block_needed_soonest_where_lru_keeps_the_newest() -> None:
    t = trace_of((4, (1,)), (4, (2,)), (4, (3,)), (4, (1,)))
    assert replay(t, OracleBlockPool(3, policy="lru")).block_hits == 0
    offline = belady_replay(t, 2)
    assert offline.block_hits == 1 and offline.policy == "belady", "MIN evicts 2 (never used again), keeps 1"


@rule("TRACE-1017")
@pytest.mark.parametrize("workload", ["chat", "agent", "few-shot"])
def test_belady_bounds_the_online_policies_on_the_generated_workloads(workload: str) -> None:
    from kvref.simulation.workloads import workload_trace

    trace = workload_trace(workload, seed=1)
    for capacity in (32, 128):
        offline = belady_replay(trace, capacity)
        for policy in ("lru", "lru-leaf", "fifo", "ref-zero"):
            online = replay(trace, OracleBlockPool(capacity + 1, policy=policy))
            assert online.block_hits <= offline.block_hits <= offline.infinite_block_hits, (
                f"{workload}, capacity {capacity}: {policy} {online.block_hits} > belady {offline.block_hits}"
            )


@rule("TRACE-1017")
@pytest.mark.parametrize("capacity", [0, -3, 2.5, True])
def test_belady_refuses_a_capacity_that_is_not_a_positive_integer(capacity: object) -> None:
    with pytest.raises(InvalidValueError, match="TRACE-1017"):
        belady_replay(trace_of((4, (1,))), capacity)  # type: ignore[arg-type]
