"""The oracle's tier store beyond the conformance suite: its own invariants under random calls, its
refusals leaving its whole state (the policy's order included) as it was, and tiered_prefix's checks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.contract.errors import ConfigError, InvalidValueError, InvariantViolation, TierStateError
from kvref.contract.tiers import apply_tier_events
from kvref.oracle.tiers import OracleTierStore, tiered_prefix

CALLS = st.lists(
    st.tuples(
        st.sampled_from(["store", "complete", "fail", "load", "unload", "finish", "touch", "reset"]),
        st.integers(0, 2),
        st.lists(st.integers(0, 9), min_size=1, max_size=4),
    ),
    max_size=60,
)


@pytest.mark.rule("TIER-1105", "TIER-1106", "TIER-1109", "TIER-1114", "TIER-1116", "TIER-1122")
@pytest.mark.parametrize("policy", ["lru", "arc"])
@settings(max_examples=150, deadline=None)
@given(calls=CALLS)
def test_the_oracle_keeps_its_invariants_under_any_calls(policy: str, calls: list[tuple[str, int, list[int]]]) -> None:
    tier = OracleTierStore(3, policy=policy, enable_events=True)
    for call, request, keys in calls:
        try:
            if call == "store":
                tier.prepare_store(keys, request=request)
            elif call in ("complete", "fail"):
                tier.complete_store(keys, request=request, success=call == "complete")
            elif call == "load":
                tier.prepare_load(keys, request=request)
            elif call == "unload":
                tier.complete_load(keys, request=request)
            elif call == "finish":
                tier.finish_request(request)
            elif call == "touch":
                tier.touch(keys)
            else:
                tier.reset()
        except TierStateError:
            pass
        tier.check_invariants()


@pytest.mark.rule("TIER-1108", "TIER-1113", "TIER-1115")
def test_a_refused_call_leaves_the_oracles_whole_state_as_it_was() -> None:
    tier = OracleTierStore(2, policy="arc")
    tier.prepare_store([1, 2], request="a")
    tier.complete_store([1], request="a")
    tier.finish_request("a")
    tier.prepare_load([1], request="b")
    before = tier.snapshot()
    assert tier.prepare_store([3], request="c") is None
    with pytest.raises(TierStateError, match=r"\[TIER-1113\]"):
        tier.prepare_load([1, 2], request="c")
    with pytest.raises(TierStateError, match=r"\[TIER-1115\]"):
        tier.complete_load([1, 1], request="b")
    assert tier.snapshot() == before


@pytest.mark.rule("TIER-1106")
def test_the_invariant_check_names_a_slot_both_held_and_free() -> None:
    class LeakyStore(OracleTierStore):
        def complete_store(self, keys: object, *, request: object, success: bool = True) -> None:
            super().complete_store(keys, request=request, success=success)
            self._free.append(0)  # slot 0 freed while its key still holds it

    tier = LeakyStore(3)
    tier.prepare_store([1, 2], request="a")
    tier.complete_store([1, 2], request="a")
    with pytest.raises(InvariantViolation, match=r"\[TIER-1106\]"):
        tier.check_invariants()


@pytest.mark.rule("TIER-1101", "TIER-1125")
def test_tiered_prefix_and_creation_refuse_bad_numbers() -> None:
    with pytest.raises(ConfigError, match=r"\[TIER-1101\]"):
        OracleTierStore(3, policy="fifo")
    tier = OracleTierStore(3)
    with pytest.raises(InvalidValueError, match=r"\[TIER-1125\]"):
        tiered_prefix([1, 2], 3, [tier])
    assert tiered_prefix([], 0, []) is not None


@pytest.mark.rule("TIER-1123", "TIER-1124")
def test_the_oracles_reset_reports_every_ready_key_removed_so_events_rebuild_the_empty_tier() -> None:
    tier = OracleTierStore(3, enable_events=True)
    tier.prepare_store([1, 2, 3], request="a")
    tier.complete_store([1, 2], request="a")
    tier.reset()
    assert apply_tier_events(set(), tier.take_events()) == set() == set(tier.resident())
