"""The slot allocator's fused calls for host memory (torch on ``cpu``, NumPy) do exactly what its array path does.

The machine of ``tests/kernel_support.py`` drives two :class:`DeviceSlotAllocator` side by side,
one with :class:`kvref_arraypool.host_slot_kernels.HostSlotKernels` and one without, through
allocations, good and bad frees, groups, checks and clears, and compares the state both keep and
the error each check raises after every step. These kernels are what ``torch`` on ``cpu`` and
``cupy`` on the host build their token-slot allocators with.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from kvref_arraypool.host_slot_kernels import SCALAR_LIMIT, HostSlotKernels
from kvref_arraypool.ops import NumpyLikeOps
from kvref_arraypool.slot_arrays import DeviceSlotAllocator

from kvref.config.registry import backend_statuses, load_backend
from tests.kernel_support import SlotsFusedBesideArrays

rule = pytest.mark.rule


def numpy_setup(limit: int) -> dict[str, Any]:
    return {
        "ops": staticmethod(lambda: NumpyLikeOps(np, device="host", is_device=False)),
        "kernels": staticmethod(lambda: HostSlotKernels(view=lambda a: a, wrap=lambda a: a, scalar_limit=limit)),
        "as_input": staticmethod(lambda named: np.array(named, dtype=np.int32)),
    }


def torch_setup(limit: int) -> dict[str, Any]:
    torch = pytest.importorskip("torch")
    from kvref_torch.ops import TorchOps

    return {
        "ops": staticmethod(lambda: TorchOps("cpu")),
        "kernels": staticmethod(
            lambda: HostSlotKernels(view=lambda t: t.numpy(), wrap=torch.from_numpy, scalar_limit=limit)
        ),
        "as_input": staticmethod(lambda named: torch.tensor(named, dtype=torch.int32)),
    }


SETUPS = {"numpy": numpy_setup, "torch-cpu": torch_setup}


@rule("ERR-511", "ERR-512", "ERR-513", "RADIX-606", "RADIX-607", "RADIX-610")
@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("library", sorted(SETUPS))
@pytest.mark.parametrize("limit", [SCALAR_LIMIT, 0], ids=["elementwise", "whole-arrays"])
def test_the_host_kernels_agree_with_the_array_path(limit: int, library: str, page: int, sort: bool) -> None:
    setup = SETUPS[library](limit)
    machine = type("HostFused", (SlotsFusedBesideArrays,), {"page": page, "sort": sort, **setup})
    run_state_machine_as_test(machine, settings=settings(max_examples=40, stateful_step_count=30, deadline=None))


@rule("ERR-510")
@pytest.mark.parametrize("name", ["torch", "cupy"])
def test_the_cpu_backends_build_their_slot_allocators_with_the_host_kernels(name: str) -> None:
    status = {s.name: s for s in backend_statuses()}[name]
    if not status.usable or status.device not in ("cpu", "host"):
        pytest.skip(f"{name} is not on the host here ({status.device or status.reason})")
    backend: Any = load_backend(name)
    arrays: DeviceSlotAllocator = backend.create_slot_arrays(64)
    listed: Any = backend.create_slots(64)
    for allocator in (arrays, listed.arrays):
        assert isinstance(allocator.kernels, HostSlotKernels), (
            f"{name} on {status.device} built {allocator!r} with kernels {allocator.kernels!r}, not the host kernels"
        )
    got = arrays.alloc(3)
    assert got is not None and got.tolist() == [1, 2, 3], f"{name}: alloc(3) of a fresh allocator gave {got}"
    arrays.free(got)
    arrays.free(got)  # a double free: refused on the "device", raised by check (ERR-511)
    with pytest.raises(Exception, match="RADIX-606"):
        arrays.check()
    assert arrays.available_size() == 64, f"{name}: after a free and a refused double free {arrays.available_size()}"
