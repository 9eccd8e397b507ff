"""The array surface of chapter 06's allocator (ERR-510..ERR-514), for any target with ``slot-arrays``.

An engine on a GPU calls ``alloc(n)`` for a device array of slots and ``free(slots)`` with one,
and never waits for the device inside a step; errors are found on the device and raised by
``check()``. The tests here hold an implementation to when and how they are raised; the
machine at the end runs random traffic, bad frees included, beside the oracle's allocator and
checks only now and then, as a scheduler would once per step.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, run_state_machine_as_test
from hypothesis.stateful import rule as step

from kvref.contract.errors import InvalidTypeError, InvalidValueError, KVRefError, NotHeldError
from kvref.oracle.radix import OracleSlotAllocator
from kvref_conformance.suites.base import ConformanceSuite, rule, skip_without
from kvref_conformance.target import Target

__all__ = ["SlotArraysSuite"]


def arrays(impl: Target, size: int, **kwargs: Any) -> Any:
    """A new array-surface allocator of ``impl``, or a skip saying it has none."""
    skip_without(impl, "slot-arrays")
    return impl.create_slot_arrays(size, **kwargs)


def host(ids: Any) -> list[int]:
    """Device ids as Python ints (a host read: for checking, never on an engine's path)."""
    return [int(x) for x in ids.tolist()]


def raised(call: Any) -> KVRefError | None:
    try:
        call()
    except KVRefError as exc:
        return exc
    return None


class SlotArraysSuite(ConformanceSuite):
    """ERR-510..ERR-514 over the target's ``create_slot_arrays``."""

    @rule("ERR-510")
    @pytest.mark.parametrize("dtype", ["int32", "int64"])
    def test_alloc_returns_a_fresh_array_of_the_chosen_dtype(self, impl: Target, dtype: str) -> None:
        a = arrays(impl, 8, dtype=dtype, sort=False)
        got = a.alloc(8)
        assert str(got.dtype).endswith(dtype), f"[ERR-510] alloc(8) returned dtype {got.dtype}, asked for {dtype}"
        first = host(got)
        a.free(first[4:])
        a.check()
        assert host(got) == first, f"[ERR-510] the caller's array changed from {first} to {host(got)} under a free"
        got[:] = 0  # the caller owns the output: scribbling on it must not reach the allocator
        a.free(first[:4])
        a.check()
        again = sorted(host(a.alloc(8)))
        assert again == list(range(1, 9)), f"[ERR-510] after writing into an output, alloc(8) gave {again}"

    @rule("ERR-510")
    def test_ids_that_do_not_fit_int32_are_refused_at_construction(self, impl: Target) -> None:
        skip_without(impl, "slot-arrays")
        exc = raised(lambda: impl.create_slot_arrays(2**31, dtype="int32"))
        assert isinstance(exc, InvalidValueError) and exc.rule == "ERR-510", (
            f"[ERR-510] an int32 allocator of 2**31 slots gave {exc!r}; its ids cannot fit"
        )

    @rule("ERR-511", "ERR-512")
    def test_a_double_free_is_raised_by_check_naming_its_call_and_entry(self, impl: Target) -> None:
        a = arrays(impl, 8)
        ids = host(a.alloc(4))
        a.free(ids[:2])  # call 0
        a.free([ids[2], ids[0]])  # call 1: ids[0] again, refused: ids[2] stays allocated
        a.free(ids[3:])  # call 2 takes effect
        exc = raised(a.check)
        assert isinstance(exc, NotHeldError) and exc.rule == "RADIX-606", (
            f"[ERR-511] check() after a double free raised {exc!r}; the list form raises NotHeldError RADIX-606"
        )
        assert getattr(exc, "call_index", None) == 1 and "entry 1" in str(exc), (
            f"[ERR-512] the report names call {getattr(exc, 'call_index', None)}: {exc}; call 1, entry 1 was refused"
        )
        assert a.available_size() == 7, (
            f"[ERR-511] {a.available_size()} slots available; calls 0 and 2 freed 3 of 4, call 1 nothing: 7 of 8"
        )
        assert raised(a.check) is None, "[ERR-512] check() raised the same error a second time"

    @rule("ERR-512")
    def test_a_host_read_raises_the_pending_error_before_it_changes_anything(self, impl: Target) -> None:
        a = arrays(impl, 4)
        ids = host(a.alloc(4))
        a.free([0])  # the padding page: refused
        exc = raised(lambda: a.alloc(1))  # beyond the host's free count: it reads the device
        assert exc is not None and exc.rule == "RADIX-602", f"[ERR-512] alloc after a refused free gave {exc!r}"
        a.free(ids[:1])
        assert a.available_size() == 1, f"[ERR-512] available_size {a.available_size()} after freeing one slot"
        a.free([9])  # out of range
        a.clear()
        exc = raised(a.check)
        assert exc is not None and exc.rule == "RADIX-606", f"[ERR-512] clear() lost the pending error: {exc!r}"

    @rule("ERR-513")
    def test_counts_are_exact_after_frees_made_without_a_check(self, impl: Target) -> None:
        a = arrays(impl, 16, page_size=4)
        ids = host(a.alloc(16))
        a.free(ids[:3])  # one page, named thrice
        a.free(ids[4:12:4])  # two pages by their first slots
        assert a.available_size() == 12, f"[ERR-513] available_size {a.available_size()}; three pages were freed"
        assert len(host(a.alloc(12))) == 12, "[ERR-513] the freed pages could not be allocated again"

    @rule("RADIX-612", "ERR-510")
    def test_a_steps_allocation_is_one_array_and_its_offsets(self, impl: Target) -> None:
        a = arrays(impl, 8)
        got = a.alloc_many([2, 0, 3])
        assert got is not None, "[RADIX-612] alloc_many([2, 0, 3]) of 8 free slots gave None"
        slots, offsets = got
        assert host(slots) == [1, 2, 3, 4, 5] and offsets == [0, 2, 2, 5], (
            f"[RADIX-612] alloc_many([2, 0, 3]) gave {host(slots)} at offsets {offsets}; one alloc(5) gives "
            "[1, 2, 3, 4, 5], the requests starting at 0, 2 and 2"
        )
        assert a.alloc_many([2, 2]) is None and a.available_size() == 3, "[RADIX-612] a step that does not fit"

    @rule("RADIX-616", "ERR-511")
    @pytest.mark.parametrize("sort", [True, False])
    def test_a_step_frees_then_allocates_as_the_two_calls_would(self, impl: Target, sort: bool) -> None:
        step, two = arrays(impl, 8, sort=sort), arrays(impl, 8, sort=sort)
        held = [host(a.alloc(4)) for a in (step, two)]
        got = step.free_then_alloc(held[0][:2], 3)
        two.free(held[1][:2])
        want = two.alloc(3)
        assert got is not None and want is not None and host(got) == host(want), (
            f"[RADIX-616] free_then_alloc({held[0][:2]}, 3) gave {None if got is None else host(got)}; "
            f"free then alloc gave {None if want is None else host(want)}"
        )
        bad = step.free_then_alloc([held[0][0]], 1)  # a double free: recorded, the allocation still made
        two.free([held[1][0]])
        again = two.alloc(1)
        assert bad is not None and again is not None and host(bad) == host(again), (
            f"[RADIX-616] after a double free the step gave {None if bad is None else host(bad)}, the two calls "
            f"{None if again is None else host(again)}"
        )
        errors = [raised(a.check) for a in (step, two)]
        assert errors[0] is not None and errors[1] is not None and errors[0].rule == errors[1].rule == "RADIX-606", (
            f"[RADIX-616] check() after the double free raised {errors[0]!r} for the step, {errors[1]!r} for the "
            "two calls; both must raise RADIX-606"
        )
        assert step.available_size() == two.available_size(), (
            f"[RADIX-616] available_size {step.available_size()} after the steps, {two.available_size()} after "
            "the two calls"
        )

    @rule("RADIX-616", "ERR-514")
    def test_a_step_refused_at_once_frees_nothing(self, impl: Target) -> None:
        a = arrays(impl, 8, page_size=2)
        ids = host(a.alloc(4))
        for what, call in [
            ("a misaligned allocation", lambda: a.free_then_alloc(ids, 3)),
            ("slots of floats", lambda: a.free_then_alloc([1.5], 2)),
        ]:
            exc = raised(call)
            assert isinstance(exc, InvalidValueError | InvalidTypeError), (
                f"[RADIX-616] free_then_alloc with {what} raised {exc!r} at once; expected a refusal"
            )
        a.check()
        assert a.available_size() == 4, (
            f"[RADIX-616] refused steps changed available_size to {a.available_size()}; they must free nothing"
        )

    @rule("ERR-514")
    def test_what_the_host_can_decide_is_raised_at_once(self, impl: Target) -> None:
        a = arrays(impl, 8, page_size=2)
        for what, call, kind in [
            ("free of floats", lambda: a.free([1.5]), InvalidTypeError),
            ("a misaligned alloc", lambda: a.alloc(3), InvalidValueError),
            ("a nested free group", lambda: (a.free_group_begin(), a.free_group_begin()), InvalidValueError),
        ]:
            exc = raised(call)
            assert isinstance(exc, kind), f"[ERR-514] {what} raised {exc!r} at once, expected {kind.__name__}"
        assert a.available_size() == 8, f"[ERR-514] the refused calls changed available_size to {a.available_size()}"

    @rule("ERR-511", "ERR-512", "ERR-513")
    @pytest.mark.parametrize("sort", [True, False])
    @pytest.mark.parametrize("page", [1, 4])
    def test_deferred_traffic_agrees_with_the_oracle(self, impl: Target, page: int, sort: bool) -> None:
        skip_without(impl, "slot-arrays")
        machine = type("DeferredTraffic", (DeferredTraffic,), {"target": impl, "page": page, "sort": sort})
        run_state_machine_as_test(machine)


class DeferredTraffic(RuleBasedStateMachine):
    """Allocations, good and bad frees and groups, checked only now and then, beside the oracle."""

    target: Target
    page: int
    sort: bool

    @initialize()
    def create(self) -> None:
        size = 12 * self.page
        self.impl = self.target.create_slot_arrays(size, page_size=self.page, sort=self.sort)
        self.oracle = OracleSlotAllocator(size, page_size=self.page, sort=self.sort)
        self.held: list[tuple[list[int], list[int]]] = []
        self.freed: list[tuple[list[int], list[int]]] = []
        self.calls = 0  # non-empty frees made: the index the next one gets
        self.pending: tuple[int, str] | None = None  # the first refused call not yet raised
        self.group = False

    def _pending_raised(self, exc: KVRefError | None, what: str) -> None:
        want = self.pending
        got = None if exc is None else (getattr(exc, "call_index", None), exc.rule)
        assert got == want, f"[ERR-512] {what} raised {exc!r}; the first refused call not yet raised is {want}"
        self.pending = None

    @step(pages=st.integers(0, 5))
    def alloc(self, pages: int) -> None:
        n = pages * self.page
        result: list[Any] = []
        exc = raised(lambda: result.append(self.impl.alloc(n)))
        if exc is not None:  # a host read raised the error of an earlier call (ERR-512): nothing changed
            self._pending_raised(exc, f"alloc({n})")
            return
        got, want = result[0], self.oracle.alloc(n)
        assert (got is None) == (want is None), f"[ERR-513] alloc({n}) gave {got}, the oracle {want}"
        if got is not None and want is not None:
            self.held.append((host(got), list(want)))

    @precondition(lambda self: self.held)
    @step(i=st.integers(0, 99))
    def free(self, i: int) -> None:
        mine, theirs = self.held.pop(i % len(self.held))
        self._free(mine, theirs)
        self.freed.append((mine, theirs))

    @precondition(lambda self: self.freed)
    @step(i=st.integers(0, 99))
    def free_again(self, i: int) -> None:
        mine, theirs = self.freed[i % len(self.freed)]
        self._free(mine, theirs)

    @step(bad=st.sampled_from(["padding", "out of range", "negative"]))
    def free_bad(self, bad: str) -> None:
        value = {"padding": 0, "out of range": 13 * self.page, "negative": -1}[bad]
        self._free([value], [value])

    def _free(self, mine: list[int], theirs: list[int]) -> None:
        if not mine:
            return
        self.impl.free(mine)
        refused = raised(lambda: self.oracle.free(theirs))
        if refused is not None and self.pending is None:
            self.pending = (self.calls, refused.rule)
        self.calls += 1

    @step()
    def toggle_group(self) -> None:
        if self.group:
            self.impl.free_group_end()
            self.oracle.free_group_end()
        else:
            self.impl.free_group_begin()
            self.oracle.free_group_begin()
        self.group = not self.group

    @step()
    def check(self) -> None:
        self._pending_raised(raised(self.impl.check), "check()")
        got, want = self.impl.available_size(), self.oracle.available_size()
        assert got == want, f"[ERR-513] available_size {got} after check(), the oracle counts {want}"

    @invariant()
    def nothing_raised_twice(self) -> None:
        if hasattr(self, "impl") and self.pending is None:
            assert raised(self.impl.check) is None, "[ERR-512] check() raised with no refused call pending"
