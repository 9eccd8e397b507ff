"""Replay speed of every usable backend (pytest-benchmark; `nox -s bench`): TRACE-1014, TRACE-1019.

The built-in chat workload at 256 blocks, under each policy, replayed by protocol calls
(``stepwise``) on every usable backend and in one call (``fused``) where a backend has the
``replay`` capability; and the Mooncake conversation trace at 10,000 blocks on the oracle, both
ways, where the trace is present. A round is one whole replay into a fresh pool (made outside
the timing); ``blocks_per_round`` is the number of block references, so the report's us/block is
the inverse of block references per second. Every round's hits are checked against the oracle's
protocol-call replay, so a benchmark that stopped replaying fails.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

from kvref.oracle import OracleBlockPool
from kvref.simulation.replay import collector_paused, replay_stepwise
from kvref.simulation.traces import load_trace
from kvref.simulation.workloads import workload_trace

pytestmark = pytest.mark.benchmark_suite

POLICIES = ["lru", "lru-leaf", "ref-zero", "fifo"]
MOONCAKE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


@cache
def chains(workload: str) -> tuple[tuple[int, ...], ...]:
    if workload == "mooncake":
        return tuple(r.block_ids for r in load_trace(MOONCAKE).requests)
    trace = workload_trace(workload)
    return tuple(r.block_ids for r in trace.requests)


@cache
def expected_hits(workload: str, policy: str, capacity: int) -> list[int]:
    return replay_stepwise(OracleBlockPool(capacity + 1, policy=policy), chains(workload)).hits


def bench_replay(
    benchmark: Any, backend: Any, device: str | None, workload: str, policy: str, capacity: int, mode: str
) -> None:
    if mode == "fused" and "replay" not in backend.capabilities():
        pytest.skip(f"{backend.name} has no one-call replay (capability 'replay')")
    if f"policy-{policy}" not in backend.capabilities():
        pytest.skip(f"{backend.name} lacks policy {policy}")
    lists = chains(workload)
    refs = sum(map(len, lists))
    benchmark.extra_info.update(
        backend=backend.name,
        device=backend.device(device),
        blocks_per_round=refs,
        workload=f"replay[{workload}, {policy}, {capacity:,} blocks, {mode}]",
    )
    results: list[Any] = []

    def fresh_pool() -> tuple[tuple[Any], dict[str, Any]]:
        return (backend.create(capacity + 1, policy=policy, device=device),), {}

    def run(pool: Any) -> None:
        with collector_paused():
            results.append(pool.replay_requests(lists) if mode == "fused" else replay_stepwise(pool, lists))

    benchmark.pedantic(run, setup=fresh_pool, rounds=3, iterations=1)
    want = expected_hits(workload, policy, capacity)
    for result in results:
        assert list(result.hits) == want, (
            f"[TRACE-1018] {backend.name} ({mode}) hit {sum(result.hits)} blocks of {workload} under {policy}, "
            f"the oracle's protocol calls {sum(want)}"
        )


@pytest.mark.parametrize("mode", ["fused", "stepwise"])
@pytest.mark.parametrize("policy", POLICIES)
def test_replay_the_chat_workload(benchmark: Any, backend: Any, device: str | None, policy: str, mode: str) -> None:
    bench_replay(benchmark, backend, device, "chat", policy, 256, mode)


@pytest.mark.skipif(not MOONCAKE.exists(), reason=f"the Mooncake trace is not at {MOONCAKE}")
@pytest.mark.parametrize("mode", ["fused", "stepwise"])
@pytest.mark.parametrize("policy", POLICIES)
def test_replay_the_mooncake_trace(
    benchmark: Any, backend: Any, device: str | None, measuring: bool, policy: str, mode: str
) -> None:
    if backend.name != "oracle":
        pytest.skip("the whole Mooncake trace is replayed on the oracle only: device backends take minutes")
    if not measuring:
        pytest.skip("the whole Mooncake trace is measured by `nox -s bench` only")
    bench_replay(benchmark, backend, device, "mooncake", policy, 10_000, mode)
