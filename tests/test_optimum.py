"""The offline optimum of a prefix cache (TRACE-1060..TRACE-1063).

On small traces the integer program's optimum equals an exhaustive search over every schedule of
keeps the replay's rules allow; on the built-in workloads it is at least every policy's replay and
Belady's MIN, and its relaxation at least the optimum. Belady's MIN is not the optimum in tokens:
a fixed trace where it falls one token short.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.config.registry import create_pool
from kvref.contract.errors import InvalidValueError
from kvref.simulation.belady import belady_replay
from kvref.simulation.optimum import offline_optimum
from kvref.simulation.replay import hit_tokens, replay
from kvref.simulation.traces import Trace, TraceRequest
from kvref.simulation.workloads import workload_trace

pytest.importorskip("scipy", reason="the offline optimum needs SciPy (kvref[optimum])")

rule = pytest.mark.rule
BLOCK = 4


def exhaustive(trace: Trace, capacity: int, unit: str) -> int:
    """The best hits over every choice, at every request, of which cached blocks to keep (the replay's rules)."""
    best: dict[frozenset[int], int] = {frozenset(): 0}
    for request in trace.requests:
        ids = request.block_ids
        after: dict[frozenset[int], int] = {}
        for cached, value in best.items():
            hit = next((j for j, h in enumerate(ids) if h not in cached), len(ids))
            gain = hit if unit == "blocks" else hit_tokens(request.input_length, len(ids), hit, trace.block_size)
            held = frozenset(ids[:capacity])
            others = sorted(cached - held)
            for k in range(min(capacity - len(held), len(others)) + 1):
                for kept in itertools.combinations(others, k):
                    state = held | frozenset(kept)
                    after[state] = max(after.get(state, -1), value + gain)
        best = after
    return max(best.values())


@st.composite
def small_traces(draw: st.DrawFn) -> Trace:
    """Up to 7 requests, each the path from the root to a node of a tree of up to 7 blocks (prefix-chained ids)."""
    nodes = draw(st.integers(1, 7))
    parents = [draw(st.integers(0, i)) for i in range(nodes)]  # block i + 1's parent: 0 is the root

    def path(node: int) -> tuple[int, ...]:
        return (*path(parents[node - 1]), node) if node else ()

    requests = []
    for _ in range(draw(st.integers(1, 7))):
        ids = path(draw(st.integers(1, nodes)))
        tokens = (len(ids) - 1) * BLOCK + draw(st.integers(1, BLOCK))
        requests.append(TraceRequest(0, tokens, 1, ids))
    return Trace(tuple(requests), BLOCK, "small")


@rule("TRACE-1060", "TRACE-1061", "TRACE-1062")
@settings(max_examples=80, deadline=None)
@given(trace=small_traces(), capacity=st.integers(1, 4), unit=st.sampled_from(["blocks", "tokens"]))
def test_the_optimum_is_the_best_schedule_an_exhaustive_search_finds(trace: Trace, capacity: int, unit: str) -> None:
    optimum = offline_optimum(trace, capacity, unit=unit)
    want = exhaustive(trace, capacity, unit)
    assert optimum.exact and optimum.hits == pytest.approx(want), f"{unit} at {capacity}: {optimum.hits} != {want}"
    bound = offline_optimum(trace, capacity, unit=unit, exact=False)
    assert bound.hits >= want - 1e-6


@rule("TRACE-1060", "TRACE-1063")
@pytest.mark.parametrize("workload", ["chat", "agent"])
@pytest.mark.parametrize("capacity", [24, 96])
def test_the_optimum_is_at_least_every_policy_and_belady_and_at_most_its_relaxation(
    workload: str, capacity: int
) -> None:
    trace = workload_trace(workload, seed=1)
    for unit in ("blocks", "tokens"):
        optimum = offline_optimum(trace, capacity, unit=unit, warmup=0.1)
        bound = offline_optimum(trace, capacity, unit=unit, warmup=0.1, exact=False)
        assert optimum.exact and bound.hits >= optimum.hits - 1e-6
        runs = [
            replay(trace, create_pool(capacity + 1, backend="oracle", policy=p), warmup=0.1)
            for p in ("lru", "lru-leaf", "fifo")
        ]
        runs.append(belady_replay(trace, capacity, warmup=0.1))
        for run in runs:
            got = run.block_hits if unit == "blocks" else run.token_hits
            assert optimum.hits >= got - 1e-6, f"{run.policy} hit {got} {unit}, above the optimum {optimum.hits}"
            assert optimum.total == (run.blocks if unit == "blocks" else run.tokens)


@rule("TRACE-1060")
def test_belady_is_not_the_optimum_in_tokens() -> None:
    """Capacity 3, blocks of 4 tokens: keeping block 2 (a full block) over block 1's later short reuse
    gains a token that MIN, which looks only at next uses, gives away."""
    lists = [(1, 2), (1,), (3, 4), (1,), (1, 2), (1, 2)]
    tokens = [6, 3, 6, 1, 6, 6]
    trace = Trace(tuple(TraceRequest(0, n, 1, ids) for ids, n in zip(lists, tokens, strict=True)), BLOCK, "fixed")
    assert belady_replay(trace, 3).token_hits == 14
    assert offline_optimum(trace, 3, unit="tokens").hits == 15 == exhaustive(trace, 3, "tokens")


@rule("TRACE-1060")
@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"capacity": 0}, "capacity"),
        ({"capacity": 2.0}, "capacity"),
        ({"unit": "bytes"}, "unit"),
        ({"warmup": 1.0}, "warmup"),
        ({"time_limit": 0}, "time_limit"),
        ({"time_limit": 5, "exact": False}, "time_limit"),
    ],
)
def test_a_bad_argument_is_refused_naming_it(kwargs: dict[str, object], says: str) -> None:
    arguments: dict[str, object] = {"capacity": 4, **kwargs}
    capacity = arguments.pop("capacity")
    with pytest.raises(InvalidValueError, match=says):
        offline_optimum(workload_trace("chat", seed=1), capacity, **arguments)  # type: ignore[arg-type]


@rule("TRACE-1063", "TRACE-1017", "CONF-912")
def test_replay_curve_with_optimum_puts_min_and_the_bound_beside_every_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvref.cli.main import main

    assert main(["replay", "--workload", "agent", "--curve", "--optimum", "--json", "--out", str(tmp_path)]) == 0
    points = json.loads(capsys.readouterr().out)["points"]
    assert len(points) >= 3
    for p in points:
        assert p["bound_block"] + 1e-9 >= p["belady_block"] >= p["block_hit_rate"] - 1e-9, p
        assert p["bound_token"] + 1e-9 >= p["belady_token"] >= p["token_hit_rate"] - 1e-9, p
    assert len(json.loads((tmp_path / "curve.json").read_text(encoding="utf-8"))["optimum"]) == len(points)
    assert (tmp_path / "curve.png").stat().st_size > 0
    assert main(["replay", "--workload", "agent", "--optimum", "--capacity", "64"]) == 2
    assert "[TRACE-1063]" in capsys.readouterr().err


@rule("TRACE-1060", "TRACE-1063", "TRACE-1006")
def test_a_trace_with_nothing_to_hit_or_no_request_has_an_optimum_of_zero_and_a_non_tree_is_refused() -> None:
    from kvref.simulation.traces import TraceError

    for requests in [(), (TraceRequest(0, 8, 1, (1, 2)), TraceRequest(0, 8, 1, (3, 4)))]:
        optimum = offline_optimum(Trace(requests, BLOCK, "none"), 4)
        assert optimum.exact and optimum.hits == 0 and str(optimum.hit_rate) == "0.0"
    with pytest.raises(TraceError, match="TRACE-1006"):
        offline_optimum(Trace((TraceRequest(0, 8, 1, (1, 1)),), BLOCK, "twice"), 4)


@rule("TRACE-1063")
def test_a_program_stopped_at_its_time_limit_reports_a_bound_marked_as_one() -> None:
    trace = workload_trace("chat", seed=1)
    optimum = offline_optimum(trace, 64)
    stopped = offline_optimum(trace, 64, time_limit=1e-3)
    assert not stopped.exact and stopped.hits >= optimum.hits - 1e-6 and 0.0 <= stopped.gap <= 1.0
