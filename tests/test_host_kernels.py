"""The fused calls for host memory (torch on ``cpu``, NumPy) do exactly what the array paths do.

The machines of ``tests/kernel_support.py`` drive two allocators side by side, one with the host
kernels and one without, and compare the state both keep and the error each check raises after
every step: :class:`~kvref_arraypool.host_slot_kernels.HostSlotKernels` under the token-slot
allocator (allocations, good and bad frees, groups, checks, clears) and
:class:`~kvref_arraypool.host_block_kernels.HostBlockKernels` under the block pool's array
surface (one-slot allocations, frees and acquires, and calls of several slots on the array path
of both). Each runs element by element (small calls) and in whole-array NumPy calls. ``torch``
on ``cpu`` and ``cupy`` on the host build their array surfaces with these kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from kvref_arraypool.host_block_kernels import HostBlockKernels
from kvref_arraypool.host_slot_kernels import HostSlotKernels
from kvref_arraypool.host_views import SCALAR_LIMIT
from kvref_arraypool.ops import NumpyLikeOps

from kvref.config.registry import backend_statuses, load_backend
from tests.kernel_support import BlocksFusedBesideArrays, SlotsFusedBesideArrays

rule = pytest.mark.rule
KERNELS = {"slots": HostSlotKernels, "blocks": HostBlockKernels}
MACHINES = {"slots": SlotsFusedBesideArrays, "blocks": BlocksFusedBesideArrays}
LIMITS = pytest.mark.parametrize("limit", [SCALAR_LIMIT, 0], ids=["elementwise", "whole-arrays"])


def setup(library: str, kind: str, limit: int) -> dict[str, Any]:
    """What the machine needs for ``library`` (``numpy`` or ``torch-cpu``): its ops, kernels and inputs."""
    kernels = KERNELS[kind]
    if library == "numpy":
        return {
            "ops": staticmethod(lambda: NumpyLikeOps(np, device="host", is_device=False)),
            "kernels": staticmethod(lambda: kernels(view=lambda a: a, wrap=lambda a: a, scalar_limit=limit)),
            "as_input": staticmethod(lambda named: np.array(named, dtype=np.int32)),
            "as_ids": staticmethod(lambda named: np.array(named, dtype=np.int32)),
            "as_slots": staticmethod(lambda n, slot: np.full(n, slot, dtype=np.int64)),
        }
    torch = pytest.importorskip("torch")
    from kvref_torch.ops import TorchOps

    return {
        "ops": staticmethod(lambda: TorchOps("cpu")),
        "kernels": staticmethod(lambda: kernels(view=lambda t: t.numpy(), wrap=torch.from_numpy, scalar_limit=limit)),
        "as_input": staticmethod(lambda named: torch.tensor(named, dtype=torch.int32)),
        "as_ids": staticmethod(lambda named: torch.tensor(named, dtype=torch.int32)),
        "as_slots": staticmethod(lambda n, slot: torch.full((n,), slot)),
    }


@rule("ERR-511", "ERR-512", "ERR-513", "RADIX-606", "RADIX-607", "RADIX-610")
@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("library", ["numpy", "torch-cpu"])
@LIMITS
def test_the_host_slot_kernels_agree_with_the_array_path(limit: int, library: str, page: int, sort: bool) -> None:
    attrs = {"page": page, "sort": sort, **setup(library, "slots", limit)}
    machine = type("HostSlots", (SlotsFusedBesideArrays,), attrs)
    run_state_machine_as_test(machine, settings=settings(max_examples=40, stateful_step_count=30, deadline=None))


@rule("ERR-511", "ERR-512", "ERR-513", "ERR-518", "ERR-519", "ERR-520")
@pytest.mark.parametrize("library", ["numpy", "torch-cpu"])
@LIMITS
def test_the_host_block_kernels_agree_with_the_array_path(limit: int, library: str) -> None:
    machine = type("HostBlocks", (BlocksFusedBesideArrays,), setup(library, "blocks", limit))
    run_state_machine_as_test(machine, settings=settings(max_examples=60, stateful_step_count=30, deadline=None))


def host_backend(name: str) -> Any:
    """Backend ``name`` where it runs on the host here; a skip saying where it runs otherwise."""
    status = {s.name: s for s in backend_statuses()}[name]
    if not status.usable or status.device not in ("cpu", "host"):
        pytest.skip(f"{name} is not on the host here ({status.device or status.reason})")
    return load_backend(name)


@rule("ERR-510", "ERR-511")
@pytest.mark.parametrize("name", ["torch", "cupy"])
def test_the_cpu_backends_build_their_slot_allocators_with_the_host_kernels(name: str) -> None:
    backend = host_backend(name)
    arrays = backend.create_slot_arrays(64)
    for allocator in (arrays, backend.create_slots(64).arrays):
        assert isinstance(allocator.kernels, HostSlotKernels), (
            f"{name} built {allocator!r} with kernels {allocator.kernels!r}, not the host kernels"
        )
    got = arrays.alloc(3)
    assert got is not None and got.tolist() == [1, 2, 3], f"{name}: alloc(3) of a fresh allocator gave {got}"
    arrays.free(got)
    arrays.free(got)  # a double free: refused where the state is, raised by check (ERR-511)
    with pytest.raises(Exception, match="RADIX-606"):
        arrays.check()
    assert arrays.available_size() == 64, f"{name}: after a free and a refused double free {arrays.available_size()}"


@rule("ERR-520", "ERR-511")
@pytest.mark.parametrize("name", ["torch", "cupy"])
def test_the_cpu_backends_build_their_block_arrays_with_the_host_kernels(name: str) -> None:
    pool = host_backend(name).create_block_arrays(64)
    assert isinstance(pool.kernels, HostBlockKernels), f"{name} built {pool!r} with kernels {pool.kernels!r}"
    ids, _ = pool.allocate([3], [5])
    pool.free(ids, 5)
    pool.free(ids, 5)  # a double free: refused where the state is, raised by check (ERR-511)
    with pytest.raises(Exception, match="POOL-108"):
        pool.check()
    assert pool.available_blocks() == 63, f"{name}: after a free and a refused double free {pool.available_blocks()}"
