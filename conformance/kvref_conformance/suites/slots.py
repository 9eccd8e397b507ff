"""Chapter 06's token-slot allocator, for any target with ``token-slots`` (RADIX-601..RADIX-611).

The allocator is driven as a scheduler drives SGLang's: ``alloc(n)`` for a request's tokens,
``free(indices)`` when it finishes (any slot of a page naming the page), free groups around a
step's frees, ``clear``. Each test builds allocators of pages of 1 and 4 slots; a target that
cannot make one of them skips it. The machine compares every step with the oracle's allocator:
the counts always, the very slots where the target declares ``slot-order``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, run_state_machine_as_test
from hypothesis.stateful import rule as step

from kvref.contract.errors import ConfigError, KVRefError
from kvref.oracle.radix import OracleSlotAllocator
from kvref_conformance.suites.base import ConformanceSuite, requires, rule, skip_without
from kvref_conformance.target import Target

__all__ = ["SlotAllocatorSuite"]

PAGES = [1, 4]


def slots(impl: Target, size: int, *, page_size: int = 1, sort: bool = True) -> Any:
    """A new allocator of ``impl``, or a skip saying why it has none of that shape."""
    skip_without(impl, "token-slots")
    try:
        return impl.create_slots(size, page_size=page_size, sort=sort)
    except ConfigError as exc:
        pytest.skip(f"{impl.name}: {exc}")


def refused(allocator: Any, call: Callable[[], object], rule_id: str, what: str) -> None:
    """``call`` raises a KVRefError citing ``rule_id`` and leaves ``available_size()`` as it was."""
    before = allocator.available_size()
    raised: KVRefError | None = None
    try:
        call()
    except KVRefError as exc:
        raised = exc
    if raised is None:
        pytest.fail(
            f"[{rule_id}] {what} was accepted; the rule refuses it (available_size {allocator.available_size()})"
        )
    assert raised.rule == rule_id, f"[{rule_id}] {what} raised {raised!r}, citing {raised.rule}"
    after = allocator.available_size()
    assert after == before, f"[ERR-501] the refused {what} changed available_size from {before} to {after}"


class SlotAllocatorSuite(ConformanceSuite):
    """RADIX-601..RADIX-611 over the target's ``create_slots``."""

    @rule("RADIX-602", "RADIX-603")
    @pytest.mark.parametrize("page", PAGES)
    def test_alloc_hands_out_whole_pages_and_never_page_zero(self, impl: Target, page: int) -> None:
        a = slots(impl, 8 * page, page_size=page)
        got = a.alloc(8 * page)
        assert got is not None and len(got) == 8 * page, f"alloc({8 * page}) of a fresh allocator gave {got}"
        assert min(got) >= page and len(set(got)) == len(got), f"[RADIX-602] slots {got} include page 0 or repeat"
        firsts = got[::page]
        assert all(
            got[i : i + page] == list(range(f, f + page)) for i, f in zip(range(0, len(got), page), firsts, strict=True)
        ), f"[RADIX-603] {got}: each page's slots must come whole, in order"
        assert a.alloc(page) is None, "[RADIX-603] alloc beyond the available slots must return None"
        assert a.available_size() == 0, f"a refused alloc left available_size {a.available_size()}"

    @rule("RADIX-604")
    def test_a_misaligned_alloc_is_refused_never_short(self, impl: Target) -> None:
        a = slots(impl, 16, page_size=4)
        refused(a, lambda: a.alloc(6), "RADIX-604", "alloc(6) with pages of 4")

    @rule("RADIX-606")
    @pytest.mark.parametrize("page", PAGES)
    def test_a_double_free_is_refused(self, impl: Target, page: int) -> None:
        a = slots(impl, 4 * page, page_size=page)
        got = a.alloc(2 * page) or []
        a.free(got[:page])
        refused(a, lambda: a.free(got[:page]), "RADIX-606", f"a second free of {got[:page]}")

    @rule("RADIX-606")
    def test_freeing_part_of_a_page_releases_the_whole_page_once(self, impl: Target) -> None:
        a = slots(impl, 16, page_size=4)
        got = a.alloc(8) or []
        a.free([got[1], got[2]])
        assert a.available_size() == 12, (
            f"[RADIX-606] freeing two slots of one page left {a.available_size()} free, not 12"
        )

    @rule("RADIX-602")
    @pytest.mark.parametrize("page", PAGES)
    def test_the_padding_page_cannot_be_freed(self, impl: Target, page: int) -> None:
        a = slots(impl, 4 * page, page_size=page)
        a.alloc(page)
        refused(a, lambda: a.free([0]), "RADIX-602", "free([0]) of the padding slot")

    @rule("RADIX-605", "RADIX-607")
    @pytest.mark.parametrize("page", PAGES)
    def test_a_free_group_releases_at_its_end(self, impl: Target, page: int) -> None:
        a = slots(impl, 8 * page, page_size=page)
        got = a.alloc(6 * page) or []
        a.free_group_begin()
        a.free(got[:page])
        a.free(got[page : 3 * page])
        assert a.available_size() == 2 * page, f"[RADIX-605] available_size {a.available_size()} counts an open group"
        a.free_group_end()
        assert a.available_size() == 5 * page, f"[RADIX-607] after the group, available_size is {a.available_size()}"

    @rule("RADIX-607")
    @pytest.mark.parametrize("page", PAGES)
    def test_free_groups_do_not_nest_and_cannot_end_unopened(self, impl: Target, page: int) -> None:
        a = slots(impl, 8 * page, page_size=page)
        refused(a, a.free_group_end, "RADIX-607", "free_group_end without a group")
        a.free_group_begin()
        refused(a, a.free_group_begin, "RADIX-607", "a nested free_group_begin")

    @rule("RADIX-606", "RADIX-607")
    @pytest.mark.parametrize("page", PAGES)
    def test_ending_a_group_a_second_time_releases_nothing_again(self, impl: Target, page: int) -> None:
        a = slots(impl, 8 * page, page_size=page)
        got = a.alloc(3 * page) or []
        a.free_group_begin()
        a.free(got[:page])
        a.free_group_end()
        before = a.available_size()
        with contextlib.suppress(KVRefError):  # RADIX-607 refuses it; refused or not, it releases nothing
            a.free_group_end()
        after = a.available_size()
        assert after == before, (
            f"[RADIX-606] a second free_group_end released the group's slots again: available_size {after}, "
            f"was {before} (capacity {8 * page})"
        )

    @rule("RADIX-606", "RADIX-607")
    @pytest.mark.parametrize("page", PAGES)
    def test_a_page_freed_twice_in_one_group_is_refused(self, impl: Target, page: int) -> None:
        a = slots(impl, 8 * page, page_size=page)
        got = a.alloc(2 * page) or []
        a.free_group_begin()
        a.free(got[:page])
        refused(a, lambda: a.free(got[:page]), "RADIX-606", "a page freed twice in one group")

    @rule("RADIX-609")
    @pytest.mark.parametrize("page", PAGES)
    def test_clear_frees_every_page(self, impl: Target, page: int) -> None:
        a = slots(impl, 8 * page, page_size=page)
        a.alloc(5 * page)
        a.clear()
        assert a.available_size() == 8 * page, f"[RADIX-609] after clear, available_size is {a.available_size()}"
        got = a.alloc(8 * page)
        assert got is not None and sorted(got) == list(range(page, 9 * page)), f"after clear alloc gave {got}"

    @rule("RADIX-608")
    @requires("slot-versions")
    def test_a_stale_slot_version_is_detected(self, impl: Target) -> None:
        a = slots(impl, 4)
        (slot,) = a.alloc(1) or [0]
        v = a.version(slot)
        assert a.is_current(slot, v), f"[RADIX-608] slot {slot} at version {v} just handed out is not current"
        a.free([slot])
        assert not a.is_current(slot, v), f"[RADIX-608] slot {slot} freed is still current at version {v}"

    @rule("RADIX-610")
    @requires("slot-order")
    @pytest.mark.parametrize("sort", [True, False])
    @pytest.mark.parametrize("page", PAGES)
    def test_freed_pages_come_back_in_the_chapters_order(self, impl: Target, page: int, sort: bool) -> None:
        a = slots(impl, 6 * page, page_size=page, sort=sort)
        got = a.alloc(6 * page) or []
        a.free(got[4 * page : 5 * page])
        a.free(got[page : 2 * page])
        want = [2, 5] if sort else [5, 2]
        again = a.alloc(2 * page) or []
        assert again[::page] == [p * page for p in want], (
            f"[RADIX-610] sort={sort}: pages freed as 5 then 2 came back as {[s // page for s in again[::page]]}, "
            f"the chapter's order gives {want}"
        )

    @rule("RADIX-603", "RADIX-610")
    @requires("slot-order")
    @pytest.mark.parametrize("page", PAGES)
    def test_a_refused_alloc_leaves_the_free_order_as_it_was(self, impl: Target, page: int) -> None:
        a = slots(impl, 6 * page, page_size=page, sort=True)
        got = a.alloc(4 * page) or []
        a.free(got[:page])  # page 1 waits in the release list; pages 5 and 6 are free
        assert a.alloc(4 * page) is None, "[RADIX-603] alloc of 4 pages with 3 available must give None"
        again = a.alloc(page) or []
        assert again[:1] == [5 * page], (
            f"[RADIX-603] after a refused alloc, alloc({page}) gave {again}; the refused call must change nothing, "
            f"so the free list's front (page 5, slot {5 * page}) comes first, not a page merged in by the refusal"
        )

    @rule("RADIX-612")
    @requires("slot-batches")
    @pytest.mark.parametrize("page", PAGES)
    def test_a_steps_allocation_is_one_alloc_of_the_sum_split_in_order(self, impl: Target, page: int) -> None:
        a = slots(impl, 8 * page, page_size=page)
        o = OracleSlotAllocator(8 * page, page_size=page)
        for x in (a, o):  # a release list to merge: the batch must merge once, as one alloc would
            got = x.alloc(6 * page) or []
            x.free(got[page : 3 * page])
        counts = [page, 0, 3 * page]
        got, want = a.alloc_many(counts), o.alloc(sum(counts))
        assert got is not None and want is not None, f"[RADIX-612] alloc_many({counts}) gave {got}"
        assert [len(g) for g in got] == counts and [s for g in got for s in g] == want, (
            f"[RADIX-612] alloc_many({counts}) gave {got}; one alloc of {sum(counts)} gives {want}, split in order"
        )
        assert a.alloc_many([page, 2 * page]) is None, "[RADIX-612] a step that does not fit must get None"
        before = a.available_size()
        refused(a, lambda: a.alloc_many([page, -1]), "ERR-504", "a negative count in a step")
        if page > 1:
            refused(a, lambda: a.alloc_many([page, 1]), "RADIX-604", "a count that is not whole pages")
        assert a.available_size() == before, f"[RADIX-612] refused steps changed available_size from {before}"

    @rule("RADIX-603", "RADIX-605", "RADIX-606", "RADIX-611")
    @pytest.mark.parametrize("sort", [True, False])
    @pytest.mark.parametrize("page", PAGES)
    def test_random_traffic_agrees_with_the_oracle(self, impl: Target, page: int, sort: bool) -> None:
        slots(impl, page, page_size=page, sort=sort)  # skips a shape the target lacks
        machine = type("SlotTraffic", (SlotTraffic,), {"target": impl, "page": page, "sort": sort})
        run_state_machine_as_test(machine)


class SlotTraffic(RuleBasedStateMachine):
    """Allocations, frees (partial pages too), groups and clears, each beside the oracle's allocator."""

    target: Target
    page: int
    sort: bool

    @initialize()
    def create(self) -> None:
        self.impl = self.target.create_slots(12 * self.page, page_size=self.page, sort=self.sort)
        self.oracle = OracleSlotAllocator(12 * self.page, page_size=self.page, sort=self.sort)
        self.held: list[tuple[list[int], list[int]]] = []  # per request: the implementation's, the oracle's
        self.group = False
        self.exact = self.target.has("slot-order")

    @step(pages=st.integers(0, 5))
    def alloc(self, pages: int) -> None:
        got, want = self.impl.alloc(pages * self.page), self.oracle.alloc(pages * self.page)
        assert (got is None) == (want is None), f"[RADIX-603] alloc({pages * self.page}) gave {got}, the oracle {want}"
        if got is None or want is None:
            return
        taken = {s for h, _ in self.held for s in h}
        assert len(got) == len(want) and not set(got) & taken, (
            f"[RADIX-603] alloc gave {got}; still held: {sorted(taken)}"
        )
        if self.exact:
            assert got == want, f"[RADIX-610] alloc gave {got}, the chapter's order gives {want}"
        self.held.append((list(got), list(want)))

    @precondition(lambda self: self.held)
    @step(data=st.data())
    def free(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.held) - 1))
        mine, theirs = self.held.pop(i)
        named = [
            s for s in mine if s % self.page == 0 or data.draw(st.booleans())
        ]  # each page's first slot, maybe more
        self.impl.free(named)
        self.oracle.free(theirs)

    @step()
    def toggle_group(self) -> None:
        if self.group:
            self.impl.free_group_end()
            self.oracle.free_group_end()
        else:
            self.impl.free_group_begin()
            self.oracle.free_group_begin()
        self.group = not self.group

    @precondition(lambda self: not self.group)
    @step()
    def clear(self) -> None:
        self.impl.clear()
        self.oracle.clear()
        self.held.clear()

    @invariant()
    def available_sizes_agree(self) -> None:
        if hasattr(self, "impl"):
            got, want = self.impl.available_size(), self.oracle.available_size()
            assert got == want, f"[RADIX-605] available_size {got}, the oracle counts {want}"
