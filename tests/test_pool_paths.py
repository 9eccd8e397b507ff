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

from kvref.contract.errors import KVRefError
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


@rule("ERR-501", "PFX-303", "POOL-103")
def test_a_refused_long_register_on_the_compiled_path_names_its_rule_and_leaves_the_pool_usable() -> None:
    """The compiled register makes room in the entry index before it checks the call: only as much
    as the entry stack can give, so 20 positions on an 8-block pool are refused by their rule, not
    by an index that cannot hold them (which made the pool unusable, ERR-515)."""
    ops = compiled_ops()
    for ids, rule_id in (([1] * 20, "PFX-303"), (list(range(1, 21)), "POOL-103")):
        pool = ArrayBlockPool(8, ops=ops)
        pool.allocate(7, holder="a")
        before = pool.snapshot()
        with pytest.raises(KVRefError) as refused:
            pool.register(ids, list(range(1, 21)))
        assert getattr(refused.value, "rule", None) == rule_id, (
            f"register({ids}, 20 hashes) on 8 blocks raised {refused.value!r}; the rule is {rule_id}"
        )
        assert pool.snapshot() == before, f"the refused register({ids}, ...) changed the pool (ERR-501)"
        pool.free(pool.allocate(0, holder="a"), holder="a")  # still usable
        pool.register([1], [7])


@rule("ERR-501", "POOL-103")
def test_a_refused_acquire_on_the_compiled_path_does_not_grow_the_shared_counts_table() -> None:
    """The compiled pin counts the table keys a call needs only once the call is checked, so a
    refused acquire of a million ids leaves the per-holder counts' table as it was (it grew to
    8 million slots, 128 MiB, when room was made for every position first)."""
    pool = ArrayBlockPool(64, ops=compiled_ops())
    pool.allocate(2, holder="a")
    capacity = pool._shared.table.capacity
    before = pool.snapshot()
    with pytest.raises(KVRefError) as refused:
        pool.acquire([10**6] * 1_000_000, holder="b")
    assert getattr(refused.value, "rule", None) == "POOL-103", f"acquire of out-of-range ids raised {refused.value!r}"
    assert pool.snapshot() == before, "the refused acquire changed the pool (ERR-501)"
    assert pool._shared.table.capacity == capacity, (
        f"a refused acquire grew the shared counts' table from {capacity} to {pool._shared.table.capacity} slots"
    )


@rule("STATE-002")
def test_the_compiled_pin_makes_room_for_a_third_holder_when_the_table_is_full() -> None:
    """Blocks with two holders inline and a third arriving need one table key each: the compiled
    pin asks for exactly that room (status 2), gets it, and pins, as the array path would."""
    pools = [ArrayBlockPool(300, ops=make()) for make in (compiled_ops, numpy_ops)]
    for pool in pools:
        ids = pool.allocate(256, holder="a")
        pool.acquire(ids, holder="b")
        pool.acquire(ids, holder="c")  # 256 new keys in a table made for 64
        pool.acquire(ids[::2], holder="d")
        pool.free(ids[1::2], holder="c")
    compiled, plain = (pool.snapshot() for pool in pools)
    assert compiled == plain, "four holders' counts differ between the compiled pin and the array path"
    pools[0].check_invariants()


@rule("PFX-309", "PFX-311")
def test_a_match_whose_probe_runs_long_looks_up_and_pins_the_exact_way(monkeypatch: Any) -> None:
    """On a device, match reads its lookup and pin flags at once unless a hash sat past its home's window
    (``HashTable.find_near``); then it falls back to the exact lookup. Every hash flagged far: the same answers."""
    find_near = HashTable.find_near

    def all_far(table: HashTable, keys: Any, default: int = -1) -> tuple[Any, Any]:
        values, far = find_near(table, keys, default)
        return values, far | True

    monkeypatch.setattr(HashTable, "find_near", all_far)
    machine = make_machine(path_target("numpy-arrays"), "lru", targeted=True)
    run_state_machine_as_test(machine, settings=settings(max_examples=15, stateful_step_count=40, deadline=None))


@rule("STATE-006")
def test_an_edit_of_the_inlined_helpers_drops_the_cached_pool_kernels(tmp_path: Any) -> None:
    """numba keys a cached kernel to its own file: ``host_jit_pool``'s kernels inline helpers of
    ``host_jit_kernels.py``, so a changed helpers' file must drop their cache (else the old helper runs:
    a stale ``erase`` inside the cached ``unregister`` left the index unable to find its keys, STATE-006)."""
    from kvref_arraypool import host_jit

    (tmp_path / "host_jit_kernels.py").write_text("def erase(): pass\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    cached = [cache / "host_jit_pool.unregister-129.py311.nbi", cache / "host_jit_pool.unregister-129.py311.1.nbc"]
    other = cache / "host_jit_kernels.find_slots-40.py311.nbi"
    for f in (*cached, other):
        f.write_text("compiled")
    host_jit.drop_stale_pool_caches(tmp_path)  # no digest yet: the pool's caches may be stale
    assert not any(f.exists() for f in cached) and other.exists(), "a first look must drop host_jit_pool's caches only"
    for f in cached:
        f.write_text("compiled")
    host_jit.drop_stale_pool_caches(tmp_path)
    assert all(f.exists() for f in cached), "caches compiled with the same helpers must be kept"
    (tmp_path / "host_jit_kernels.py").write_text("def erase(): return 1\n")
    host_jit.drop_stale_pool_caches(tmp_path)
    assert not any(f.exists() for f in cached), "an edited helpers' file must drop the kernels that inline it"
