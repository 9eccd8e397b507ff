"""The array core's paths a CPU build no longer takes by default, driven beside the oracle.

On the CPU the torch backend runs its list-protocol pools on NumPy over tensor memory
(``kvref_torch.host_ops``); with numba installed the common calls run as compiled kernels
(``kvref_arraypool.host_jit``), and without it calls of up to ``scalar_limit`` blocks take the
core's element-by-element paths. So ``kvref conformance --backend torch|cupy`` on a CPU checks the
compiled kernels; the paths a GPU runs are the same code on another array library: torch's own ops
(``TorchOps``) and the NumPy array path at every batch size (``scalar_limit=0``, nothing compiled).
Here the differential machine, with the targeted and batched steps, holds each path to the oracle.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from kvref_arraypool.host_jit import host_kernels
from kvref_arraypool.ops import ArrayOps, NumpyLikeOps
from kvref_arraypool.pool import ArrayBlockPool
from kvref_arraypool.table import HashTable

from kvref_conformance.machines import make_machine
from kvref_conformance.target import Target

rule = pytest.mark.rule


def numpy_ops() -> ArrayOps:
    return NumpyLikeOps(np, device="cpu", is_device=False, compiled=False)


def compiled_ops() -> ArrayOps:
    ops = NumpyLikeOps(np, device="cpu", is_device=False)
    if host_kernels() is None:
        pytest.skip("numba is not installed (the jit extra), or KVREF_HOST_JIT=0")
    return ops


def torch_ops() -> ArrayOps:
    pytest.importorskip("torch")
    from kvref_torch.ops import TorchOps

    return TorchOps("cpu")


PATHS = {
    "torch-ops": (torch_ops, None),  # what a CUDA device runs, on the CPU
    "numpy-arrays": (numpy_ops, 0),  # CuPy's path on a device, on NumPy: no element paths, no element probes
    "numpy-elements": (numpy_ops, 16),  # the CPU default without numba: element paths up to 16 blocks
    "numpy-compiled": (compiled_ops, 16),  # the CPU default with numba: compiled kernels, element paths beside
}


def path_target(path: str) -> Target:
    make_ops, limit = PATHS[path]
    make_ops()  # skips here when the library is missing

    def factory(num_blocks: int, **kwargs: Any) -> ArrayBlockPool:
        return ArrayBlockPool(num_blocks, ops=make_ops(), scalar_limit=limit, name=path, **kwargs)

    capabilities = factory(2).capabilities()
    return Target.from_factory(path, factory, capabilities=capabilities, profile="exact-order")


@rule("POOL-104", "POOL-107", "POOL-108", "POOL-110", "PFX-309", "PFX-311", "EVICT-408")
@pytest.mark.parametrize("policy", ["lru", "lru-leaf-access", "fifo", "ref-zero"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_each_array_path_answers_every_call_as_the_oracle_does(path: str, policy: str) -> None:
    """The targeted machine (paused holders, hashless blocks, batched forms, shared blocks) on one path."""
    machine = make_machine(path_target(path), policy, targeted=True)
    run_state_machine_as_test(machine, settings=settings(max_examples=25, stateful_step_count=40, deadline=None))


@rule("STATE-006")
@pytest.mark.parametrize("limit", [0, 16])
def test_scalar_limit_decides_whether_the_hash_tables_probe_key_by_key(monkeypatch: Any, limit: int) -> None:
    """``scalar_limit=0`` is the array path throughout, the tables' probes included (as on a device)."""
    probed: list[int] = []
    slot_of = HashTable.slot_of

    def spied(table: HashTable, key: int) -> int:
        probed.append(key)
        return slot_of(table, key)

    monkeypatch.setattr(HashTable, "slot_of", spied)
    pool = ArrayBlockPool(8, ops=numpy_ops(), scalar_limit=limit)
    ids = pool.allocate(2, holder="a")
    pool.acquire(ids, holder="b")  # shared: both holders' counts go to the shared table
    pool.register(ids, [5, 6])
    pool.free(ids, holder="b")
    assert bool(probed) == bool(limit), (
        f"scalar_limit={limit}: {len(probed)} keys probed one by one; expected {'some' if limit else 'none'}"
    )
