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
from hypothesis.stateful import run_state_machine_as_test

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the Triton kernels need CUDA or TRITON_INTERPRET=1 (nox -s kernels)", allow_module_level=True)

from kvref_arraypool.slot_arrays import DeviceSlotAllocator  # noqa: E402

from kvref_torch.ops import TorchOps  # noqa: E402
from kvref_torch.slot_kernels import TritonSlotKernels  # noqa: E402
from tests.kernel_support import SlotsFusedBesideArrays, outside_the_counter  # noqa: E402

DEVICE = "cuda:0" if torch.cuda.is_available() else "cpu"


@pytest.mark.rule("ERR-511", "ERR-512", "ERR-513", "RADIX-606", "RADIX-610")
@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("page", [1, 4])
def test_the_fused_kernels_agree_with_the_array_path(page: int, sort: bool) -> None:
    machine = type(
        "Fused", (SlotsFusedBesideArrays,),
        {
            "page": page, "sort": sort, "ops": staticmethod(lambda: TorchOps(DEVICE)), "kernels": TritonSlotKernels,
            "as_input": staticmethod(lambda named: torch.tensor(named, dtype=torch.int32, device=DEVICE)),
        },
    )  # fmt: skip
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


@pytest.mark.rule("RADIX-606", "ERR-511")
def test_a_free_of_a_strided_view_releases_the_slots_it_shows() -> None:
    slots = DeviceSlotAllocator(64, ops=TorchOps(DEVICE), kernels=TritonSlotKernels())
    got = slots.alloc(8)
    assert got is not None
    slots.free(got[::2])
    slots.check()
    allocated = [slots.is_allocated(s) for s in got.tolist()]
    assert allocated == [False, True] * 4, (
        f"free(slots[::2]) left allocated flags {allocated}; the kernel must free every other slot it shows, "
        "not the first four in memory"
    )
