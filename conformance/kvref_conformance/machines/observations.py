"""The machine's observations after every step: counts, holders, the cache, events, paused accounting.

Each compares the implementation with the oracle and with what the machine handed out; every
assertion message starts with the id of the rule it checks.
"""

from __future__ import annotations

import time
from collections import Counter

from hypothesis.stateful import invariant

from kvref.contract.events import apply_events
from kvref.contract.protocol import BlockState
from kvref_conformance.machines.core import STEP_SECONDS, MachineCore

__all__ = ["Observations"]


class Observations(MachineCore):
    """The invariants checked after every step (STATE-001..STATE-006, POOL-106, POOL-113, POOL-123, PFX-316..318)."""

    @invariant()
    def returned_lists_are_the_callers_own(self) -> None:
        for returned, then, what in self.handed:
            now = [int(x) for x in returned]
            assert now == then, (
                f"[POOL-123] {what} returned {then}; after later calls that list reads {now}: it is a view of the "
                "pool's state, not the caller's own"
            )

    @invariant()
    def counts_agree_and_are_conserved(self) -> None:
        if self.impl is None:
            return
        impl, oracle = self.impl, self.oracle
        cached = impl.num_cached if self.caching else 0
        assert impl.num_free + impl.num_in_use + cached == impl.num_usable, (
            f"[STATE-003] free {impl.num_free} + in use {impl.num_in_use} + cached {cached} != usable {impl.num_usable}"
        )
        got = (impl.num_free, impl.num_in_use, cached)
        want = (oracle.num_free, oracle.num_in_use, oracle.num_cached if self.caching else 0)
        assert got == want, f"[STATE-003] (free, in use, cached) = {got}, the spec has {want}"
        assert impl.num_available == oracle.num_available, (
            f"[POOL-106] num_available {impl.num_available}, the spec has {oracle.num_available}"
        )

    @invariant()
    def holders_match_the_references_handed_out(self) -> None:
        if self.impl is None:
            return
        model: dict[int, Counter[object]] = {}
        for holder, refs in self.refs.items():
            for a in refs:
                model.setdefault(a, Counter())[holder] += 1
        for b in self.blocks_in_view():
            want = dict(model.get(b, {}))
            got = self.impl.holders(b)
            assert got == want, f"[STATE-002] block {b}: holders {got}, the references handed out are {want}"
            assert self.impl.ref_count(b) == sum(want.values()), (
                f"[STATE-002] block {b}: reference count {self.impl.ref_count(b)}, holders hold {sum(want.values())}"
            )
            state = self.impl.block_state(b)
            if want:
                assert state is BlockState.IN_USE, f"[STATE-001] block {b} is held but {state}"
                assert self.impl.generation(b) == self.last_gen[b], (
                    f"[POOL-111] held block {b}: generation {self.impl.generation(b)}, {self.last_gen[b]} "
                    "when it was allocated"
                )
                partner = self.i2o[b]
                assert self.oracle.ref_count(partner) == sum(want.values())

    @invariant()
    def cache_agrees_with_the_spec(self) -> None:
        if self.impl is None or not self.caching:
            return
        impl, oracle = self.impl, self.oracle
        resident = set(impl.resident_hashes())
        if oracle.policy.prefix_closed:
            for h in resident:
                parent = self.parent_of.get(h)
                assert parent is None or parent in resident, (
                    f"[EVICT-404] hash {h} is resident but its parent {parent} was evicted (lru-leaf)"
                )
        assert resident == set(oracle.resident_hashes()), (
            f"[EVICT-401] resident hashes differ from the spec's: extra {resident - oracle.resident_hashes()}, "
            f"missing {set(oracle.resident_hashes()) - resident} (policy {self.policy})"
        )
        for b in self.blocks_in_view():
            state = impl.block_state(b)
            if state is BlockState.CACHED or state is BlockState.IN_USE:
                h = impl.block_hash(b)
                if h is not None:
                    assert h in resident, f"[STATE-006] block {b} is registered under {h} but it is not resident"
                    partner = self.i2o.get(b)
                    assert partner is not None and oracle.block_hash(partner) == h, (
                        f"[EVICT-401] block {b} still caches {h}; the spec evicted that copy (policy {self.policy})"
                    )
            if state is BlockState.CACHED:
                assert impl.block_hash(b) is not None, f"[STATE-004] cached block {b} has no hash"
        assert impl.stats == oracle.stats, f"[PFX-318] stats {impl.stats}, the spec counts {oracle.stats}"

    @invariant()
    def events_replay_to_the_resident_hashes(self) -> None:
        if self.impl is None or not (self.caching and self.events):
            return
        got, want = self.impl.take_events(), self.oracle.take_events()
        assert got == want, f"[PFX-317] events {got}, the spec emits {want}"
        self.view = apply_events(self.view, got)
        assert self.view == set(self.impl.resident_hashes()), "[PFX-316] replayed events disagree with the cache"

    @invariant()
    def paused_accounting_agrees(self) -> None:
        if self.impl is None or not self.pausing:
            return
        assert self.impl.paused_used == self.oracle.paused_used, (
            f"[POOL-113] paused_used {self.impl.paused_used}, the spec has {self.oracle.paused_used}"
        )
        assert self.impl.paused_excess == self.oracle.paused_excess, "[POOL-113] paused_excess differs"

    @invariant()
    def own_invariants_hold(self) -> None:
        check = getattr(self.impl, "check_invariants", None)
        if check is not None:
            check()

    def teardown(self) -> None:
        STEP_SECONDS[self.name] = STEP_SECONDS.get(self.name, 0.0) + time.perf_counter() - self.started
