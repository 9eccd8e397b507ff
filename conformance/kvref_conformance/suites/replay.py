"""Chapter 10, one-call replay (TRACE-1019, TRACE-1020), for implementations with ``replay``.

The implementation's ``replay_requests`` runs beside the oracle replaying the same requests by
protocol calls (:func:`kvref.simulation.replay.replay_stepwise`); hits, peak occupancy, counts, resident
hashes, statistics and events must agree, and with the ``exact-order`` profile every block too.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvref.contract.errors import HashConflictError, InvalidTypeError
from kvref.oracle import OracleBlockPool
from kvref.simulation.replay import replay_stepwise
from kvref.simulation.workloads import workload_trace
from kvref_conformance.observe import describe_change, observe
from kvref_conformance.suites.base import ConformanceSuite, fails_unchanged, requires, rule
from kvref_conformance.target import Target

__all__ = ["ReplaySuite"]

POLICIES = ("lru", "lru-leaf", "ref-zero", "fifo", "lru-leaf-access")


def workload(name: str, seed: int) -> list[list[int]]:
    """A generated workload's requests as block hash chains (blocks of 16 tokens)."""
    trace = workload_trace(name, seed=seed)
    return [list(r.block_ids) for r in trace.requests]


def summary(pool: Any) -> dict[str, Any]:
    """What must agree whatever block ids an implementation chose (POOL-115)."""
    return {
        "num_free": pool.num_free,
        "num_in_use": pool.num_in_use,
        "num_cached": pool.num_cached,
        "resident": set(pool.resident_hashes()),
        "stats": pool.stats,
    }


@requires("prefix-cache", "replay")
class ReplaySuite(ConformanceSuite):
    """``replay_requests`` against the oracle's protocol-call replay."""

    def agree(self, impl: Target, pool: Any, oracle: OracleBlockPool, batch: list[list[int]], what: str) -> None:
        got = pool.replay_requests(batch)
        want = replay_stepwise(oracle, batch, first_holder=1_000_000)
        assert list(got.hits) == want.hits, (
            f"[TRACE-1019] {what}: replay_requests hit {list(got.hits)[:12]}..., the protocol calls {want.hits[:12]}..."
        )
        assert got.peak_occupied == want.peak_occupied, (
            f"[TRACE-1019] {what}: peak occupancy {got.peak_occupied}, the protocol calls reach {want.peak_occupied}"
        )
        mine, spec = summary(pool), summary(oracle)
        assert mine == spec, f"[TRACE-1019] {what}: after replay_requests {describe_change(spec, mine)}"
        if impl.has("events"):
            events, expected = pool.take_events(), oracle.take_events()
            assert events == expected, (
                f"[TRACE-1019] {what}: replay_requests emitted {events[:6]}..., the protocol calls {expected[:6]}..."
            )
        if impl.profile == "exact-order":
            mine_full, spec_full = observe(pool), observe(oracle)
            assert mine_full == spec_full, (
                f"[TRACE-1019] {what}: exact-order profile: {describe_change(spec_full, mine_full)}"
            )

    @rule("TRACE-1019")
    @pytest.mark.parametrize("policy", POLICIES)
    @pytest.mark.parametrize("name", ["chat", "agent", "few-shot"])
    def test_replay_requests_counts_and_caches_as_the_protocol_calls_do(
        self, impl: Target, policy: str, name: str
    ) -> None:
        events = impl.has("events")
        pool = self.pool(impl, 30, policy=policy, enable_events=events)
        oracle = OracleBlockPool(30, policy=policy, enable_events=events)
        lists = workload(name, seed=7)
        half = len(lists) // 2
        self.agree(impl, pool, oracle, lists[:half], f"{name} under {policy}, first half")
        self.agree(impl, pool, oracle, lists[half:], f"{name} under {policy}, second half")
        self.check(pool)

    @rule("TRACE-1019", "PFX-310")
    @pytest.mark.parametrize("policy", POLICIES)
    def test_blocks_other_holders_hold_stay_held_and_are_never_evicted(self, impl: Target, policy: str) -> None:
        events = impl.has("events")
        pool = self.pool(impl, 12, policy=policy, enable_events=events)
        oracle = OracleBlockPool(12, policy=policy, enable_events=events)
        kept = pool.allocate(3, holder="keeper")
        pool.register(kept, [901, 902, 903])
        oracle.register(oracle.allocate(3, holder="keeper"), [901, 902, 903])
        if events:
            pool.take_events()
            oracle.take_events()
        batch = [[901, 902, 904], *workload("unique", seed=2)[:30], [901, 902, 903, 905]]
        self.agree(impl, pool, oracle, batch, f"beside a held chain under {policy}")
        for b in kept:
            assert pool.holders(b) == {"keeper": 1}, (
                f"[TRACE-1019] block {b} of the held chain has holders {pool.holders(b)} after replay_requests; "
                "the keeper's single reference must be untouched"
            )
        assert pool.resident_hashes() >= {901, 902, 903}, "[PFX-310] a held block was evicted by replay_requests"
        pool.free(kept[::-1], holder="keeper")
        self.check(pool)

    @rule("TRACE-1020", "ERR-501", "ERR-521")
    @pytest.mark.parametrize(
        ("batch", "rule_id"),
        [([[1, 2], [3, 2]], "TRACE-1006"), ([[5, 6, 5]], "TRACE-1006"), ([[4, 2]], "PFX-306")],
        ids=["two-parents", "repeated", "resident-parent"],
    )
    def test_a_batch_that_is_not_a_prefix_tree_is_refused_whole(
        self, impl: Target, batch: list[list[int]], rule_id: str
    ) -> None:
        pool = self.pool(impl, 8)
        pool.register(pool.allocate(2, holder="keeper"), [1, 2])
        exc = fails_unchanged(pool, lambda: pool.replay_requests(batch), HashConflictError, rule_id)
        assert "replay_requests: block_lists[" in str(exc), f"[ERR-521] {str(exc)!r} names no call and entry"

    @rule("TRACE-1020", "ERR-503", "ERR-521")
    @pytest.mark.parametrize(
        ("batch", "argument"), [([[1, 2], [3, "4"]], "block_lists[1]"), (7, "block_lists"), ("12", "block_lists")]
    )
    def test_a_batch_of_non_integers_is_refused_whole(self, impl: Target, batch: Any, argument: str) -> None:
        pool = self.pool(impl, 8)
        exc = fails_unchanged(pool, lambda: pool.replay_requests(batch), InvalidTypeError, "ERR-503")
        assert f"replay_requests: {argument}" in str(exc), f"[ERR-521] {str(exc)!r} does not name {argument}"
