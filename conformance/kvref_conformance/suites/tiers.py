"""Chapter 11's tier store (TIER-1101..TIER-1125): two-phase stores and loads, pins, lru and arc, events.

For any target with ``tier-store`` (``create_tier``). The rule tests drive one tier with the calls
an engine's scheduler makes (prepare a store, complete it, look up, prepare a load, complete it,
end the request) and read it back through ``state``, ``pins``, ``slot`` and ``num_free``; the
arc tests read the policy's lists through ``policy_state``. The machine
(:class:`TierMachine`) runs random call sequences beside the oracle with a shadow KV store:
each store writes its key's KV into the slots the target returned, and each load must read back
exactly the KV stored for its key (TIER-1105).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, run_state_machine_as_test
from hypothesis.stateful import rule as step

from kvref.contract.errors import ConfigError, InvalidTypeError, KVRefError, TierStateError
from kvref.contract.tiers import StorePlan, apply_tier_events
from kvref.oracle.tiers import OracleTierStore, tiered_prefix
from kvref_conformance.suites.base import ConformanceSuite, corner, requires, rule, skip_without
from kvref_conformance.target import Target

__all__ = ["TierMachine", "TierSuite", "refused_unchanged", "stored", "tier_view"]

#: The keys the tests name: small integers, as a block hash may be.
KEYS = tuple(range(1, 13))


def tier_view(tier: Any, keys: tuple[int, ...] = KEYS) -> dict[str, Any]:
    """What a caller sees of ``tier``: each key's state, pins and slot, and the free slots."""
    return {
        "keys": {key: (tier.state(key), tier.pins(key), tier.slot(key)) for key in keys},
        "num_free": tier.num_free,
    }


def stored(tier: Any, keys: list[int], request: Hashable = "writer", *, finish: bool = True) -> StorePlan:
    """Prepare and complete a store of ``keys`` for ``request``, then end the request."""
    plan: StorePlan | None = tier.prepare_store(keys, request=request)
    assert plan is not None, f"[TIER-1104] a store of {keys} into a tier with room was refused"
    tier.complete_store(list(plan.keys), request=request)
    if finish:
        tier.finish_request(request)
    return plan


def loaded(tier: Any, keys: list[int], request: Hashable = "reader") -> None:
    """Load ``keys`` for ``request`` from start to end, then end the request."""
    tier.prepare_load(keys, request=request)
    tier.complete_load(keys, request=request)
    tier.finish_request(request)


def refused_unchanged(tier: Any, call: Callable[[], Any], error: type[KVRefError], rule_id: str) -> None:
    """``call`` raises ``error`` naming ``rule_id`` and leaves every key, pin, slot and event as it was."""
    tier.take_events()
    before = tier_view(tier)
    try:
        call()
    except Exception as raised:  # the class is the verdict
        exc: Exception = raised
    else:
        pytest.fail(f"[{rule_id}] no error raised; the rule requires {error.__name__}")
    assert isinstance(exc, error), (
        f"[{rule_id}] raised {type(exc).__name__} ({exc}); the rule requires {error.__name__}"
    )
    assert isinstance(exc, KVRefError) and exc.rule == rule_id, f"[{rule_id}] raised {exc!r}, naming another rule"
    after = tier_view(tier)
    changed = {
        key: (before["keys"][key], after["keys"][key]) for key in KEYS if before["keys"][key] != after["keys"][key]
    }
    assert not changed and before["num_free"] == after["num_free"], (
        f"[{rule_id}] a refused call changed the tier: (state, pins, slot) before -> after {changed}, "
        f"free slots {before['num_free']} -> {after['num_free']}"
    )
    assert tier.take_events() == [], f"[{rule_id}] a refused call reported events"


@requires("tier-store")
class TierSuite(ConformanceSuite):
    """TIER-1101..TIER-1125 over the target's ``create_tier(capacity, policy=..., enable_events=True)``."""

    @staticmethod
    def tier(impl: Target, capacity: int = 4, *, policy: str = "lru") -> Any:
        """A new tier of ``capacity`` slots under ``policy`` (arc skips without ``tier-arc``)."""
        if policy == "arc":
            skip_without(impl, "tier-arc")
        return impl.create_tier(capacity, policy=policy, enable_events=impl.has("tier-events"))

    # -- store --------------------------------------------------------------------------------

    @rule("TIER-1104", "TIER-1110", "TIER-1103")
    def test_a_store_is_pending_until_it_completes_then_a_hit(self, impl: Target) -> None:
        tier = self.tier(impl)
        plan = tier.prepare_store([1, 2, 3], request="r")
        assert plan is not None and list(plan.keys) == [1, 2, 3], f"[TIER-1104] store of [1, 2, 3] planned {plan}"
        assert [tier.lookup(key) for key in (1, 2, 3, 4)] == ["pending"] * 3 + ["miss"], (
            "[TIER-1103] keys whose store is prepared look up as pending, an absent one as a miss"
        )
        tier.complete_store([1, 2, 3], request="r")
        assert [tier.lookup(key) for key in (1, 2, 3)] == ["hit"] * 3, "[TIER-1110] a completed store is a hit"
        assert [tier.pins(key) for key in (1, 2, 3)] == [0, 0, 0], "[TIER-1110] a stored key has no pin"

    @rule("TIER-1104")
    def test_a_store_plans_only_the_absent_keys_in_the_calls_order(self, impl: Target) -> None:
        tier = self.tier(impl, 8)
        stored(tier, [5, 1])
        pending = tier.prepare_store([7], request="other")
        assert pending is not None
        plan = tier.prepare_store([3, 5, 7, 2, 1], request="r")
        assert plan is not None and list(plan.keys) == [3, 2], (
            f"[TIER-1104] with 5 and 1 ready and 7 pending, a store of [3, 5, 7, 2, 1] planned {plan}, not [3, 2]"
        )

    @corner
    @rule("TIER-1104", "TIER-1106")
    def test_a_key_named_twice_in_one_store_is_stored_once(self, impl: Target) -> None:
        tier = self.tier(impl)
        plan = tier.prepare_store([1, 2, 1], request="r")
        assert plan is not None and list(plan.keys) == [1, 2], f"[TIER-1104] a store of [1, 2, 1] planned {plan}"
        tier.complete_store([1, 2, 1], request="r")
        assert tier.num_free == 2, f"[TIER-1106] 2 keys in a tier of 4 leave {tier.num_free} slots free, not 2"

    @rule("TIER-1105", "TIER-1106")
    def test_every_key_holds_a_slot_of_its_own_and_slots_are_conserved(self, impl: Target) -> None:
        tier = self.tier(impl, 4)
        stored(tier, [1, 2])
        plan = tier.prepare_store([3, 4], request="r")
        assert plan is not None
        slots = [tier.slot(key) for key in (1, 2, 3, 4)]
        assert sorted(slots) == [0, 1, 2, 3], f"[TIER-1105] four keys in a tier of 4 hold slots {slots}"
        assert [tier.slot(key) for key in plan.keys] == list(plan.slots), "[TIER-1105] the plan's slots are its keys'"
        assert tier.num_free == 0, f"[TIER-1106] a full tier has {tier.num_free} free slots"
        tier.complete_store([3], request="r", success=False)
        assert tier.num_free == 1, "[TIER-1106] a failed store gives its slot back"

    @rule("TIER-1107", "TIER-1116")
    def test_a_full_tier_evicts_exactly_the_shortfall_never_a_key_the_store_names(self, impl: Target) -> None:
        tier = self.tier(impl, 4)
        stored(tier, [1, 2, 3, 4])
        plan = tier.prepare_store([4, 5, 6], request="r")
        assert plan is not None and list(plan.keys) == [5, 6] and len(plan.evicted) == 2, (
            f"[TIER-1107] storing 5 and 6 into a full tier of 4 planned {plan}; the rule evicts exactly 2"
        )
        assert 4 not in plan.evicted, "[TIER-1107] the store evicted 4, a key it names"
        assert set(plan.evicted) == {2, 3}, (
            f"[TIER-1116] evicted {plan.evicted}; 1..4 were used from 4 to 1 at their request's end, so 4 and 3 "
            "are the oldest and 4 is named: 3 and then 2 go"
        )

    @rule("TIER-1108", "TIER-1109", "TIER-1112")
    @pytest.mark.parametrize("policy", ["lru", "arc"])
    def test_a_store_that_cannot_evict_enough_returns_none_and_changes_nothing(self, impl: Target, policy: str) -> None:
        tier = self.tier(impl, 3, policy=policy)
        stored(tier, [1, 2])
        tier.prepare_load([1], request="reader")  # pinned
        assert tier.prepare_store([3], request="w") is not None  # pending: not evictable either
        tier.take_events()
        before = tier_view(tier)
        plan = tier.prepare_store([4, 5], request="r")
        assert plan is None, f"[TIER-1108] only 2 is evictable and the store needs 2 slots; it planned {plan}"
        assert tier_view(tier) == before, "[TIER-1108] a refused store changed the tier"
        assert tier.take_events() == [], "[TIER-1108] a refused store reported events"

    @rule("TIER-1109")
    def test_a_pending_key_is_not_evicted(self, impl: Target) -> None:
        tier = self.tier(impl, 2)
        assert tier.prepare_store([1], request="slow") is not None
        stored(tier, [2])
        plan = tier.prepare_store([3], request="r")
        assert plan is not None and list(plan.evicted) == [2], (
            f"[TIER-1109] with 1 pending and 2 ready, a store of 3 planned {plan}; only 2 may go"
        )
        assert tier.prepare_store([4], request="r2") is None, "[TIER-1109] pending keys were evicted"

    @rule("TIER-1110")
    def test_completing_a_key_that_is_not_pending_changes_nothing(self, impl: Target) -> None:
        tier = self.tier(impl)
        stored(tier, [1])
        loaded_slot = tier.prepare_load([1], request="reader")
        before = tier_view(tier)
        tier.complete_store([1, 9], request="writer")
        assert tier_view(tier) == before, "[TIER-1110] completing a ready key and an absent one changed the tier"
        assert tier.pins(1) == 1 and loaded_slot == [tier.slot(1)], "[TIER-1110] a second completion unpinned a key"

    @rule("TIER-1111", "TIER-1106")
    def test_a_failed_store_leaves_nothing_behind(self, impl: Target) -> None:
        tier = self.tier(impl, 4)
        stored(tier, [1])
        assert tier.prepare_store([2, 3], request="r") is not None
        tier.take_events()
        tier.complete_store([1, 2, 3], request="r", success=False)
        assert [tier.state(key) for key in (1, 2, 3)] == ["ready", "absent", "absent"], (
            "[TIER-1111] a failed store of 2 and 3 must drop them and leave the ready 1"
        )
        assert tier.num_free == 3 and tier.take_events() == [], "[TIER-1111] a failed store keeps slots or reports"
        assert tier.prepare_store([2], request="again") is not None, "[TIER-1111] a dropped key can be stored again"

    # -- load ---------------------------------------------------------------------------------

    @rule("TIER-1112", "TIER-1114")
    def test_a_load_pins_its_keys_until_it_completes(self, impl: Target) -> None:
        tier = self.tier(impl, 2)
        plan = stored(tier, [1, 2])
        slots = tier.prepare_load([2, 1], request="reader")
        assert list(slots) == [plan.slots[1], plan.slots[0]], f"[TIER-1112] load of [2, 1] returned slots {slots}"
        assert (tier.pins(1), tier.pins(2)) == (1, 1), "[TIER-1112] a load adds one pin per key"
        assert tier.prepare_store([3], request="w") is None, "[TIER-1112] a pinned key was evicted"
        tier.complete_load([2, 1], request="reader")
        assert (tier.pins(1), tier.pins(2)) == (0, 0), "[TIER-1114] a completed load takes its pin back"
        assert tier.prepare_store([3], request="w") is not None, "[TIER-1114] an unpinned key stays unevictable"

    @rule("TIER-1112", "TIER-1114")
    def test_two_loads_of_one_key_pin_it_twice(self, impl: Target) -> None:
        tier = self.tier(impl, 2)
        stored(tier, [1])
        tier.prepare_load([1], request="a")
        tier.prepare_load([1], request="b")
        tier.complete_load([1], request="a")
        assert tier.pins(1) == 1, f"[TIER-1114] two loads then one completion leave {tier.pins(1)} pins, not 1"

    @rule("TIER-1113", "TIER-1109")
    @pytest.mark.parametrize("state", ["absent", "pending"])
    def test_a_load_of_a_key_that_is_not_ready_is_refused_pinning_nothing(self, impl: Target, state: str) -> None:
        tier = self.tier(impl)
        stored(tier, [1])
        if state == "pending":
            assert tier.prepare_store([2], request="slow") is not None
        refused_unchanged(tier, lambda: tier.prepare_load([1, 2], request="r"), TierStateError, "TIER-1113")

    @rule("TIER-1115")
    @pytest.mark.parametrize("case", ["never loaded", "completed twice", "absent"])
    def test_completing_a_load_that_holds_no_pin_is_refused(self, impl: Target, case: str) -> None:
        tier = self.tier(impl)
        stored(tier, [1, 2])
        tier.prepare_load([1], request="r")
        if case == "completed twice":
            tier.complete_load([1], request="r")
        other = {"never loaded": 2, "completed twice": 1, "absent": 7}[case]
        keys = [1, other] if case != "completed twice" else [other]
        refused_unchanged(tier, lambda: tier.complete_load(keys, request="r"), TierStateError, "TIER-1115")

    # -- lru ----------------------------------------------------------------------------------

    @rule("TIER-1116", "TIER-1117")
    def test_lru_evicts_the_tail_of_the_oldest_prefix_first(self, impl: Target) -> None:
        tier = self.tier(impl, 4)
        stored(tier, [1, 2], request="old")
        stored(tier, [3, 4], request="new")
        plan = tier.prepare_store([5], request="r")
        assert plan is not None and list(plan.evicted) == [2], (
            f"[TIER-1116] evicted {plan and plan.evicted}; the oldest request's tail, 2, goes first (TIER-1117)"
        )

    @rule("TIER-1116")
    def test_lru_counts_a_load_as_a_use_at_its_requests_end_and_a_lookup_as_none(self, impl: Target) -> None:
        tier = self.tier(impl, 3)
        stored(tier, [1], request="a")
        stored(tier, [2], request="b")
        stored(tier, [3], request="c")
        tier.lookup(1)
        loaded(tier, [2])
        plan = tier.prepare_store([4, 5], request="r")
        assert plan is not None and list(plan.evicted) == [1, 3], (
            f"[TIER-1116] evicted {plan and plan.evicted}; 1 is oldest (a lookup is no use), 2 was loaded since"
        )

    @rule("TIER-1117")
    def test_touch_makes_the_first_key_the_most_recent(self, impl: Target) -> None:
        tier = self.tier(impl, 3)
        stored(tier, [1, 2, 3])
        tier.touch([3, 2])
        plan = tier.prepare_store([4, 5], request="r")
        assert plan is not None and list(plan.evicted) == [1, 2], (
            f"[TIER-1117] after touch([3, 2]) the order is 1, 2, 3 oldest first; evicted {plan and plan.evicted}"
        )

    @rule("TIER-1116", "TIER-1112")
    def test_lru_counts_a_touch_of_a_pinned_key_as_a_use(self, impl: Target) -> None:
        tier = self.tier(impl, 3)
        stored(tier, [1], request="a")
        stored(tier, [2], request="b")
        stored(tier, [3], request="c")
        tier.prepare_load([1], request="reader")
        tier.touch([1])  # while pinned: still a use
        tier.touch([2])
        tier.complete_load([1], request="reader")
        plan = tier.prepare_store([4, 5], request="r")
        assert plan is not None and list(plan.evicted) == [3, 1], (
            f"[TIER-1116] 1 was touched while pinned, then 2: the order is 3, 1, 2; evicted {plan and plan.evicted}"
        )

    # -- arc ----------------------------------------------------------------------------------

    @rule("TIER-1118", "TIER-1119", "TIER-1120")
    def test_arc_keeps_a_reused_key_and_evicts_the_one_used_once(self, impl: Target) -> None:
        tier = self.tier(impl, 2, policy="arc")
        stored(tier, [1], request="a")
        loaded(tier, [1], request="b")  # reused: T2
        stored(tier, [2], request="c")  # T1, more recent than 1
        lists = tier.policy_state()
        assert (lists["t1"], lists["t2"]) == ([2], [1]), f"[TIER-1119] T1, T2 = {lists['t1']}, {lists['t2']}"
        plan = tier.prepare_store([3], request="d")
        assert plan is not None and list(plan.evicted) == [2], (
            f"[TIER-1120] with target 0 arc evicts T1 first: 2, not the older reused 1; got {plan and plan.evicted}"
        )
        assert tier.policy_state()["b1"] == [2], "[TIER-1120] a key evicted from T1 enters B1"

    @rule("TIER-1121", "TIER-1118")
    def test_arc_grows_its_target_on_a_ghost_hit_in_b1_and_shrinks_it_on_one_in_b2(self, impl: Target) -> None:
        tier = self.tier(impl, 2, policy="arc")
        stored(tier, [1], request="a")
        loaded(tier, [1], request="b")
        stored(tier, [2], request="c")
        stored(tier, [3], request="d")  # evicts 2 into B1
        stored(tier, [2], request="e")  # a B1 hit: target 0 -> 1; evicts 3 (T1 holds 1 >= 1)
        state = tier.policy_state()
        assert state["target"] == 1 and 2 not in state["b1"], (
            f"[TIER-1121] a store of 2 found in B1 raises target by max(1, |B2|/|B1|) = 1 and drops 2 from B1: {state}"
        )
        loaded(tier, [2], request="f")  # 2 reused: T2 holds 1, 2
        stored(tier, [4], request="g")  # T1 is empty: evicts T2's oldest, 1, into B2
        stored(tier, [1], request="h")  # a B2 hit: target 1 -> 0
        assert tier.policy_state()["target"] == 0, f"[TIER-1121] a B2 hit lowers target: {tier.policy_state()}"

    @rule("TIER-1120", "TIER-1121")
    def test_arc_takes_from_t1_when_t2_has_nothing_to_evict(self, impl: Target) -> None:
        tier = self.tier(impl, 2, policy="arc")
        stored(tier, [1], request="a")
        stored(tier, [2], request="b")
        stored(tier, [3], request="c")  # evicts 1 into B1
        tier.touch([1])
        tier.touch([1])  # two ghost hits: target 2
        tier.touch([2])  # 2 is used again: T2
        state = tier.policy_state()
        assert (state["t1"], state["t2"], state["target"]) == ([3], [2], 2), f"[TIER-1121] {state}"
        plan = tier.prepare_store([2, 4], request="d")  # T1 holds fewer than target: T2 first, but 2 is named
        assert plan is not None and list(plan.evicted) == [3], (
            f"[TIER-1120] T2's only key is named by the store, so T1's 3 goes; got {plan}"
        )

    @rule("TIER-1122")
    def test_arc_ghost_lists_stay_within_capacity(self, impl: Target) -> None:
        tier = self.tier(impl, 2, policy="arc")
        for key in KEYS:
            stored(tier, [key], request=key)
            state = tier.policy_state()
            assert len(state["b1"]) <= 2 and len(state["b2"]) <= 2, f"[TIER-1122] ghosts grew past 2: {state}"

    # -- events and reset ---------------------------------------------------------------------

    @rule("TIER-1123")
    @requires("tier-events")
    def test_events_rebuild_the_ready_keys(self, impl: Target) -> None:
        tier = self.tier(impl, 3)
        plan = tier.prepare_store([1, 2, 3], request="a")
        assert plan is not None and tier.take_events() == [], "[TIER-1123] a prepared store is not yet stored"
        tier.complete_store([1, 2, 3], request="a")
        tier.finish_request("a")
        events = tier.take_events()
        assert [(list(e.keys), e.removed) for e in events] == [([1, 2, 3], False)], f"[TIER-1123] got {events}"
        assert tier.prepare_store([4], request="b") is not None
        removed = tier.take_events()
        assert [(list(e.keys), e.removed) for e in removed] == [([3], True)], f"[TIER-1123] eviction reported {removed}"
        tier.complete_store([4], request="b", success=False)
        assert tier.take_events() == [], "[TIER-1123] a failed store reported events"
        ready = {key for key in KEYS if tier.state(key) == "ready"}
        assert apply_tier_events(set(), [*events, *removed]) == ready, "[TIER-1123] the events do not rebuild the tier"

    @rule("TIER-1124")
    @pytest.mark.parametrize("policy", ["lru", "arc"])
    def test_reset_empties_the_tier_and_ignores_what_was_in_flight(self, impl: Target, policy: str) -> None:
        tier = self.tier(impl, 3, policy=policy)
        stored(tier, [1, 2])
        tier.prepare_load([1], request="r")
        assert tier.prepare_store([3], request="w") is not None
        tier.reset()
        assert all(tier.state(key) == "absent" for key in KEYS) and tier.num_free == 3, "[TIER-1124] reset kept keys"
        tier.complete_store([3], request="w")
        assert tier.state(3) == "absent", "[TIER-1124] a store prepared before reset completed after it"
        stored(tier, [4, 5, 6])
        assert tier.num_free == 0 and tier.prepare_store([7], request="x") is not None, (
            "[TIER-1124] after reset the whole capacity is free and every key evictable"
        )

    # -- bad input ----------------------------------------------------------------------------

    @rule("TIER-1101")
    @pytest.mark.parametrize("capacity", [0, -1, 2.5, True])
    def test_a_tier_without_a_positive_integer_capacity_is_refused(self, impl: Target, capacity: Any) -> None:
        with pytest.raises(ConfigError, match=r"\[TIER-1101\]"):
            impl.create_tier(capacity)

    @rule("TIER-1101")
    def test_an_unknown_policy_is_refused(self, impl: Target) -> None:
        with pytest.raises(ConfigError, match=r"\[TIER-1101\]"):
            impl.create_tier(4, policy="mru")

    @rule("TIER-1102")
    @pytest.mark.parametrize("keys", ["12", None, {1, 2}, [1, 2.5], [1, True], [[1]]], ids=repr)
    def test_keys_that_are_not_a_sequence_of_integers_are_refused(self, impl: Target, keys: Any) -> None:
        tier = self.tier(impl)
        stored(tier, [1])
        refused_unchanged(tier, lambda: tier.prepare_store(keys, request="r"), InvalidTypeError, "TIER-1102")

    # -- the longest prefix over tiers --------------------------------------------------------

    @rule("TIER-1125", "TIER-1103")
    def test_the_longest_prefix_runs_through_the_device_then_the_first_tier_with_each_key(self, impl: Target) -> None:
        host, disk = self.tier(impl, 4), self.tier(impl, 4)
        stored(host, [2, 4])
        stored(disk, [3, 4, 6])
        found = tiered_prefix([1, 2, 3, 4, 5, 6], 1, [host, disk])
        assert found is not None and (found.length, found.device, found.per_tier) == (4, 1, (2, 1)), (
            f"[TIER-1125] device 1, host 2 and 4, disk 3, then 5 missing: got {found}"
        )
        assert disk.prepare_store([5], request="w") is not None
        assert tiered_prefix([1, 2, 3, 4, 5, 6], 1, [host, disk]) is None, "[TIER-1125] a pending key decides nothing"

    # -- random calls beside the oracle -------------------------------------------------------

    @rule(
        "TIER-1103",
        "TIER-1104",
        "TIER-1105",
        "TIER-1106",
        "TIER-1107",
        "TIER-1108",
        "TIER-1110",
        "TIER-1111",
        "TIER-1112",
        "TIER-1114",
        "TIER-1116",
        "TIER-1117",
        "TIER-1123",
    )
    @pytest.mark.parametrize("policy", ["lru", "arc"])
    def test_random_calls_behave_like_the_oracle(self, impl: Target, policy: str) -> None:
        self.tier(impl, 2, policy=policy)  # skips without the policy
        machine = type(f"TierMachine_{policy}", (TierMachine,), {"impl": impl, "policy": policy})
        run_state_machine_as_test(machine, settings=settings())


class TierMachine(RuleBasedStateMachine):
    """A tier of the target beside the oracle's, under one policy, with a shadow KV store.

    Only calls the rules allow are made (bad calls have their own tests), so every answer must
    equal the oracle's: plans and evictions key for key, slots through a renaming, states, pins,
    free slots and events. Each store writes ``("kv", key)`` into the target's slots; each load
    must read it back.
    """

    #: The target and the policy, which a subclass per run sets (TierSuite.test_random_calls_behave_like_the_oracle).
    impl: Target
    policy: str
    capacity = 4

    def __init__(self) -> None:
        super().__init__()
        events = self.impl.has("tier-events")
        self.tier = self.impl.create_tier(self.capacity, policy=self.policy, enable_events=events)
        self.oracle = OracleTierStore(self.capacity, policy=self.policy, enable_events=events)
        self.shadow: dict[int, tuple[str, int]] = {}  # target slot -> the KV written there
        self.loads: dict[tuple[int, int], int] = {}  # (request, key) -> loads in flight
        self.stores: dict[int, set[int]] = {}  # request -> keys it made pending

    @initialize()
    def start(self) -> None:
        self.tier.take_events()

    def target(self, rules: str, what: str, call: Callable[[], Any]) -> Any:
        """The target's answer to a call the rules allow (the oracle takes it); an error it raises instead
        fails naming ``rules``, the rules of that call."""
        try:
            return call()
        except Exception as exc:
            raise AssertionError(
                f"[{rules}] {what}: the target raised {type(exc).__name__}: {exc}; the rules allow the call"
            ) from exc

    @property
    def _use_rules(self) -> str:
        return "TIER-1117" if self.policy == "lru" else "TIER-1118, TIER-1119"

    @step(request=st.integers(0, 3), keys=st.lists(st.sampled_from(KEYS[:8]), min_size=1, max_size=4, unique=True))
    def prepare_store(self, request: int, keys: list[int]) -> None:
        got = self.target("TIER-1104", f"store of {keys}", lambda: self.tier.prepare_store(keys, request=request))
        want = self.oracle.prepare_store(keys, request=request)
        if want is None or got is None:
            assert got is None and want is None, f"[TIER-1108] store of {keys}: target {got}, oracle {want}"
            return
        assert (list(got.keys), list(got.evicted)) == (list(want.keys), list(want.evicted)), (
            f"[TIER-1107] store of {keys} by request {request}: target planned {got}, the oracle {want}"
        )
        for key, slot in zip(got.keys, got.slots, strict=True):
            self.shadow[slot] = ("kv", key)
        self.stores.setdefault(request, set()).update(got.keys)

    @precondition(lambda self: any(self.stores.values()))
    @step(data=st.data(), success=st.booleans())
    def complete_store(self, data: st.DataObject, success: bool) -> None:
        request = data.draw(st.sampled_from(sorted(r for r, keys in self.stores.items() if keys)))
        keys = sorted(self.stores.pop(request))
        rules = "TIER-1110" if success else "TIER-1111"
        self.target(
            rules, f"completion of {keys}", lambda: self.tier.complete_store(keys, request=request, success=success)
        )
        self.oracle.complete_store(keys, request=request, success=success)

    @step(request=st.integers(0, 3), data=st.data())
    def prepare_load(self, request: int, data: st.DataObject) -> None:
        ready = [key for key in KEYS[:8] if self.oracle.state(key) == "ready"]
        if not ready:
            return
        keys = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=3, unique=True))
        slots = self.target("TIER-1112", f"load of {keys}", lambda: self.tier.prepare_load(keys, request=request))
        self.oracle.prepare_load(keys, request=request)
        for key, slot in zip(keys, slots, strict=True):
            assert self.shadow.get(slot) == ("kv", key), (
                f"[TIER-1105] loading {key} from slot {slot} reads {self.shadow.get(slot)}: another key's KV"
            )
            self.loads[(request, key)] = self.loads.get((request, key), 0) + 1

    @precondition(lambda self: bool(self.loads))
    @step(data=st.data())
    def complete_load(self, data: st.DataObject) -> None:
        request, key = data.draw(st.sampled_from(sorted(self.loads)))
        self.target("TIER-1114", f"end of a load of {key}", lambda: self.tier.complete_load([key], request=request))
        self.oracle.complete_load([key], request=request)
        self.loads[(request, key)] -= 1
        if not self.loads[(request, key)]:
            del self.loads[(request, key)]

    @step(request=st.integers(0, 3))
    def finish_request(self, request: int) -> None:
        if self.stores.get(request) or any(r == request for r, _ in self.loads):
            return  # an engine ends a request once its transfers are prepared and complete
        self.target(self._use_rules, f"end of request {request}", lambda: self.tier.finish_request(request))
        self.oracle.finish_request(request)

    @step(keys=st.lists(st.sampled_from(KEYS[:8]), min_size=1, max_size=3, unique=True))
    def touch(self, keys: list[int]) -> None:
        self.target(self._use_rules, f"touch of {keys}", lambda: self.tier.touch(keys))
        self.oracle.touch(keys)

    @invariant()
    def same_tier_as_the_oracle(self) -> None:
        self.oracle.check_invariants()
        check = getattr(self.tier, "check_invariants", None)
        if check is not None:
            check()  # the target's own check, where it has one (ERR-508)
        for key in KEYS[:8]:
            got = (self.tier.state(key), self.tier.pins(key), self.tier.lookup(key))
            want = (self.oracle.state(key), self.oracle.pins(key), self.oracle.lookup(key))
            assert got == want, f"[TIER-1103] key {key}: target (state, pins, lookup) {got}, the oracle {want}"
        assert self.tier.num_free == self.oracle.num_free, (
            f"[TIER-1106] target has {self.tier.num_free} free slots, the oracle {self.oracle.num_free}"
        )
        got_events = [(list(e.keys), e.removed) for e in self.tier.take_events()]
        want_events = [(list(e.keys), e.removed) for e in self.oracle.take_events()]
        if self.impl.has("tier-events"):
            assert got_events == want_events, f"[TIER-1123] target reported {got_events}, the oracle {want_events}"
