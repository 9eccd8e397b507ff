"""The array core on each array library it runs on, driven beside the oracle.

The core has one path per operation, the one a GPU runs; on a CPU torch runs it on its own CPU
tensors (``TorchOps``) and CuPy's backend on NumPy (``NumpyLikeOps``). ``kvref conformance
--backend torch|cupy`` checks both through the backends; here the differential machine, with the
targeted and batched steps, holds each library's run of the core to the oracle under every policy,
and a few hostile calls check what the core's scratch arrays and tables do with them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from kvref_arraypool.ops import ArrayOps, NumpyLikeOps
from kvref_arraypool.pool import ArrayBlockPool
from kvref_arraypool.table import HashTable

from kvref.contract.errors import KVRefError
from kvref_conformance.machines import make_machine
from kvref_conformance.target import Target

rule = pytest.mark.rule


def numpy_ops() -> ArrayOps:
    return NumpyLikeOps(np, device="cpu", is_device=False)


def torch_ops() -> ArrayOps:
    pytest.importorskip("torch")
    from kvref_torch.ops import TorchOps

    return TorchOps("cpu")


PATHS = {
    "torch-ops": torch_ops,  # torch's own operations, as a CUDA device runs them
    "numpy-arrays": numpy_ops,  # CuPy's operations, spelled by NumPy
}


def path_target(path: str) -> Target:
    make_ops = PATHS[path]
    make_ops()  # skips here when the library is missing

    def factory(num_blocks: int, **kwargs: Any) -> ArrayBlockPool:
        return ArrayBlockPool(num_blocks, ops=make_ops(), name=path, **kwargs)

    capabilities = factory(2).capabilities()
    return Target.from_factory(path, factory, capabilities=capabilities, profile="exact-order")


@rule("POOL-104", "POOL-107", "POOL-108", "POOL-110", "PFX-309", "PFX-311", "EVICT-408")
@pytest.mark.parametrize("policy", ["lru", "lru-leaf-access", "fifo", "ref-zero"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_each_array_path_answers_every_call_as_the_oracle_does(path: str, policy: str) -> None:
    """The targeted machine (paused holders, hashless blocks, batched forms, shared blocks) on one path."""
    machine = make_machine(path_target(path), policy, targeted=True)
    run_state_machine_as_test(machine, settings=settings(max_examples=25, stateful_step_count=40, deadline=None))


@rule("ERR-501", "PFX-303", "POOL-103")
def test_a_refused_long_register_names_its_rule_and_leaves_the_pool_usable() -> None:
    """20 positions on an 8-block pool are refused by their rule, not by an entry index that cannot
    hold them (which would make the pool unusable, ERR-515)."""
    ops = numpy_ops()
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
def test_a_refused_acquire_does_not_grow_the_shared_counts_table() -> None:
    """The per-holder counts' table grows only for a checked call, so a refused acquire of a
    million ids leaves it as it was (8 million slots, 128 MiB, if room were made for every position)."""
    pool = ArrayBlockPool(64, ops=numpy_ops())
    pool.allocate(2, holder="a")
    capacity = pool.references.shared.table.capacity
    before = pool.snapshot()
    with pytest.raises(KVRefError) as refused:
        pool.acquire([10**6] * 1_000_000, holder="b")
    assert getattr(refused.value, "rule", None) == "POOL-103", f"acquire of out-of-range ids raised {refused.value!r}"
    assert pool.snapshot() == before, "the refused acquire changed the pool (ERR-501)"
    grown = pool.references.shared.table.capacity
    assert grown == capacity, f"a refused acquire grew the shared counts' table from {capacity} to {grown} slots"


@rule("STATE-002")
def test_a_third_holder_of_many_blocks_grows_the_shared_counts_table_on_every_library() -> None:
    """Blocks with two holders inline and a third arriving need one table key each, 256 in a table
    made for 64: the table grows, and torch's and NumPy's runs of the core end in the same state."""
    pytest.importorskip("torch")
    pools = [ArrayBlockPool(300, ops=make()) for make in (torch_ops, numpy_ops)]
    for pool in pools:
        ids = pool.allocate(256, holder="a")
        pool.acquire(ids, holder="b")
        pool.acquire(ids, holder="c")  # 256 new keys in a table made for 64
        pool.acquire(ids[::2], holder="d")
        pool.free(ids[1::2], holder="c")
    on_torch, on_numpy = (pool.snapshot() for pool in pools)
    assert on_torch == on_numpy, "four holders' counts differ between torch's and NumPy's runs of the core"
    for pool in pools:
        pool.check_invariants()


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
