"""TRACE-1019, TRACE-1020: the oracle's one-call replay leaves exactly what the protocol calls leave.

Every test runs the same requests through two oracle pools, one by :func:`replay_stepwise` (the
protocol calls TRACE-1014 describes), one by ``replay_requests``, and compares the results and
the whole snapshot: free stack, references, generations, hashes, copies, parents, children,
release and registration order, events and statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvref.contract.errors import HashConflictError, InvalidTypeError, InvalidValueError, KVRefError
from kvref.oracle import OracleBlockPool
from kvref.simulation.replay import replay, replay_stepwise
from kvref.simulation.traces import load_trace
from kvref.simulation.workloads import WORKLOADS, workload_trace

rule = pytest.mark.rule
POLICIES = ("lru", "lru-leaf", "fifo", "ref-zero", "lru-leaf-access")
MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_conversation_trace.jsonl"

Prepare = Callable[[OracleBlockPool], None]


def workload_lists(name: str, seed: int = 0) -> list[list[int]]:
    trace = workload_trace(name, seed=seed)
    return [list(r.block_ids) for r in trace.requests]


def snapshot_difference(stepwise: OracleBlockPool, fused: OracleBlockPool) -> list[str]:
    want, got = stepwise.snapshot(), fused.snapshot()
    return [f"{key}: stepwise {want[key]!r:.200}, fused {got[key]!r:.200}" for key in want if want[key] != got[key]]


def replay_both(
    policy: str,
    capacity: int,
    batches: Sequence[list[list[int]]],
    *,
    events: bool = False,
    prepare: Prepare | None = None,
) -> tuple[OracleBlockPool, OracleBlockPool]:
    """Both pools after ``prepare`` and the batches in turn; every batch's result must agree."""
    stepwise = OracleBlockPool(capacity + 1, policy=policy, enable_events=events, paused_limit=4)
    fused = OracleBlockPool(capacity + 1, policy=policy, enable_events=events, paused_limit=4)
    if prepare is not None:
        prepare(stepwise)
        prepare(fused)
    for number, batch in enumerate(batches):
        want = replay_stepwise(stepwise, batch, first_holder=10_000 * number)
        got = fused.replay_requests(batch)
        assert got == want, (
            f"[TRACE-1019] batch {number} under {policy} at {capacity} blocks: replay_requests gave hits "
            f"{got.hits[:20]}... peak {got.peak_occupied}, "
            f"the protocol calls {want.hits[:20]}... peak {want.peak_occupied}"
        )
    difference = snapshot_difference(stepwise, fused)
    assert not difference, f"[TRACE-1019] {policy} at {capacity} blocks: the states differ: {difference}"
    fused.check_invariants()
    return stepwise, fused


@rule("TRACE-1019")
@pytest.mark.parametrize("events", [False, True], ids=["no-events", "events"])
@pytest.mark.parametrize("capacity", [6, 40, 400])
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("policy", POLICIES)
def test_replay_requests_leaves_the_state_the_protocol_calls_leave(
    policy: str, workload: str, capacity: int, events: bool
) -> None:
    lists = workload_lists(workload)
    third = len(lists) // 3
    replay_both(policy, capacity, [lists[:third], lists[third:]], events=events)


@rule("TRACE-1019")
@pytest.mark.parametrize("policy", POLICIES)
def test_a_small_batch_on_a_large_cache_agrees_too(policy: str) -> None:
    """Fewer references than resident hashes: parents and children are kept step by step, not rebuilt."""
    lists = workload_lists("system-prompt", seed=5)
    _, fused = replay_both(policy, 300, [lists[:-3], lists[-3:], [lists[0][:2]]])
    assert fused.stats.requests == len(lists) + 1, f"[PFX-318] {fused.stats.requests} requests counted"


def _hold_a_chain_and_a_second_copy(pool: OracleBlockPool) -> None:
    """Holder x keeps a cached chain; holder y holds a second copy of its head, then is paused."""
    chain = [7_001, 7_002, 7_003]
    ids = pool.allocate(3, holder="x")
    pool.register(ids, chain)
    copy = pool.allocate(1, holder="y")
    pool.register(copy, chain[:1])
    pool.pause("y")


def _release_a_chain_head_first(pool: OracleBlockPool) -> None:
    """A cached chain whose parent was released before its child: not an LRU stack."""
    ids = pool.allocate(3, holder="x")
    pool.register(ids, [5, 6, 7])
    pool.free(ids, holder="x")


def _hold_a_long_chain(pool: OracleBlockPool) -> None:
    """Holder x keeps 40 hashed blocks in use: more resident hashes than a small batch has blocks."""
    pool.register(pool.allocate(40, holder="x"), list(range(9_000, 9_040)))


@rule("TRACE-1019", "EVICT-405")
@pytest.mark.parametrize("policy", POLICIES)
def test_a_small_batch_beside_a_long_held_chain_keeps_the_tree_step_by_step(policy: str) -> None:
    replay_both(policy, 60, [[[1, 2, 3], [1, 2, 4], [5]], [[1, 2, 3, 6]]], prepare=_hold_a_long_chain)


def _hold_the_tail_of_a_cached_chain(pool: OracleBlockPool) -> None:
    """Holder x keeps the tail of a chain whose head is cached: under lru-leaf the head cannot go."""
    ids = pool.allocate(3, holder="x")
    pool.register(ids, [8_001, 8_002, 8_003])
    pool.free(ids[:2][::-1], holder="x")


@rule("TRACE-1019")
@pytest.mark.parametrize(
    "prepare",
    [_hold_a_chain_and_a_second_copy, _release_a_chain_head_first, _hold_the_tail_of_a_cached_chain],
    ids=["held-and-copied", "head-first", "tail-held"],
)
@pytest.mark.parametrize("policy", POLICIES)
def test_replay_requests_agrees_beside_blocks_other_holders_hold(policy: str, prepare: Prepare) -> None:
    lists = workload_lists("chat", seed=3)
    lists[:0] = [[5, 6, 7, 8], [7_001, 7_002, 7_009]]  # requests reaching into the prepared blocks
    stepwise, fused = replay_both(policy, 24, [lists], prepare=prepare)
    for holder in ("x", "y"):
        assert fused.holder_references(holder) == stepwise.holder_references(holder), (
            f"[TRACE-1019] holder {holder!r} holds {fused.holder_references(holder)} references after "
            f"replay_requests, {stepwise.holder_references(holder)} after the protocol calls"
        )


@rule("TRACE-1019", "EVICT-403")
@pytest.mark.parametrize("policy", ["lru", "lru-leaf"])
def test_a_replay_from_an_empty_cache_keeps_it_an_lru_stack(policy: str) -> None:
    pool = OracleBlockPool(41, policy=policy)
    pool.replay_requests(workload_lists("agent"))
    assert pool.fused_replay.lru_stack_holds(), (
        f"[TRACE-1019] after a replay under {policy}, the cache should be an LRU stack (one copy per hash, "
        "parents released after children), so the next replay may take the fast form"
    )


@rule("TRACE-1019")
@pytest.mark.parametrize(
    ("why", "prepare"),
    [
        ("a hashed block in use", lambda p: p.register(p.allocate(1, holder="x"), [9])),
        ("a parent released before its child", _release_a_chain_head_first),
        ("a hash with two copies", lambda p: _two_copies(p)),
        ("fifo order", None),
        ("events to emit", None),
    ],
)
def test_the_lru_stack_form_is_not_taken_where_it_would_be_wrong(why: str, prepare: Prepare | None) -> None:
    pool = OracleBlockPool(12, policy="fifo" if why == "fifo order" else "lru", enable_events=why == "events to emit")
    if prepare is not None:
        prepare(pool)
    assert not pool.fused_replay.lru_stack_holds(), f"[TRACE-1019] the LRU-stack form was found to hold with {why}"


def _two_copies(pool: OracleBlockPool) -> None:
    first = pool.allocate(1, holder="x")
    pool.register(first, [9])
    second = pool.allocate(1, holder="y")
    pool.register(second, [9])
    pool.free(first, holder="x")
    pool.free(second, holder="y")


# Token chains over a tiny alphabet, so requests share prefixes; a prefix's id is its first sight.
chains = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=6), max_size=10)


def chain_ids(chain: list[int], names: dict[tuple[int, ...], int]) -> list[int]:
    return [names.setdefault(tuple(chain[: i + 1]), len(names) + 1) for i in range(len(chain))]


@rule("TRACE-1019")
@given(
    policy=st.sampled_from(POLICIES),
    capacity=st.integers(1, 12),
    events=st.booleans(),
    warm=chains,
    held=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=4), max_size=3),
    release_held=st.booleans(),
    batch=chains,
)
def test_replay_requests_agrees_on_any_reachable_state(
    policy: str,
    capacity: int,
    events: bool,
    warm: list[list[int]],
    held: list[list[int]],
    release_held: bool,
    batch: list[list[int]],
) -> None:
    names: dict[tuple[int, ...], int] = {}
    warm_lists = [chain_ids(c, names) for c in warm]
    held_lists = [chain_ids(c, names) for c in held]
    batch_lists = [chain_ids(c, names) for c in batch]

    def prepare(pool: OracleBlockPool) -> None:
        replay_stepwise(pool, warm_lists, first_holder=-1_000)
        for number, ids in enumerate(held_lists):
            holder = f"h{number}"
            hit = pool.match(ids, holder=holder)
            room = min(len(ids) - len(hit), pool.num_available)
            fresh = pool.allocate(room, holder=holder)
            if fresh:
                pool.register(fresh, ids[len(hit) : len(hit) + room], parent_hash=ids[len(hit) - 1] if hit else None)
            if release_held:  # head first: parents released before their children
                pool.free(hit + fresh, holder=holder)

    replay_both(policy, capacity, [batch_lists, batch_lists[::-1]], events=events, prepare=prepare)


def _resident_chain(pool: OracleBlockPool) -> None:
    """Hashes 1, 2 resident (held, so that ref-zero keeps them too)."""
    pool.register(pool.allocate(2, holder="keep"), [1, 2])


@rule("TRACE-1020", "ERR-501")
@pytest.mark.parametrize(
    ("batch", "error", "rule_id"),
    [
        ([[1, 2], [3, 2]], HashConflictError, "TRACE-1006"),
        ([[1, 2, 1]], HashConflictError, "TRACE-1006"),
        ([[4], [4, 4]], HashConflictError, "TRACE-1006"),
        ([[3, 2]], HashConflictError, "PFX-306"),
        ([[1], [2, True]], InvalidTypeError, "ERR-503"),
        ([[1], [-5]], InvalidValueError, "HASH-207"),
        ([[1], "12"], InvalidTypeError, "ERR-503"),
        (None, InvalidTypeError, "ERR-503"),
    ],
)
@pytest.mark.parametrize("policy", POLICIES)
def test_a_batch_that_is_not_a_prefix_tree_is_refused_whole(
    policy: str, batch: Any, error: type[KVRefError], rule_id: str
) -> None:
    pool = OracleBlockPool(8, policy=policy, enable_events=True)
    _resident_chain(pool)
    pool.take_events()
    before = pool.snapshot()
    with pytest.raises(error) as raised:
        pool.replay_requests(batch)
    assert raised.value.rule == rule_id, f"[TRACE-1020] {batch!r} raised {raised.value}, the rule is {rule_id}"
    assert pool.snapshot() == before, f"[ERR-501] replay_requests({batch!r}) failed but changed the pool"


@rule("TRACE-1019", "TRACE-1018")
@pytest.mark.parametrize("policy", POLICIES)
def test_replay_takes_the_one_call_form_where_the_pool_has_it_and_counts_the_same(policy: str) -> None:
    trace = workload_trace("few-shot", seed=1)
    fused = replay(trace, OracleBlockPool(33, policy=policy), warmup=0.25)
    stepwise = replay(trace, OracleBlockPool(33, policy=policy), warmup=0.25, stepwise=True)
    assert (fused.mode, stepwise.mode) == ("fused", "stepwise"), f"modes: {fused.mode}, {stepwise.mode}"
    assert fused.counts() == stepwise.counts(), (
        f"[TRACE-1018] {policy}: one call counted {fused.counts()}, the protocol calls {stepwise.counts()}"
    )


@rule("TRACE-1019")
@pytest.mark.skipif(not MOONCAKE.exists(), reason=f"the Mooncake trace is not at {MOONCAKE}")
@pytest.mark.parametrize("policy", ["lru-leaf", "fifo"])
def test_the_mooncake_trace_replays_in_one_call_to_the_same_state(policy: str) -> None:
    lists = [list(r.block_ids) for r in load_trace(MOONCAKE).requests]
    _, fused = replay_both(policy, 2_000, [lists[:4_000], lists[4_000:]])
    assert fused.stats.evictions > 100_000, f"the trace should evict heavily at 2,000 blocks: {fused.stats}"
