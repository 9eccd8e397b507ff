"""The fused Triton kernels of the token-slot allocator do exactly what its array path does.

A Hypothesis machine drives two :class:`DeviceSlotAllocator` side by side, one with
:class:`kvref_torch.slot_kernels.TritonSlotKernels` and one without, through allocations, good and
bad frees, groups, checks and clears, and compares after every step the state both keep (free
order, page states, versions) and the error each check raises. Runs where the kernels can: on
CUDA, or on the CPU under Triton's interpreter (``nox -s kernels`` sets ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, run_state_machine_as_test
from hypothesis.stateful import rule as step

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the Triton kernels need CUDA or TRITON_INTERPRET=1 (nox -s kernels)", allow_module_level=True)

from kvref_arraypool.slot_arrays import DeviceSlotAllocator  # noqa: E402

from kvref_torch.ops import TorchOps  # noqa: E402
from kvref_torch.slot_kernels import TritonSlotKernels  # noqa: E402
from tests.kernel_support import outcome, outside_the_counter  # noqa: E402

DEVICE = "cuda:0" if torch.cuda.is_available() else "cpu"


class FusedBesideArrays(RuleBasedStateMachine):
    """The same calls on the fused and the array path; the same state and errors after each."""

    page = 1
    sort = True

    @initialize()
    def create(self) -> None:
        def make(kernels: Any) -> DeviceSlotAllocator:
            return DeviceSlotAllocator(
                12 * self.page, ops=TorchOps(DEVICE), page_size=self.page, sort=self.sort, kernels=kernels
            )

        self.fused, self.plain = make(TritonSlotKernels()), make(None)
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
        if not self.held:
            return
        named = list(self.held[i % len(self.held)])
        if not again:
            self.held.pop(i % len(self.held))
        if extra is not None:
            named.insert(len(named) // 2, extra)
        for a in (self.fused, self.plain):
            a.free(torch.tensor(named, dtype=torch.int32, device=DEVICE))

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


@pytest.mark.rule("ERR-511", "ERR-512", "ERR-513", "RADIX-606", "RADIX-610")
@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("page", [1, 4])
def test_the_fused_kernels_agree_with_the_array_path(page: int, sort: bool) -> None:
    machine = type("Fused", (FusedBesideArrays,), {"page": page, "sort": sort})
    run_state_machine_as_test(machine, settings=settings(max_examples=40, stateful_step_count=30, deadline=None))


@pytest.mark.rule("ERR-510")
def test_a_free_of_4096_entries_is_one_program_and_a_larger_one_takes_the_array_path() -> None:
    size = 8192
    fused = DeviceSlotAllocator(size, ops=TorchOps(DEVICE), kernels=TritonSlotKernels())
    plain = DeviceSlotAllocator(size, ops=TorchOps(DEVICE))
    for n in (4096, 4097):
        a, b = fused.alloc(n), plain.alloc(n)
        assert a is not None and b is not None and a.tolist() == b.tolist(), (
            f"alloc({n}) differs between the fused and the array path"
        )
        fused.free(a)
        plain.free(b)
        assert fused.snapshot() == plain.snapshot(), f"after a free of {n} the fused state differs"


class UncountedInterpreter(TritonSlotKernels):
    """The kernels, with the torch operations Triton's interpreter makes to move tensors (which a
    compiled kernel does not make) hidden from the launch counter; on CUDA, the kernels as they are."""

    def alloc(self, **kwargs: Any) -> Any:
        with outside_the_counter(DEVICE):
            return super().alloc(**kwargs)

    def free(self, **kwargs: Any) -> Any:
        with outside_the_counter(DEVICE):
            return super().free(**kwargs)


@pytest.mark.rule("ERR-513")
@pytest.mark.parametrize("n", [1, 16, 256, 4096])
def test_alloc_and_free_are_one_launch_each_and_wait_for_nothing(n: int) -> None:
    from kvref_torch.counting import CountLaunches

    kernels = UncountedInterpreter()
    slots = DeviceSlotAllocator(2 * n + 16, ops=TorchOps(DEVICE), kernels=kernels)
    with CountLaunches(slots.ops) as counter:
        slots.free(slots.alloc(n))
    cost = counter.cost
    assert (kernels.launches, cost.launches, cost.syncs) == (2, 0, 0), (
        f"alloc({n}) + free: {kernels.launches} Triton launches, {cost.launches} torch launches "
        f"({dict(cost.by_op)}) and {cost.syncs} syncs; the fused path promises 2, 0 and 0"
    )
