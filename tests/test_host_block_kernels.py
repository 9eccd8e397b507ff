"""The block pool's fused calls for host memory (torch on ``cpu``, NumPy) do exactly what its array path does.

The machine of ``tests/kernel_support.py`` drives two :class:`DeviceBlockPool` side by side, one
with :class:`kvref_arraypool.host_block_kernels.HostBlockKernels` and one without, through
allocations of one or several request slots, good and bad frees and acquires of one slot (the
fused calls) and of several (the array path, on both), and checks; after every step it compares
the state both keep and the error each check raises. ``torch`` on ``cpu`` and ``cupy`` on the
host build their block array surfaces with these kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from kvref_arraypool.block_arrays import DeviceBlockPool
from kvref_arraypool.host_block_kernels import SCALAR_LIMIT, HostBlockKernels
from kvref_arraypool.ops import NumpyLikeOps

from kvref.config.registry import backend_statuses, load_backend
from tests.kernel_support import BlocksFusedBesideArrays

rule = pytest.mark.rule


def numpy_setup(limit: int) -> dict[str, Any]:
    return {
        "ops": staticmethod(lambda: NumpyLikeOps(np, device="host", is_device=False)),
        "kernels": staticmethod(lambda: HostBlockKernels(view=lambda a: a, wrap=lambda a: a, scalar_limit=limit)),
        "as_ids": staticmethod(lambda named: np.array(named, dtype=np.int32)),
        "as_slots": staticmethod(lambda n, slot: np.full(n, slot, dtype=np.int64)),
    }


def torch_setup(limit: int) -> dict[str, Any]:
    torch = pytest.importorskip("torch")
    from kvref_torch.ops import TorchOps

    return {
        "ops": staticmethod(lambda: TorchOps("cpu")),
        "kernels": staticmethod(
            lambda: HostBlockKernels(view=lambda t: t.numpy(), wrap=torch.from_numpy, scalar_limit=limit)
        ),
        "as_ids": staticmethod(lambda named: torch.tensor(named, dtype=torch.int32)),
        "as_slots": staticmethod(lambda n, slot: torch.full((n,), slot)),
    }


SETUPS = {"numpy": numpy_setup, "torch-cpu": torch_setup}


@rule("ERR-511", "ERR-512", "ERR-513", "ERR-518", "ERR-519", "ERR-520")
@pytest.mark.parametrize("library", sorted(SETUPS))
@pytest.mark.parametrize("limit", [SCALAR_LIMIT, 0], ids=["elementwise", "whole-arrays"])
def test_the_host_kernels_agree_with_the_array_path(limit: int, library: str) -> None:
    machine = type("HostFused", (BlocksFusedBesideArrays,), SETUPS[library](limit))
    run_state_machine_as_test(machine, settings=settings(max_examples=60, stateful_step_count=30, deadline=None))


@rule("ERR-520")
@pytest.mark.parametrize("name", ["torch", "cupy"])
def test_the_cpu_backends_build_their_block_arrays_with_the_host_kernels(name: str) -> None:
    status = {s.name: s for s in backend_statuses()}[name]
    if not status.usable or status.device not in ("cpu", "host"):
        pytest.skip(f"{name} is not on the host here ({status.device or status.reason})")
    backend: Any = load_backend(name)
    pool: DeviceBlockPool = backend.create_block_arrays(64)
    assert isinstance(pool.kernels, HostBlockKernels), (
        f"{name} on {status.device} built {pool!r} with kernels {pool.kernels!r}, not the host kernels"
    )
    ids, _ = pool.allocate([3], [5])
    pool.free(ids, 5)
    pool.free(ids, 5)  # a double free: refused on the "device", raised by check (ERR-511)
    with pytest.raises(Exception, match="POOL-108"):
        pool.check()
    assert pool.available_blocks() == 63, f"{name}: after a free and a refused double free {pool.available_blocks()}"
