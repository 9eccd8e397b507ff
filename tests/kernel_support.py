"""What the fused-kernel tests share: the outcome of a call, and the machines that hold a slot
allocator's and a block pool's fused calls to their array paths."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant
from hypothesis.stateful import rule as step
from kvref_arraypool.block_arrays import BlockKernels, DeviceBlockPool
from kvref_arraypool.ops import ArrayOps
from kvref_arraypool.slot_arrays import DeviceSlotAllocator, SlotKernels

from kvref.contract.errors import KVRefError


def outcome(call: Any) -> tuple[str, str, Any] | None:
    """What a call raised (class, rule, call index), or None."""
    try:
        call()
    except KVRefError as exc:
        return type(exc).__name__, exc.rule, getattr(exc, "call_index", None)
    return None


class SlotsFusedBesideArrays(RuleBasedStateMachine):
    """The same calls on the fused and the array path; the same state and errors after each.

    A subclass names ``ops`` (the array layer), ``kernels`` (a factory of the fused calls) and
    ``as_input`` (a list of ints as the library's int32 array, what an engine passes to ``free``).
    """

    page = 1
    sort = True
    ops: Callable[[], ArrayOps]
    kernels: Callable[[], SlotKernels]
    as_input: Callable[[list[int]], Any]

    @initialize()
    def create(self) -> None:
        def make(kernels: SlotKernels | None) -> DeviceSlotAllocator:
            return DeviceSlotAllocator(
                12 * self.page, ops=self.ops(), page_size=self.page, sort=self.sort, kernels=kernels
            )

        self.fused, self.plain = make(type(self).kernels()), make(None)
        self.held: list[list[int]] = []
        self.group = False

    @step(pages=st.integers(0, 5))
    def alloc(self, pages: int) -> None:
        results: list[Any] = []
        errors = [outcome(lambda a=a: results.append(a.alloc(pages * self.page))) for a in (self.fused, self.plain)]
        assert errors[0] == errors[1], (
            f"alloc({pages * self.page}): fused raised {errors[0]}, the array path {errors[1]}"
        )
        if errors[0] is None:
            got, want = results
            assert (got is None) == (want is None), f"alloc: fused gave {got}, the array path {want}"
            if got is not None:
                assert got.dtype == want.dtype and got.tolist() == want.tolist(), (
                    f"alloc({pages * self.page}): fused gave {got.tolist()} ({got.dtype}), "
                    f"the array path {want.tolist()} ({want.dtype})"
                )
                self.held.append(got.tolist())

    @step(i=st.integers(0, 99), again=st.booleans(), extra=st.sampled_from([None, 0, -1, 10_000]))
    def free(self, i: int, again: bool, extra: int | None) -> None:
        named = self._named(i, again, extra)
        if named is None:
            return
        for a in (self.fused, self.plain):
            a.free(type(self).as_input(named))

    def _named(self, i: int, again: bool, extra: int | None) -> list[int] | None:
        """Held allocation ``i``'s slots (still held when ``again``), ``extra`` in the middle; None if none is held."""
        if not self.held:
            return None
        named = list(self.held[i % len(self.held)])
        if not again:
            self.held.pop(i % len(self.held))
        if extra is not None:
            named.insert(len(named) // 2, extra)
        return named

    @step(
        i=st.integers(0, 99), again=st.booleans(), extra=st.sampled_from([None, 0, -1, 10_000]), pages=st.integers(0, 5)
    )
    def free_then_alloc(self, i: int, again: bool, extra: int | None, pages: int) -> None:
        """RADIX-616: the fused step beside a plain ``free`` then ``alloc`` on the array path."""
        named = self._named(i, again, extra)
        if named is None:
            return
        n = pages * self.page
        results: list[Any] = []

        def two_calls() -> None:
            self.plain.free(type(self).as_input(named))
            results.append(self.plain.alloc(n))

        errors = [outcome(lambda: results.append(self.fused.free_then_alloc(type(self).as_input(named), n)))]
        errors.append(outcome(two_calls))
        assert errors[0] == errors[1], (
            f"free_then_alloc({named}, {n}): fused raised {errors[0]}, free then alloc on the array path {errors[1]}"
        )
        if errors[0] is None:
            got, want = results
            assert (got is None) == (want is None) and (got is None or got.tolist() == want.tolist()), (
                f"free_then_alloc({named}, {n}) gave {None if got is None else got.tolist()}; free then alloc on "
                f"the array path gave {None if want is None else want.tolist()}"
            )
            if got is not None:
                self.held.append(got.tolist())

    @step()
    def toggle_group(self) -> None:
        for a in (self.fused, self.plain):
            a.free_group_end() if self.group else a.free_group_begin()
        self.group = not self.group

    @step()
    def check(self) -> None:
        got, want = outcome(self.fused.check), outcome(self.plain.check)
        assert got == want, f"check(): fused raised {got}, the array path {want}"

    @step()
    def clear(self) -> None:
        for a in (self.fused, self.plain):
            a.clear()
        self.held.clear()
        self.group = False

    @invariant()
    def same_state(self) -> None:
        if hasattr(self, "fused"):
            got, want = self.fused.snapshot(), self.plain.snapshot()
            assert got == want, f"after the same calls the fused state is {got}, the array path's {want}"


#: The block machine's pool: blocks and request slots.
BLOCKS, SLOTS = 12, 40


class BlocksFusedBesideArrays(RuleBasedStateMachine):
    """The block pool's calls on the fused and the array path; the same state and errors after each.

    A subclass names ``ops``, ``kernels`` (a factory of the fused calls), ``as_ids`` (a list of
    ints as the library's int32 array) and ``as_slots`` (one request slot per entry: ``n``, ``slot``).
    """

    ops: Callable[[], ArrayOps]
    kernels: Callable[[], BlockKernels]
    as_ids: Callable[[list[int]], Any]
    as_slots: Callable[[int, int], Any]

    @initialize()
    def create(self) -> None:
        def make(kernels: BlockKernels | None) -> DeviceBlockPool:
            return DeviceBlockPool(BLOCKS, ops=self.ops(), max_requests=SLOTS, kernels=kernels)

        self.fused, self.plain = make(type(self).kernels()), make(None)
        self.given: list[tuple[list[int], int]] = []  # what each allocation handed out, and to whom

    @step(counts=st.lists(st.integers(0, 4), min_size=1, max_size=3), slot=st.integers(0, SLOTS - 1))
    def allocate(self, counts: list[int], slot: int) -> None:
        slots = [slot] * len(counts) if len(counts) == 1 or slot % 2 else [(slot + i) % SLOTS for i in counts]
        results: list[Any] = []
        errors = [outcome(lambda p=p: results.append(p.allocate(counts, slots))) for p in (self.fused, self.plain)]
        assert errors[0] == errors[1], f"allocate({counts}, {slots}): fused raised {errors[0]}, arrays {errors[1]}"
        if errors[0] is None:
            (got, _), (want, _) = results
            assert got.dtype == want.dtype and got.tolist() == want.tolist(), (
                f"allocate({counts}, {slots}): fused gave {got.tolist()} ({got.dtype}), arrays {want.tolist()}"
            )
            if len(set(slots)) == 1:
                self.given.append((got.tolist(), slots[0]))

    @step(
        i=st.integers(0, 99),
        op=st.sampled_from(["free", "acquire"]),
        other=st.integers(0, SLOTS),
        extra=st.sampled_from([None, 0, -1, 10_000, "repeat"]),
        per_entry=st.booleans(),
    )
    def call(self, i: int, op: str, other: int, extra: Any, per_entry: bool) -> None:
        if not self.given:
            return
        named, slot = self.given[i % len(self.given)]
        named = list(named)
        slot = slot if op == "free" and other % 3 else other % SLOTS
        if extra == "repeat":
            named += named[:1]
        elif extra is not None:
            named.insert(len(named) // 2, extra)
        ids = type(self).as_ids(named)
        slots: Any = type(self).as_slots(len(named), slot) if per_entry else slot
        for p in (self.fused, self.plain):
            getattr(p, op)(ids, slots)

    @step()
    def check(self) -> None:
        got, want = outcome(self.fused.check), outcome(self.plain.check)
        assert got == want, f"check(): fused raised {got}, the array path {want}"
        assert self.fused.available_blocks() == self.plain.available_blocks(), "available_blocks() differs"

    @invariant()
    def same_state(self) -> None:
        if hasattr(self, "fused"):
            got, want = self.fused.snapshot(), self.plain.snapshot()
            assert got == want, f"after the same calls the fused state is {got}, the array path's {want}"
