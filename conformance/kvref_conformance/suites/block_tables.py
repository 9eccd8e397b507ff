"""A batch's block tables over the block array surface (chapter 07's REQ-750..REQ-756), for any target
with ``block-tables``.

A scheduler step grows the rows of many requests with one call and releases finished ones with
one call. The tests here hold each rule; the machine at the end runs random steps and releases
beside chapter 07's oracle manager over an oracle pool with caching off, which must hand out the
very same blocks in the very same order, request by request.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, run_state_machine_as_test
from hypothesis.stateful import rule as step

from kvref.contract.errors import InvalidTypeError, InvalidValueError, OutOfBlocksError
from kvref.contract.requests import Request
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager
from kvref_conformance.suites.base import ConformanceSuite, rule, skip_without
from kvref_conformance.suites.slot_arrays import host, raised
from kvref_conformance.target import Target

__all__ = ["BlockTablesSuite"]


def tables(impl: Target, num_blocks: int, **kwargs: Any) -> Any:
    """New block tables of ``impl``, or a skip saying it has none."""
    skip_without(impl, "block-tables")
    return impl.create_block_tables(num_blocks, **kwargs)


def row(t: Any, slot: int) -> list[int]:
    """Request slot ``slot``'s whole row of the table, padding included (a host read)."""
    return [int(x) for x in t.table[slot].tolist()]


class BlockTablesSuite(ConformanceSuite):
    """REQ-750..REQ-756 over the target's ``create_block_tables``."""

    @rule("REQ-750", "REQ-753")
    def test_a_step_grows_every_named_row_to_its_tokens_in_one_allocation(self, impl: Target) -> None:
        t = tables(impl, 16, max_requests=4, block_size=4, max_blocks=4)
        ids, offsets = t.step([2, 0], [5, 4])
        assert offsets == [0, 2, 3] and host(ids) == [1, 2, 3], f"[REQ-750] step([2, 0], [5, 4]) gave {ids}, {offsets}"
        assert row(t, 2) == [1, 2, 0, 0] and row(t, 0) == [3, 0, 0, 0], "[REQ-753] rows with the null block after"
        ids, offsets = t.step([0, 2, 1], [9, 8, 0])  # slot 2 already holds 8 tokens' blocks; slot 1 wants none
        assert host(ids) == [4, 5] and offsets == [0, 2, 2, 2], f"[REQ-750] the second step gave {ids}, {offsets}"
        assert t.blocks(0) == [3, 4, 5] and t.blocks(2) == [1, 2] and t.blocks(1) == []
        ids, offsets = t.step([2], [3])
        assert len(ids) == 0 and offsets == [0, 0] and t.blocks(2) == [1, 2], "[REQ-750] a row never shrinks"

    @rule("REQ-755", "POOL-105")
    def test_a_step_that_does_not_fit_takes_nothing(self, impl: Target) -> None:
        t = tables(impl, 6, max_requests=4, block_size=4, max_blocks=4)  # 5 usable blocks
        t.step([0], [8])
        before = [row(t, s) for s in range(4)]
        exc = raised(lambda: t.step([1, 2], [8, 8]))
        assert isinstance(exc, OutOfBlocksError) and exc.rule == "POOL-105", f"[REQ-755] 4 blocks of 3 gave {exc!r}"
        assert [row(t, s) for s in range(4)] == before, "[REQ-755] a step that does not fit changed a row"
        assert host(t.step([1, 2], [8, 4])[0]) == [3, 4, 5], "the three free blocks are all still there"

    @rule("REQ-751", "ERR-503", "ERR-517")
    def test_bad_slots_and_counts_are_refused_at_once_changing_nothing(self, impl: Target) -> None:
        t = tables(impl, 16, max_requests=4, block_size=4, max_blocks=2)
        t.step([1], [4])
        for what, call, kind in [
            ("a slot named twice", lambda: t.step([0, 0], [4, 4]), InvalidValueError),
            ("a slot out of range", lambda: t.step([4], [4]), InvalidValueError),
            ("a negative slot", lambda: t.release([-1]), InvalidValueError),
            ("more tokens than a row holds", lambda: t.step([0, 2], [4, 9]), InvalidValueError),
            ("counts unpaired with slots", lambda: t.step([0, 2], [4]), InvalidValueError),
            ("a negative count", lambda: t.step([0], [-4]), InvalidValueError),
            ("slots as a str", lambda: t.step("01", [4, 4]), InvalidTypeError),
            ("a count as a float", lambda: t.step([0], [4.0]), InvalidTypeError),
            ("a release naming a slot twice", lambda: t.release([1, 1]), InvalidValueError),
        ]:
            exc = raised(call)
            assert isinstance(exc, kind), f"[REQ-751] {what} raised {exc!r}, expected {kind.__name__}"
        assert [t.blocks(s) for s in range(4)] == [[], [1], [], []], "[REQ-751] a refused call changed a row"
        assert host(t.step([0], [4])[0]) == [2], "[REQ-751] a refused call took a block"

    @rule("REQ-752", "EVICT-402", "REQ-753")
    def test_a_release_gives_back_every_block_of_each_row_tail_first(self, impl: Target) -> None:
        t = tables(impl, 16, max_requests=4, block_size=4, max_blocks=4)
        t.step([0, 1], [12, 8])  # slot 0: 1, 2, 3; slot 1: 4, 5
        t.release([1, 0, 3])  # slot 3 holds nothing: a no-op for it
        assert row(t, 0) == [0, 0, 0, 0] and t.blocks(1) == [], "[REQ-752] released rows are empty"
        got = host(t.step([2], [16])[0])
        assert got == [1, 2, 3, 4], f"[EVICT-402] each row went back tail first, the last released on top: {got}"
        t.release([])  # nothing named

    @rule("REQ-750", "REQ-752", "REQ-753", "REQ-755", "EVICT-402")
    def test_steps_and_releases_hand_out_what_the_oracle_manager_does(self, impl: Target) -> None:
        skip_without(impl, "block-tables")
        run_state_machine_as_test(type("BatchedSteps", (BatchedSteps,), {"target": impl}))


_BLOCKS, _ROWS, _BLOCK, _WIDTH = 24, 6, 4, 5


class BatchedSteps(RuleBasedStateMachine):
    """Random steps and releases of a few request slots beside chapter 07's oracle manager, caching off.

    The oracle manager grows each request with ``allocate_slots`` and frees it tail first; a step
    that does not fit as a whole must fail as a whole, so the machine asks the oracle pool first.
    """

    target: Target

    @initialize()
    def start(self) -> None:
        self.tables = self.target.create_block_tables(_BLOCKS, max_requests=_ROWS, block_size=_BLOCK, max_blocks=_WIDTH)
        self.oracle = RequestManager(
            OracleBlockPool(_BLOCKS), block_size=_BLOCK, max_model_len=_BLOCK * _WIDTH, enable_caching=False
        )
        self.requests: dict[int, Request] = {}
        self.lives = 0

    def _grow(self, slot: int, tokens: int) -> list[int]:
        """What the oracle manager hands out to slot ``slot``'s request growing to ``tokens`` tokens."""
        req = self.requests.get(slot)
        if req is None:
            if tokens == 0:
                return []
            self.lives += 1
            req = self.requests[slot] = Request(f"r{self.lives}", [0] * tokens, block_size=_BLOCK)
            got = self.oracle.allocate_slots(req, tokens)
        else:
            have = req.num_tokens
            if tokens <= have:
                return []
            req.num_computed_tokens = have
            req.append_output_token_ids([0] * (tokens - have))
            got = self.oracle.allocate_slots(req, tokens - have)
        assert got is not None, "the machine checked the fit first"
        return list(got.blocks[0])

    def _need(self, slot: int, tokens: int) -> int:
        held = len(self.oracle.get_block_ids(self.requests[slot].request_id)[0]) if slot in self.requests else 0
        return max(0, -(-tokens // _BLOCK) - held)

    @step(data=st.data())
    def step_slots(self, data: st.DataObject) -> None:
        slots = data.draw(st.lists(st.integers(0, _ROWS - 1), min_size=1, max_size=_ROWS, unique=True), label="slots")
        tokens = [data.draw(st.integers(0, _BLOCK * _WIDTH), label=f"tokens of {s}") for s in slots]
        if sum(self._need(s, n) for s, n in zip(slots, tokens, strict=True)) > self.oracle.pool.num_available:
            exc = raised(lambda: self.tables.step(slots, tokens))
            assert isinstance(exc, OutOfBlocksError), f"[REQ-755] step({slots}, {tokens}) does not fit, gave {exc!r}"
            return  # the invariant checks that nothing changed
        ids, offsets = self.tables.step(slots, tokens)
        want = [self._grow(s, n) for s, n in zip(slots, tokens, strict=True)]
        got = [host(ids)[a:b] for a, b in pairwise(offsets)]
        assert got == want, f"[REQ-750] step({slots}, {tokens}) handed out {got}, the oracle manager {want}"

    @step(data=st.data())
    def release_some(self, data: st.DataObject) -> None:
        slots = data.draw(st.lists(st.integers(0, _ROWS - 1), max_size=_ROWS, unique=True), label="slots")
        self.tables.release(slots)
        for s in slots:
            req = self.requests.pop(s, None)
            if req is not None:
                self.oracle.free(req)

    @invariant()
    def rows_agree(self) -> None:
        self.tables.check()
        for s in range(_ROWS):
            req = self.requests.get(s)
            want = list(self.oracle.get_block_ids(req.request_id)[0]) if req is not None else []
            assert self.tables.blocks(s) == want, f"[REQ-750] row {s} holds {self.tables.blocks(s)}, oracle {want}"
            assert row(self.tables, s) == want + [0] * (_WIDTH - len(want)), f"[REQ-753] row {s}: {row(self.tables, s)}"
        got, expected = self.tables.pool.available_blocks(), self.oracle.pool.num_available
        assert got == expected, f"[REQ-752] {got} blocks free, the oracle manager's pool has {expected}"
