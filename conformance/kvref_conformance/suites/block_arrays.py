"""The block pool's array surface (ERR-510..ERR-514, ERR-517..ERR-520), for any target with ``block-arrays``.

A GPU engine's scheduler allocates a step's blocks in one call, names its running requests by
integer slots, frees and shares blocks as device arrays, and never waits for the device inside a
step; errors are found on the device and raised by ``check()``. The tests here hold an
implementation to what each call does and when its errors are raised; the machine at the end runs
random traffic of many request slots, bad entries included, beside the oracle's block pool and
checks only now and then, as a scheduler would once per step.
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, run_state_machine_as_test
from hypothesis.stateful import rule as step

from kvref.contract.errors import (
    BlockIdError,
    BlockStateError,
    InvalidTypeError,
    InvalidValueError,
    KVRefError,
    NotHeldError,
    OutOfBlocksError,
    ReservedBlockError,
)
from kvref.oracle import OracleBlockPool
from kvref_conformance.suites.base import ConformanceSuite, rule, skip_without
from kvref_conformance.suites.slot_arrays import host, raised
from kvref_conformance.target import Target

__all__ = ["BlockArraysSuite"]


def blocks(impl: Target, num_blocks: int, **kwargs: Any) -> Any:
    """A new array-surface block pool of ``impl``, or a skip saying it has none."""
    skip_without(impl, "block-arrays")
    return impl.create_block_arrays(num_blocks, **kwargs)


def reported(pool: Any, kind: type[KVRefError], rule_id: str, call: int, what: str) -> None:
    """``check()`` raises ``kind`` naming ``rule_id`` and call index ``call``, and then nothing."""
    exc = raised(pool.check)
    assert isinstance(exc, kind) and exc.rule == rule_id, (
        f"[ERR-512] check() after {what} raised {exc!r}; the list form raises {kind.__name__} {rule_id}"
    )
    assert getattr(exc, "call_index", None) == call, (
        f"[ERR-512] the report names call {getattr(exc, 'call_index', None)}: {exc}; call {call} was refused"
    )
    assert raised(pool.check) is None, "[ERR-512] check() raised the same error a second time"


class BlockArraysSuite(ConformanceSuite):
    """ERR-510..ERR-514 and ERR-517..ERR-520 over the target's ``create_block_arrays``."""

    @rule("ERR-519", "ERR-510")
    @pytest.mark.parametrize("dtype", ["int32", "int64"])
    def test_a_steps_allocation_is_one_fresh_array_and_its_offsets(self, impl: Target, dtype: str) -> None:
        pool = blocks(impl, 8, dtype=dtype)
        ids, offsets = pool.allocate([2, 0, 3], [5, 6, 7])
        assert str(ids.dtype).endswith(dtype), f"[ERR-510] allocate returned dtype {ids.dtype}, asked for {dtype}"
        got = host(ids)
        assert offsets == [0, 2, 2, 5] and sorted(got) == [1, 2, 3, 4, 5], (
            f"[ERR-519] allocate([2, 0, 3], [5, 6, 7]) gave {got} at offsets {offsets}; five distinct usable "
            "blocks, the requests starting at 0, 2 and 2"
        )
        for i, slot in [(0, 5), (2, 7), (4, 7)]:
            assert pool.holders(got[i]) == [slot] and pool.ref_count(got[i]) == 1, (
                f"[ERR-519] block {got[i]} is held by {pool.holders(got[i])} with {pool.ref_count(got[i])} "
                f"references; request slot {slot} was given it with one"
            )
        ids[:] = 0  # the caller owns the output: scribbling on it must not reach the pool
        pool.free(got[:2], 5)
        pool.check()
        again = host(pool.allocate([2], [1])[0])
        assert sorted(again) == sorted(got[:2]), f"[ERR-510] after writing into an output, allocate gave {again}"

    @rule("ERR-510")
    def test_ids_that_do_not_fit_int32_are_refused_at_construction(self, impl: Target) -> None:
        skip_without(impl, "block-arrays")
        exc = raised(lambda: impl.create_block_arrays(2**31 + 1, dtype="int32"))
        assert isinstance(exc, InvalidValueError) and exc.rule == "ERR-510", (
            f"[ERR-510] an int32 block pool of 2**31 + 1 blocks gave {exc!r}; its ids cannot fit"
        )

    @rule("ERR-519", "POOL-105")
    def test_a_step_that_does_not_fit_takes_nothing(self, impl: Target) -> None:
        pool = blocks(impl, 5)
        pool.allocate([1], [0])
        exc = raised(lambda: pool.allocate([2, 2], [1, 2]))
        assert isinstance(exc, OutOfBlocksError) and exc.rule == "POOL-105", (
            f"[ERR-519] allocating 4 of 3 free blocks raised {exc!r}; the list form raises OutOfBlocksError POOL-105"
        )
        assert pool.available_blocks() == 3, f"[ERR-519] the refused step left {pool.available_blocks()} of 3 free"

    @rule("ERR-520", "ERR-511", "ERR-512", "POOL-108")
    def test_a_foreign_free_is_raised_by_check_naming_its_call(self, impl: Target) -> None:
        pool = blocks(impl, 8)
        ids, _ = pool.allocate([2, 2], [0, 1])
        mine, theirs = host(ids[:2]), host(ids[2:])
        pool.free(mine[:1], 0)  # call 0
        pool.free([mine[1], theirs[0]], 0)  # call 1: slot 0 does not hold theirs[0]: refused whole
        pool.free(theirs, 1)  # call 2 takes effect
        reported(pool, NotHeldError, "POOL-108", 1, "a free of another slot's block")
        assert pool.available_blocks() == 6 and pool.holders(mine[1]) == [0], (
            f"[ERR-511] {pool.available_blocks()} free, block {mine[1]} held by {pool.holders(mine[1])}; calls 0 and "
            "2 freed three blocks, call 1 nothing: 6 free and slot 0 still holding it"
        )

    @rule("ERR-520", "POOL-108")
    def test_a_double_free_across_calls_is_refused(self, impl: Target) -> None:
        pool = blocks(impl, 4)
        ids, _ = pool.allocate([2], [3])
        pool.free(ids, 3)
        pool.free(ids[:1], 3)
        reported(pool, NotHeldError, "POOL-108", 1, "a second free of one block")
        assert pool.available_blocks() == 3, f"[ERR-520] {pool.available_blocks()} free after a refused double free"

    @rule("ERR-520", "POOL-109")
    def test_one_pair_twice_in_a_free_is_refused_but_two_slots_may_release_one_block(self, impl: Target) -> None:
        pool = blocks(impl, 4)
        b = host(pool.allocate([1], [0])[0])[0]
        pool.acquire([b], 1)
        pool.free([b, b], [0, 0])  # call 1: slot 0 holds one reference
        reported(pool, NotHeldError, "POOL-109", 1, "a free naming (block, slot 0) twice")
        pool.free([b, b], [1, 0])
        pool.check()
        assert pool.ref_count(b) == 0 and pool.available_blocks() == 3, (
            f"[ERR-520] block {b} has {pool.ref_count(b)} references after both holders freed it in one call"
        )

    @rule("ERR-520", "POOL-103", "POOL-118", "ERR-517")
    @pytest.mark.parametrize(
        ("entry", "slot", "kind", "rule_id"),
        [
            (9, 0, BlockIdError, "POOL-103"),
            (-1, 0, BlockIdError, "POOL-103"),
            (0, 0, ReservedBlockError, "POOL-118"),
            (1, 40, InvalidValueError, "ERR-517"),
            (1, -1, InvalidValueError, "ERR-517"),
        ],
    )
    @pytest.mark.parametrize("op", ["free", "acquire"])
    def test_bad_entries_of_a_device_array_are_refused_on_the_device(
        self, impl: Target, op: str, entry: int, slot: int, kind: type[KVRefError], rule_id: str
    ) -> None:
        pool = blocks(impl, 8, max_requests=40)
        ids, _ = pool.allocate([2], [0])
        held = host(ids)
        pool.acquire(held[1:], 1)  # call 0
        getattr(pool, op)([held[0], entry], [0 if op == "free" else 2, slot])  # call 1
        reported(pool, kind, rule_id, 1, f"{op} of entry {entry} for slot {slot}")
        assert pool.ref_count(held[0]) == 1 and pool.available_blocks() == 5, (
            f"[ERR-511] the refused {op} changed block {held[0]} to {pool.ref_count(held[0])} references"
        )

    @rule("ERR-520", "POOL-110", "POOL-119")
    def test_acquire_shares_an_in_use_block_and_refuses_a_free_one(self, impl: Target) -> None:
        pool = blocks(impl, 4)
        b = host(pool.allocate([1], [0])[0])[0]
        pool.acquire([b], [1])
        assert pool.holders(b) == [0, 1] and pool.ref_count(b) == 2, (
            f"[ERR-520] after slot 1 acquired block {b}: holders {pool.holders(b)}, {pool.ref_count(b)} references"
        )
        free_block = next(x for x in (1, 2, 3) if x != b)
        pool.acquire([free_block], [2])
        reported(pool, BlockStateError, "POOL-119", 1, "an acquire of a free block")

    @rule("ERR-518")
    @pytest.mark.parametrize("twice", ["held already", "named twice"])
    def test_a_slot_holds_one_reference_per_block(self, impl: Target, twice: str) -> None:
        pool = blocks(impl, 4)
        b = host(pool.allocate([1], [0])[0])[0]
        if twice == "held already":
            pool.acquire([b], [0])
        else:
            pool.acquire([b, b], [1, 1])
        reported(pool, InvalidValueError, "ERR-518", 0, f"an acquire of a block the slot {twice}")
        assert pool.ref_count(b) == 1, f"[ERR-518] the refused acquire left {pool.ref_count(b)} references on {b}"

    @rule("ERR-520")
    def test_blocks_go_back_in_the_order_their_last_reference_went(self, impl: Target) -> None:
        pool = blocks(impl, 5)
        ids, _ = pool.allocate([4], [0])
        a, b, c, d = host(ids)
        pool.acquire([b], [1])
        pool.free([c, b, a, d], [0, 0, 0, 0])  # b keeps slot 1's reference
        pool.free([b], [1])
        again = host(pool.allocate([4], [2])[0])
        assert again == [b, d, a, c], (
            f"[ERR-520] after blocks left in the order c, a, d, b, allocate handed out {again}; the last released "
            f"comes first: {[b, d, a, c]}"
        )

    @rule("ERR-512", "ERR-513")
    def test_an_allocation_beyond_the_known_free_blocks_raises_the_pending_error_first(self, impl: Target) -> None:
        pool = blocks(impl, 4)
        ids, _ = pool.allocate([3], [0])
        held = host(ids)
        pool.free(held[:1], 1)  # call 0: slot 1 holds nothing: refused
        pool.free(held[1:], 0)  # call 1: two blocks back, unknown to the host until it reads
        exc = raised(lambda: pool.allocate([2], [0]))
        assert isinstance(exc, NotHeldError) and getattr(exc, "call_index", None) == 0, (
            f"[ERR-512] an allocation beyond the host's free count after a refused free raised {exc!r}"
        )
        assert pool.available_blocks() == 2, f"[ERR-513] {pool.available_blocks()} free; two blocks were freed"
        got = host(pool.allocate([2], [0])[0])
        assert sorted(got) == sorted(held[1:]), f"[ERR-513] the freed blocks came back as {got}"

    @rule("ERR-514", "ERR-517", "ERR-506")
    def test_what_the_host_can_decide_is_raised_at_once(self, impl: Target) -> None:
        pool = blocks(impl, 8, max_requests=4)
        for what, call, kind in [
            ("a free of floats", lambda: pool.free([1.5], 0), InvalidTypeError),
            ("a request slot out of range", lambda: pool.allocate([1], [4]), InvalidValueError),
            ("a host slot out of range", lambda: pool.free([1], 9), InvalidValueError),
            ("counts and slots of different lengths", lambda: pool.allocate([1, 1], [0]), InvalidValueError),
            ("ids and slots of different lengths", lambda: pool.acquire([1, 2], [0]), InvalidValueError),
            ("a negative count", lambda: pool.allocate([-1], [0]), InvalidValueError),
        ]:
            exc = raised(call)
            assert isinstance(exc, kind), f"[ERR-514] {what} raised {exc!r} at once, expected {kind.__name__}"
        assert raised(pool.check) is None and pool.available_blocks() == 7, "[ERR-514] a refused call changed the pool"

    @rule("ERR-511", "ERR-512", "ERR-513", "ERR-517", "ERR-518", "ERR-519", "ERR-520")
    def test_deferred_traffic_agrees_with_the_oracle(self, impl: Target) -> None:
        skip_without(impl, "block-arrays")
        run_state_machine_as_test(type("DeferredBlockTraffic", (DeferredBlockTraffic,), {"target": impl}))


_BLOCKS, _SLOTS = 16, 40  # two words of the holding bitmap
_BAD = ["foreign", "double", "out of range", "reserved", "pair twice", "slot out of range"]
_BAD_ACQUIRE = ["free block", "held already", "pair twice", "out of range", "reserved", "slot out of range"]


class DeferredBlockTraffic(RuleBasedStateMachine):
    """Steps of many request slots, frees and shares, good and bad, checked only now and then, beside the oracle.

    Every bad call has one bad entry, so the rule of its first offending entry is the same for
    every implementation; the oracle (``free_many``, ``acquire``) judges the rules of chapter 01,
    the machine those of the array surface alone (ERR-517, ERR-518).
    """

    target: Target

    @initialize()
    def create(self) -> None:
        self.impl = self.target.create_block_arrays(_BLOCKS, max_requests=_SLOTS)
        self.oracle = OracleBlockPool(_BLOCKS)
        self.released: list[tuple[int, int]] = []  # pairs freed once, for double frees
        self.calls = 0  # non-empty frees and acquires made: the index the next one gets
        self.pending: tuple[int, str] | None = None  # the first refused call not yet raised

    def held(self) -> list[tuple[int, int]]:
        """Every (block, slot) pair the oracle says is held, in block order."""
        return [(b, int(s)) for b in range(_BLOCKS) for s in self.slots_of(b)]

    def slots_of(self, b: int) -> list[int]:
        """The request slots the oracle says hold block ``b``, ascending."""
        return sorted(int(s) for s in self.oracle.holders(b))  # type: ignore[call-overload]

    def _pending_raised(self, exc: KVRefError | None, what: str) -> None:
        want = self.pending
        got = None if exc is None else (getattr(exc, "call_index", None), exc.rule)
        assert got == want, f"[ERR-512] {what} raised {exc!r}; the first refused call not yet raised is {want}"
        self.pending = None

    def _refused(self, rule_id: str | None) -> None:
        if rule_id is not None and self.pending is None:
            self.pending = (self.calls, rule_id)
        self.calls += 1

    @step(counts=st.lists(st.integers(0, 4), min_size=1, max_size=3), slots=st.data())
    def allocate(self, counts: list[int], slots: st.DataObject) -> None:
        owners = slots.draw(st.lists(st.integers(0, _SLOTS - 1), min_size=len(counts), max_size=len(counts)))
        result: list[Any] = []
        exc = raised(lambda: result.append(self.impl.allocate(counts, owners)))
        if exc is not None and getattr(exc, "call_index", None) is not None:  # an earlier call's error (ERR-512)
            self._pending_raised(exc, f"allocate({counts}, {owners})")
            return
        fits = sum(counts) <= self.oracle.num_free
        assert (exc is None) == fits, (
            f"[ERR-519] allocate({counts}, {owners}) with {self.oracle.num_free} free raised {exc!r}"
        )
        if exc is None:
            ids, offsets = result[0]
            want = [b for got in self.oracle.allocate_many(counts, holders=owners) for b in got]
            assert host(ids) == want and offsets[-1] == len(want), (
                f"[ERR-519] allocate({counts}, {owners}) gave {host(ids)}; the oracle hands out {want}"
            )

    @step(data=st.data(), bad=st.none() | st.sampled_from(_BAD))
    def free(self, data: st.DataObject, bad: str | None) -> None:
        held = self.held()
        entries = data.draw(st.lists(st.sampled_from(held), unique=True, max_size=6)) if held else []
        entries = data.draw(st.permutations(entries))
        at = data.draw(st.integers(0, len(entries)))
        if bad == "foreign" and held:
            b, s = data.draw(st.sampled_from(held))
            entries.insert(at, (b, (s + 1 + data.draw(st.integers(0, _SLOTS - 2))) % _SLOTS))
        elif bad == "double" and self.released:
            entries.insert(at, data.draw(st.sampled_from(self.released)))
        elif bad == "pair twice" and entries:
            entries.insert(at, entries[data.draw(st.integers(0, len(entries) - 1))])
        elif bad in ("out of range", "reserved", "slot out of range"):
            bad_entry = {"out of range": (_BLOCKS, 0), "reserved": (0, 0), "slot out of range": (1, _SLOTS)}[bad]
            entries.insert(at, bad_entry)
        if not entries:
            return
        ids, slots = [b for b, _ in entries], [s for _, s in entries]
        self.impl.free(ids, slots)
        if bad == "slot out of range":
            self._refused("ERR-517")
            return
        runs = [(s, [b for b, _ in run]) for s, run in groupby(entries, key=lambda e: e[1])]
        exc = raised(lambda: self.oracle.free_many([r for _, r in runs], holders=[s for s, _ in runs]))
        self._refused(None if exc is None else exc.rule)
        if exc is None:
            self.released = [p for p in self.released if p not in entries] + entries

    @precondition(lambda self: self.oracle.num_in_use > 0)
    @step(data=st.data(), bad=st.none() | st.sampled_from(_BAD_ACQUIRE))
    def acquire(self, data: st.DataObject, bad: str | None) -> None:
        in_use = [b for b in range(_BLOCKS) if self.oracle.ref_count(b)]
        free = [b for b in range(1, _BLOCKS) if not self.oracle.ref_count(b)]
        pairs = [(b, s) for b in in_use for s in range(_SLOTS) if s not in self.oracle.holders(b)]
        entries = data.draw(st.lists(st.sampled_from(pairs), unique=True, max_size=5))
        at = data.draw(st.integers(0, len(entries)))
        rule_id: str | None = None
        if bad == "free block" and free:
            entries.insert(at, (data.draw(st.sampled_from(free)), 0))
            rule_id = "POOL-119"
        elif bad == "held already":
            entries.insert(at, data.draw(st.sampled_from(self.held())))
            rule_id = "ERR-518"
        elif bad == "pair twice" and entries:
            entries.insert(at, entries[data.draw(st.integers(0, len(entries) - 1))])
            rule_id = "ERR-518"
        elif bad in ("out of range", "reserved", "slot out of range"):
            entry, rule_id = {
                "out of range": ((_BLOCKS + 3, 1), "POOL-103"),
                "reserved": ((0, 1), "POOL-118"),
                "slot out of range": ((in_use[0], -1), "ERR-517"),
            }[bad]
            entries.insert(at, entry)
        if not entries:
            return
        self.impl.acquire([b for b, _ in entries], [s for _, s in entries])
        self._refused(rule_id)
        if rule_id is None:
            for s, run in groupby(entries, key=lambda e: e[1]):
                self.oracle.acquire([b for b, _ in run], holder=s)

    @step()
    def check(self) -> None:
        self._pending_raised(raised(self.impl.check), "check()")
        got, want = self.impl.available_blocks(), self.oracle.num_free
        assert got == want, f"[ERR-513] available_blocks() {got} after check(), the oracle counts {want}"
        for b in range(1, _BLOCKS):
            mine, theirs = self.impl.holders(b), self.slots_of(b)
            assert mine == theirs and self.impl.ref_count(b) == self.oracle.ref_count(b), (
                f"[ERR-520] block {b}: held by {mine} with {self.impl.ref_count(b)} references; the oracle says "
                f"{theirs} with {self.oracle.ref_count(b)}"
            )
