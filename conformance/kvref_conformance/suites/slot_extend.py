"""Chapter 06's step allocations that continue prefixes (RADIX-613..RADIX-615), for targets with ``slot-extend``.

A scheduler on pages calls ``alloc_extend`` for a prefill step (each request continues a cached
or computed prefix: first the rest of its last page, then new pages) and ``alloc_decode`` for a
decode step. The tests hold an implementation to the slots each request gets; the machine grows
requests chunk by chunk and token by token beside the oracle's allocator, every request's slots
kept in a shadow so that a slot handed to two live requests fails in the step it happens.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, run_state_machine_as_test
from hypothesis.stateful import rule as step

from kvref.oracle.radix import OracleSlotAllocator
from kvref_conformance.suites.base import ConformanceSuite, requires, rule
from kvref_conformance.suites.slots import PAGES, refused, slots
from kvref_conformance.target import Target

__all__ = ["SlotExtendSuite"]


def check_layout(
    got: list[int] | None, want: list[int] | None, page: int, free: tuple[set[int], set[int]], what: str
) -> None:
    """``got`` has ``want``'s shape: the same slots from each request's own page, and slots of pages that
    were free before the call at the same offsets (``free``: the free pages of the target, of the oracle)."""
    assert (got is None) == (want is None), f"[RADIX-613] {what} gave {got}; the oracle's allocator gives {want}"
    if got is None or want is None:
        return
    assert len(got) == len(want) and len(set(got)) == len(got), (
        f"[RADIX-613] {what} gave {got}: {len(got)} slots, {len(set(got))} distinct; it hands out {len(want)} distinct"
    )
    mine, theirs = free
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if w // page not in theirs:  # the request's own page: exactly the slots after last_loc
            assert g == w, f"[RADIX-613] {what}: slot {i} is {g}; the request's own page continues with {w}"
        else:
            assert g // page in mine and g % page == w % page, (
                f"[RADIX-613] {what}: slot {i} is {g} (page {g // page}, offset {g % page}); a new page's slot at "
                f"offset {w % page} is due"
            )


def free_pages(held: list[int], page: int, pages: int) -> set[int]:
    """Pages ``1 .. pages`` but those ``held`` slots fall in."""
    return set(range(1, pages + 1)) - {s // page for s in held}


@requires("slot-extend")
class SlotExtendSuite(ConformanceSuite):
    """RADIX-613..RADIX-615 over the target's ``create_slots``."""

    @rule("RADIX-613")
    @pytest.mark.parametrize("page", PAGES)
    def test_each_request_fills_its_own_page_then_takes_new_pages_in_order(self, impl: Target, page: int) -> None:
        a = slots(impl, 16 * page, page_size=page, sort=False)
        o = OracleSlotAllocator(16 * page, page_size=page, sort=False)
        held = [x.alloc(2 * page) or [] for x in (a, o)]
        free_before = (free_pages(held[0], page, 16), free_pages(held[1], page, 16))
        prefix = 2 * page - 1 if page > 1 else 2  # inside its second page when pages have room
        args = ([prefix, 0, page], [prefix + 2 * page + 1, page + 1, page], [held[0][prefix - 1], -1, -1])
        want_args = ([prefix, 0, page], [prefix + 2 * page + 1, page + 1, page], [held[1][prefix - 1], -1, -1])
        got, want = a.alloc_extend(*args), o.alloc_extend(*want_args)
        check_layout(got, want, page, free_before, f"alloc_extend{args}")
        if impl.has("slot-order"):
            assert got == want, f"[RADIX-613] alloc_extend{args} gave {got}; in chapter 06's order {want}"
        assert a.available_size() == o.available_size(), (
            f"[RADIX-613] available_size {a.available_size()} after the step; the oracle's {o.available_size()}"
        )

    @rule("RADIX-613")
    @pytest.mark.parametrize("page", PAGES)
    def test_a_step_whose_new_pages_do_not_fit_gets_none_and_changes_nothing(self, impl: Target, page: int) -> None:
        a = slots(impl, 4 * page, page_size=page, sort=False)
        held = a.alloc(page) or []
        before = a.available_size()
        got = a.alloc_extend([page, 0], [page + 2 * page, 2 * page + 1], [held[-1], -1])
        assert got is None, f"[RADIX-613] a step needing 5 new pages of 3 free gave {got}; it must get None"
        assert a.available_size() == before, f"[RADIX-613] the refused step changed available_size from {before}"

    @rule("RADIX-614")
    @pytest.mark.parametrize("page", [p for p in PAGES if p > 1])
    def test_a_last_loc_the_request_cannot_hold_is_refused(self, impl: Target, page: int) -> None:
        a = slots(impl, 8 * page, page_size=page, sort=False)
        held = a.alloc(page) or []
        refused(a, lambda: a.alloc_extend([2], [1], [held[1]]), "RADIX-614", "a seq_len below its prefix_len")
        refused(a, lambda: a.alloc_extend([2], [5], [held[0]]), "RADIX-614", "a last_loc one slot early")
        refused(a, lambda: a.alloc_extend([1], [5], [0]), "RADIX-614", "a last_loc in the padding page")
        free_slot = 5 * page  # page 5: free
        refused(a, lambda: a.alloc_extend([1], [5], [free_slot]), "RADIX-614", "a last_loc in a page nobody holds")

    @rule("RADIX-615")
    @pytest.mark.parametrize("page", PAGES)
    def test_a_decode_step_is_an_extend_by_one_token(self, impl: Target, page: int) -> None:
        a = slots(impl, 8 * page, page_size=page, sort=False)
        o = OracleSlotAllocator(8 * page, page_size=page, sort=False)
        rows = [x.alloc_extend([0, 0], [page, 1], [-1, -1]) or [] for x in (a, o)]
        got = a.alloc_decode([page + 1, 2], [rows[0][page - 1], rows[0][page]])
        want = o.alloc_decode([page + 1, 2], [rows[1][page - 1], rows[1][page]])
        free_before = (free_pages(rows[0], page, 8), free_pages(rows[1], page, 8))
        check_layout(got, want, page, free_before, "alloc_decode after a full and a one-token page")

    @rule("RADIX-615")
    @pytest.mark.parametrize("page", PAGES)
    def test_a_decode_of_a_request_with_no_token_is_refused(self, impl: Target, page: int) -> None:
        a = slots(impl, 8 * page, page_size=page, sort=False)
        refused(a, lambda: a.alloc_decode([0], [-1]), "RADIX-615", "a decode of a request with no token")

    @rule("RADIX-613", "RADIX-614", "RADIX-615", "RADIX-611")
    @pytest.mark.parametrize("page", PAGES)
    def test_requests_growing_by_chunks_and_tokens_agree_with_the_oracle(self, impl: Target, page: int) -> None:
        slots(impl, page, page_size=page, sort=False)  # skips a shape the target lacks
        machine = type("ExtendTraffic", (ExtendTraffic,), {"target": impl, "page": page})
        run_state_machine_as_test(machine)


class ExtendTraffic(RuleBasedStateMachine):
    """Requests admitted, extended by chunks, decoded and finished, beside the oracle's allocator."""

    target: Target
    page: int

    @initialize(sort=st.booleans())
    def create(self, sort: bool) -> None:
        size = 12 * self.page
        self.impl = self.target.create_slots(size, page_size=self.page, sort=sort)
        self.oracle = OracleSlotAllocator(size, page_size=self.page, sort=sort)
        self.exact = self.target.has("slot-order")
        self.live: list[tuple[list[int], list[int]]] = []  # per request: its slots (target's, oracle's)

    def _extend(self, which: list[int], grow: list[int], decode: bool) -> None:
        rows = [self.live[i] for i in which]
        seq = [len(mine) + g for (mine, _), g in zip(rows, grow, strict=True)]
        last = [[r[k][-1] if r[k] else -1 for r in rows] for k in (0, 1)]
        if decode:
            got, want = self.impl.alloc_decode(seq, last[0]), self.oracle.alloc_decode(seq, last[1])
        else:
            pre = [len(mine) for mine, _ in rows]
            got, want = self.impl.alloc_extend(pre, seq, last[0]), self.oracle.alloc_extend(pre, seq, last[1])
        what = f"{'alloc_decode' if decode else 'alloc_extend'} growing requests {which} by {grow}"
        assert (got is None) == (want is None), f"[RADIX-613] {what} gave {got}, the oracle {want}"
        if got is None or want is None:
            return
        if self.exact:
            assert got == want, f"[RADIX-613] {what} gave {got}; in chapter 06's order {want}"
        at = 0
        for (mine, theirs), g in zip(rows, grow, strict=True):
            own = min(g, -len(mine) % self.page) if mine else 0  # what is left of its last page
            cont = list(range(mine[-1] + 1, mine[-1] + 1 + own)) if own else []
            assert got[at : at + own] == cont, (
                f"[RADIX-613] {what}: a request of {len(mine)} tokens got {got[at : at + own]} first; its own page "
                f"continues with {cont}"
            )
            mine.extend(got[at : at + g])
            theirs.extend(want[at : at + g])
            at += g

    @precondition(lambda self: len(self.live) < 4)
    @step(n=st.integers(1, 3))
    def admit(self, n: int) -> None:
        self.live.append(([], []))
        self._extend([len(self.live) - 1], [n * self.page // 2 + 1], decode=False)
        if not self.live[-1][0]:
            self.live.pop()

    @precondition(lambda self: self.live)
    @step(data=st.data(), decode=st.booleans())
    def grow(self, data: st.DataObject, decode: bool) -> None:
        which = data.draw(st.lists(st.integers(0, len(self.live) - 1), min_size=1, max_size=3, unique=True))
        sizes = st.lists(st.integers(0, 2 * self.page + 1), min_size=len(which), max_size=len(which))
        grow = [1] * len(which) if decode else data.draw(sizes)
        self._extend(which, grow, decode)

    @precondition(lambda self: self.live)
    @step(i=st.integers(0, 3))
    def finish(self, i: int) -> None:
        mine, theirs = self.live.pop(i % len(self.live))
        if mine:
            self.impl.free(mine)
            self.oracle.free(theirs)

    @invariant()
    def no_slot_in_two_requests(self) -> None:
        if not hasattr(self, "impl"):
            return
        pages = [{s // self.page for s in mine} for mine, _ in self.live]
        for i, a in enumerate(pages):
            for j in range(i + 1, len(pages)):
                shared = a & pages[j]
                assert not shared, f"[RADIX-613] live requests {i} and {j} both hold page(s) {sorted(shared)}"
        got, want = self.impl.available_size(), self.oracle.available_size()
        assert got == want, f"[RADIX-611] available_size {got}; the oracle's allocator counts {want}"
