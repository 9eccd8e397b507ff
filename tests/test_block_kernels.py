"""The fused Triton kernels of the block pool's array surface do exactly what its array path does.

A Hypothesis machine drives two :class:`DeviceBlockPool` side by side, one with
:class:`kvref_torch.block_kernels.TritonBlockKernels` and one without, through steps of one or
several request slots, good and bad frees and acquires of one slot (the fused calls) and of
several (the array path, on both), and checks; after every step it compares the state both keep
(free stack, references, generations, holding bits) and the error each check raises. Runs where
the kernels can: on CUDA, or on the CPU under Triton's interpreter (``nox -s kernels``).
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

from kvref_arraypool.block_arrays import DeviceBlockPool  # noqa: E402

from kvref_torch.block_kernels import TritonBlockKernels  # noqa: E402
from kvref_torch.ops import TorchOps  # noqa: E402
from tests.kernel_support import BlocksFusedBesideArrays, outside_the_counter  # noqa: E402

DEVICE = "cuda:0" if torch.cuda.is_available() else "cpu"


class FusedBesideArrays(BlocksFusedBesideArrays):
    """The Triton kernels beside the array path, on torch."""

    ops = staticmethod(lambda: TorchOps(DEVICE))
    kernels = TritonBlockKernels
    as_ids = staticmethod(lambda named: torch.tensor(named, dtype=torch.int32, device=DEVICE))
    as_slots = staticmethod(lambda n, slot: torch.full((n,), slot, device=DEVICE))


@pytest.mark.rule("ERR-511", "ERR-512", "ERR-513", "ERR-518", "ERR-519", "ERR-520")
def test_the_fused_kernels_agree_with_the_array_path() -> None:
    run_state_machine_as_test(
        FusedBesideArrays, settings=settings(max_examples=60, stateful_step_count=30, deadline=None)
    )


@pytest.mark.rule("ERR-520")
def test_a_call_of_4096_entries_is_one_program_and_a_larger_one_takes_the_array_path() -> None:
    fused = DeviceBlockPool(8193, ops=TorchOps(DEVICE), kernels=TritonBlockKernels())
    plain = DeviceBlockPool(8193, ops=TorchOps(DEVICE))
    for n in (4096, 4097):
        (a, _), (b, _) = fused.allocate([n], [1]), plain.allocate([n], [1])
        assert a.tolist() == b.tolist(), f"allocate([{n}], [1]) differs between the fused and the array path"
        fused.acquire(a, 2)
        plain.acquire(b, 2)
        for slot in (1, 2):
            fused.free(a, slot)
            plain.free(b, slot)
        assert fused.snapshot() == plain.snapshot(), f"after acquiring and freeing {n} the fused state differs"


class UncountedInterpreter(TritonBlockKernels):
    """The kernels, with the torch operations Triton's interpreter makes to move tensors (which a
    compiled kernel does not make) hidden from the launch counter; on CUDA, the kernels as they are."""

    def allocate(self, **kwargs: Any) -> Any:
        with outside_the_counter(DEVICE):
            return super().allocate(**kwargs)

    def call(self, **kwargs: Any) -> Any:
        with outside_the_counter(DEVICE):
            return super().call(**kwargs)


@pytest.mark.rule("ERR-513")
@pytest.mark.parametrize("n", [1, 16, 256, 4096])
def test_allocate_acquire_and_free_are_one_launch_each_and_wait_for_nothing(n: int) -> None:
    from kvref_torch.counting import CountLaunches

    kernels = UncountedInterpreter()
    pool = DeviceBlockPool(2 * n + 16, ops=TorchOps(DEVICE), kernels=kernels)
    with CountLaunches(pool.ops) as counter:
        ids, _ = pool.allocate([n], [5])
        pool.acquire(ids, 6)
        pool.free(ids, 6)
        pool.free(ids, 5)
    cost = counter.cost
    assert (kernels.launches, cost.launches, cost.syncs) == (4, 0, 0), (
        f"allocate({n}), acquire, free, free: {kernels.launches} Triton launches, {cost.launches} torch launches "
        f"({dict(cost.by_op)}) and {cost.syncs} syncs; the fused path promises 4, 0 and 0"
    )
