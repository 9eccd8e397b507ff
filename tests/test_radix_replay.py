"""Replay through chapter 06's radix cache (TRACE-1021) and beside the hash-block cache (TRACE-1022)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.contract.errors import InvalidValueError
from kvref.oracle.backend import OracleBackend
from kvref.oracle.blockpool.pool import OracleBlockPool
from kvref.simulation.radix_replay import RADIX_POLICIES, radix_replay
from kvref.simulation.replay import infinite_capacity_hits, replay
from kvref.simulation.traces import Trace, TraceRequest
from kvref.simulation.workloads import workload_trace


def trace_of(*requests: list[int], block_size: int = 4) -> Trace:
    """A trace of the given block-id lists, each a full prompt of whole blocks."""
    return Trace(
        tuple(TraceRequest(i, len(ids) * block_size, 1, tuple(ids)) for i, ids in enumerate(requests)),
        block_size,
        "test",
    )


#: Prefix-tree traces (TRACE-1006): each request a path from the root of a small tree, a block's
#: id spelling its whole path (digits 1-4), so that an id always follows the same parent.
paths = st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=5), min_size=1, max_size=25).map(
    lambda branches: [[int("".join(map(str, b[: d + 1]))) for d in range(len(b))] for b in branches]
)


@pytest.mark.rule("TRACE-1021", "TRACE-1016")
@settings(max_examples=60, deadline=None)
@given(requests=paths, policy=st.sampled_from(RADIX_POLICIES))
def test_a_radix_cache_that_never_evicts_hits_what_the_infinite_cache_hits(
    requests: list[list[int]], policy: str
) -> None:
    trace = trace_of(*requests)
    result = radix_replay(trace, trace.block_references + 1, policy=policy)
    assert (result.block_hits, result.token_hits) == infinite_capacity_hits(trace), (
        f"[TRACE-1021] radix-{policy} with room for every block hit {result.block_hits} blocks; "
        f"a cache that never evicts hits {infinite_capacity_hits(trace)[0]}"
    )
    assert result.evictions == 0, f"[TRACE-1021] radix-{policy} evicted {result.evictions} with room for all"


@pytest.mark.rule("TRACE-1021", "TRACE-1015")
@settings(max_examples=60, deadline=None)
@given(requests=paths, capacity=st.integers(1, 8), policy=st.sampled_from(RADIX_POLICIES))
def test_a_small_radix_cache_never_holds_more_than_its_capacity(
    requests: list[list[int]], capacity: int, policy: str
) -> None:
    trace = trace_of(*requests)
    result = radix_replay(trace, capacity, policy=policy)
    assert result.peak_occupancy <= capacity, f"[TRACE-1015] peak {result.peak_occupancy} over capacity {capacity}"
    assert result.block_hits <= infinite_capacity_hits(trace)[0], (
        f"[TRACE-1021] radix-{policy} at {capacity} pages hit more ({result.block_hits}) than a cache that never evicts"
    )


@pytest.mark.rule("TRACE-1021")
def test_the_radix_cache_evicts_whole_leaves_where_the_hash_cache_evicts_a_block() -> None:
    trace = trace_of([1, 2], [1, 2], [3], [1, 2])
    radix = radix_replay(trace, 2, policy="lru")
    hashed = replay(trace, OracleBlockPool(3, policy="lru"))
    assert radix.block_hits == 2, f"[TRACE-1021] radix-lru hit {radix.block_hits}: [3] evicts the leaf [1, 2] whole"
    assert hashed.block_hits == 3, (
        f"the hash cache evicts only block 2 for [3] and hits 1 again; it hit {hashed.block_hits}"
    )


@pytest.mark.rule("TRACE-1021")
def test_a_radix_replay_refuses_a_policy_the_radix_cache_lacks() -> None:
    with pytest.raises(InvalidValueError, match="TRACE-1021"):
        radix_replay(trace_of([1]), 4, policy="lru-leaf")


@pytest.mark.rule("TRACE-1022")
def test_replay_cache_both_reports_both_caches_on_the_same_trace() -> None:
    command = [
        sys.executable,
        "-m",
        "kvref",
        "replay",
        "--capacity",
        "64",
        "--cache",
        "both",
        "--policy",
        "lru",
        "--policy",
        "lfu",
        "--json",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"kvref replay --cache both failed: {done.stderr[-2000:]}"
    rows = json.loads(done.stdout)
    policies = [r["policy"] for r in rows]
    assert policies == ["lru", "radix-lru", "radix-lfu"], (
        f"[TRACE-1022] --cache both --policy lru --policy lfu replayed {policies}: lru on both caches, lfu on the radix"
    )
    assert len({(r["source"], r["requests"], r["blocks"]) for r in rows}) == 1, (
        "[TRACE-1022] the two caches replayed different requests"
    )


class NoRadixCache(OracleBackend):
    """The oracle's block pool alone: a backend that offers no radix cache."""

    name = "no-radix"

    def capabilities(self) -> frozenset[str]:
        return super().capabilities() - {"radix-cache", "radix-events", "radix-capacity", "radix-receipts"}


@pytest.mark.rule("TRACE-1021")
@pytest.mark.parametrize("backend", ["torch", "cupy"])
def test_a_device_backends_radix_cache_replays_a_workload_as_the_oracles_does(backend: str) -> None:
    pytest.importorskip(backend, reason=f"{backend} is not installed here")
    trace = workload_trace("chat", seed=2)
    for policy in ("lru", "lfu"):
        ours, theirs = radix_replay(trace, 200, policy=policy), radix_replay(trace, 200, policy=policy, backend=backend)
        assert (theirs.token_hits, theirs.evictions, theirs.peak_occupancy) == (
            ours.token_hits,
            ours.evictions,
            ours.peak_occupancy,
        ), f"{backend} under {policy}: {theirs} against the oracle's {ours}"
        assert theirs.backend == f"{backend} (radix)"


@pytest.mark.rule("TRACE-1021")
def test_a_radix_replay_refuses_a_backend_without_a_radix_cache() -> None:
    with pytest.raises(InvalidValueError, match=r"\[TRACE-1021\].*offers no radix cache"):
        radix_replay(workload_trace("chat", seed=2), 200, backend="tests.test_radix_replay:NoRadixCache")
