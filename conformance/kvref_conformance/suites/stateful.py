"""Stateful models: differential state machines for the pool, the cache per policy, the batches."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvref_conformance.machines import make_machine
from kvref_conformance.suites.base import ConformanceSuite, first_policy, requires, rule
from kvref_conformance.target import Target

__all__ = ["StatefulSuite"]


class StatefulSuite(ConformanceSuite):
    """Random interleavings of every operation, compared step by step with the oracle."""

    @rule(
        "STATE-001",
        "STATE-002",
        "STATE-003",
        "POOL-102",
        "POOL-104",
        "POOL-106",
        "POOL-107",
        "POOL-108",
        "POOL-111",
        "POOL-113",
        "ERR-501",
    )
    def test_the_pool_behaves_like_the_oracle(self, impl: Target) -> None:
        run_state_machine_as_test(make_machine(impl, first_policy(impl), cache=False), settings=settings())

    @rule(
        "STATE-004",
        "STATE-006",
        "PFX-307",
        "PFX-312",
        "PFX-316",
        "PFX-317",
        "PFX-318",
        "PFX-321",
        "EVICT-401",
        "EVICT-403",
        "EVICT-404",
        "EVICT-405",
        "EVICT-406",
        "EVICT-408",
        "EVICT-411",
    )
    @requires("prefix-cache")
    @pytest.mark.parametrize("policy", ["lru", "lru-leaf", "ref-zero", "fifo", "lru-leaf-access"])
    def test_the_prefix_cache_behaves_like_the_oracle(self, impl: Target, policy: str) -> None:
        self.pool(impl, 2, policy=policy)  # skips when the policy is not offered
        run_state_machine_as_test(make_machine(impl, policy), settings=settings())

    @rule("POOL-116", "POOL-117", "PFX-320", "EVICT-411")
    @requires("batching")
    @pytest.mark.parametrize("policy", ["lru", "lru-leaf-access"])
    def test_the_batched_forms_behave_like_the_single_operations(self, impl: Target, policy: str) -> None:
        self.pool(impl, 2, policy=policy)  # skips when the policy is not offered
        run_state_machine_as_test(make_machine(impl, policy, batches=True), settings=settings())

    @rule(
        "POOL-113", "POOL-114", "POOL-116", "POOL-121", "EVICT-401", "EVICT-403", "EVICT-406", "EVICT-408", "EVICT-411"
    )
    @pytest.mark.parametrize("policy", ["lru", "lru-leaf", "fifo", "lru-leaf-access"])
    def test_the_blind_spots_made_on_purpose_behave_like_the_oracle(self, impl: Target, policy: str) -> None:
        """The machine with the targeted steps: a paused holder in every operation, hashless blocks
        released among cached ones before an evicting allocation, an admission that does not fit.
        Without a prefix cache the policy does not matter, and only the first one offered runs."""
        if not impl.has("prefix-cache") and policy != first_policy(impl):
            pytest.skip(f"no prefix cache: the policy does not matter, {first_policy(impl)} runs")
        self.pool(impl, 2, policy=policy)  # skips when the policy is not offered
        run_state_machine_as_test(make_machine(impl, policy, targeted=True), settings=settings())

    @rule("POOL-104", "POOL-105", "STATE-003", "PFX-307", "EVICT-401", "EVICT-404", "EVICT-408")
    @requires("prefix-cache")
    @pytest.mark.parametrize("policy", ["lru", "lru-leaf", "fifo", "lru-leaf-access"])
    def test_a_pool_of_thousands_of_blocks_behaves_like_the_oracle(self, impl: Target, policy: str) -> None:
        """The machine over pools of 300 and 3,000 blocks, with steps that take a share of the pool at
        once (:mod:`kvref_conformance.machines.large_steps`): what depends on size (the free stack
        wrapping around, the prefix index growing, hundreds of blocks evicted in one call). A fifth
        of the profile's examples, as each step moves hundreds of blocks."""
        self.pool(impl, 2, policy=policy)  # skips when the policy is not offered
        profile = settings()
        fewer = settings(profile, max_examples=max(8, profile.max_examples // 5))
        run_state_machine_as_test(make_machine(impl, policy, large=True), settings=fewer)
