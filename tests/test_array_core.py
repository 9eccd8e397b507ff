"""The array core's own views, held to exact values: what its prefix index says of a hash (the view
error explainers read), the arrays a CUDA graph may capture, and its tensors for the data plane.

The conformance suite compares what the pools return; these views are not returns of the protocol,
so here they are compared with the oracle's, or with the numbers the spec gives, directly. The CuPy
backend runs its NumPy host path where there is no CUDA device: the same array code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from kvref_arraypool.tensors import LibraryTensors

from kvref.contract.checks import HashEntry
from kvref.contract.errors import BlockIdError, ConfigError, KVRefError, OutOfBlocksError
from tests.refusals import refused
from tests.test_error_messages import pool_on

rule = pytest.mark.rule

BACKENDS = ["cupy", "torch"]


def entries(pool: Any) -> list[HashEntry | None]:
    return [pool.hash_entry(h) for h in range(10)]


@rule("PFX-304", "EVICT-404")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy", ["lru", "lru-leaf", "fifo"])
def test_the_array_index_knows_each_hash_as_the_oracle_does(backend: str, policy: str) -> None:
    """Hash 0 (the index's first entry) heads the chain 0 -> 5 -> 6; the blocks are released root
    first, so an evicting allocation under lru and fifo takes hash 0's block while its children
    stay: hash 0 is then known, not resident, with children."""
    pools = {"oracle": pool_on("oracle", 6, policy=policy), backend: pool_on(backend, 6, policy=policy)}
    held: dict[tuple[int, str], list[int]] = {}  # (pool, holder) -> its blocks

    def chain(p: Any) -> None:
        held[id(p), "a"] = p.allocate(3, holder="a")
        p.register(held[id(p), "a"], [0, 5, 6])

    def evict_one(p: Any) -> None:
        held[id(p), "b"] = p.allocate(3, holder="b")  # two free blocks and one cached

    steps = [
        ("register 0 -> 5 -> 6", chain),
        ("free root first", lambda p: p.free(held[id(p), "a"], holder="a")),
        ("evict one", evict_one),
        ("free the evicting blocks", lambda p: p.free(held[id(p), "b"], holder="b")),
        ("register 7 under 5", lambda p: p.register(p.allocate(1, holder="c"), [7], parent_hash=5)),
    ]
    for step, call in steps:
        for pool in pools.values():
            call(pool)
        got, want = entries(pools[backend]), entries(pools["oracle"])
        assert got == want, f"after {step} under {policy}: {backend} knows hashes 0..9 as {got}; the oracle as {want}"
    if policy != "lru-leaf":
        assert pools[backend].hash_entry(0) == HashEntry(resident=False, parent=None, has_children=True)
    assert pools[backend].hash_entry(7) == HashEntry(resident=True, parent=5, has_children=False)


@rule("CONF-908")
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_graph_arrays_are_named_as_spec_09s_table_names_them(backend: str) -> None:
    pool = pool_on(backend, 8)
    arrays = pool.graph_arrays()
    names = ["ref", "gen", "bhash", "stack", "index.keys", "index.values", "ehash", "ehead", "eparent"]
    assert list(arrays) == names, f"graph_arrays names {list(arrays)}; spec 09's table names {names}"
    held = pool.allocate(2, holder="a")
    ref = pool.ops.to_host(arrays["ref"])
    assert [int(ref[b]) for b in held] == [1, 1], f"'ref' is the reference counts: {ref.tolist()}"
    gen = pool.ops.to_host(arrays["gen"])
    assert [int(gen[b]) for b in held] == [pool.generation(b) for b in held], f"'gen' is the generations: {gen}"
    stack = pool.ops.to_host(arrays["stack"])
    assert len(stack) >= pool.num_free and held[0] not in stack[: pool.num_free].tolist(), "'stack' holds free ids"


class _CupyLike:
    """An array of a device library, read back with ``get()``."""

    def get(self) -> np.ndarray:
        return np.array([4, 5])


@rule("DATA-805", "DATA-806", "DATA-815")
def test_library_tensors_name_their_library_copy_what_they_read_and_check_on_their_device() -> None:
    t = LibraryTensors(np, name="numpy", device="host")
    assert (t.name, t.device) == ("numpy", "host"), f"{t.name!r} on {t.device!r}"
    a = t.zeros((2,), "int32")
    back = t.to_host(a)
    a[0] = 9
    assert back.tolist() == [0, 0], "to_host returned the array itself, not a copy"
    assert t.to_host(_CupyLike()).tolist() == [4, 5], "a device array is read back with get()"
    assert t.values([1.6, 2.2], "float16").dtype == np.float16 and t.nbytes(a) == 8
    assert t.index(np.array([3], dtype=np.int32)).dtype == np.int64, "indices as int64"
    checks = t.device_checks(4)
    assert (checks.ops.device, checks.ops.is_device, checks.slots) == ("host", False, 4), "NumPy is no device"
    refused(
        "bfloat16",
        lambda: t.zeros((1,), "bfloat16"),
        ConfigError,
        "DATA-805",
        "numpy cannot hold dtype 'bfloat16'; it holds ['float32', 'float16',",
    )


@rule("POOL-103", "POOL-112")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_blocks", [1, 4])
def test_an_id_outside_the_pool_is_refused_as_such_before_its_generation_is_read(backend: str, num_blocks: int) -> None:
    """No block reserved, so block 0 is a block like the others: an id outside the pool given with a
    generation must be refused for its range (POOL-103), never compared with block 0's generation."""
    pool = pool_on(backend, num_blocks, reserved_ids=())
    for op, call in [
        ("free", lambda: pool.free([5], holder="x", generations=[0])),
        ("free", lambda: pool.free([-1], holder="x", generations=[1])),
        ("acquire", lambda: pool.acquire([7], holder="x", generations=[2])),
    ]:
        refused(f"{op} outside {num_blocks} blocks", call, BlockIdError, "POOL-103", f"{op}: block id ")


@rule("PFX-320")
@pytest.mark.parametrize("backend", BACKENDS)
def test_match_many_of_no_chain_of_empty_chains_and_of_one_hash(backend: str) -> None:
    pool = pool_on(backend, 8)
    cached = pool.allocate(1, holder="c")
    pool.register(cached, [7])
    pool.free(cached, holder="c")
    assert pool.match_many([], holders=[]) == [], "no chain, no hit"
    assert pool.match_many([[], []], holders=["x", "y"]) == [[], []], "empty chains hit nothing"
    assert pool.match_many([[7]], holders=["x"]) == [cached], "one cached hash is a hit of one block"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hash_beyond_int64_has_no_entry_as_on_the_oracle_and_the_pool_goes_on(backend: str) -> None:
    oracle, pool = pool_on("oracle", 4), pool_on(backend, 4)
    for value in (1 << 63, -(1 << 63) - 1, 1 << 70):
        assert pool.hash_entry(value) is None is oracle.hash_entry(value), f"hash_entry({value})"
    assert pool.allocate(1, holder="h") == oracle.allocate(1, holder="h"), "the pool still answers"


@rule("PFX-308", "PFX-309")
@pytest.mark.parametrize("backend", BACKENDS)
def test_when_the_oldest_copy_leaves_the_next_oldest_is_the_one_found(backend: str) -> None:
    """Three copies of hash 7, registered in the order of their ids; the oldest is evicted: a lookup
    finds the second, as the oracle's does."""
    for name in ("oracle", backend):
        pool = pool_on(name, 5)
        copies = pool.allocate(3, holder="a")
        for b in copies:
            pool.register([b], [7])
        pool.free(copies[:1], holder="a")
        pool.allocate(2, holder="b")  # one free block and the one cached copy
        got = pool.lookup([7])
        assert got == [copies[1]], f"{name} finds {got} after the oldest copy left; the next oldest is {copies[1]}"


@rule("EVICT-404")
@pytest.mark.parametrize("backend", BACKENDS)
def test_under_lru_leaf_a_root_released_first_still_leaves_after_its_child(backend: str) -> None:
    """Chain 1 -> 2 released root first; the pool is asked how much it could reclaim (one pass of
    the leaf order), then an allocation evicts one block: the leaf, hash 2, as the oracle evicts."""
    resident = {}
    for name in ("oracle", backend):
        pool = pool_on(name, 4, policy="lru-leaf")
        chain = pool.allocate(2, holder="a")
        pool.register(chain, [1, 2])
        pool.free(chain, holder="a")  # root first
        assert pool.num_available == 3, f"{name}: one free block and two reclaimable"
        pool.allocate(2, holder="b")
        resident[name] = [h for h in (1, 2) if (entry := pool.hash_entry(h)) is not None and entry.resident]
    assert resident[backend] == resident["oracle"] == [1], f"resident after one eviction: {resident}"


@rule("POOL-101", "CONF-908")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pool_on_the_host_claims_no_cuda_graph_and_an_unknown_holder_holds_nothing(backend: str) -> None:
    pool = pool_on(backend, 4)
    if pool.ops.is_device:
        pytest.skip("on a CUDA device the pool does offer cuda-graph")
    assert "cuda-graph" not in pool.capabilities(), f"{pool.capabilities()}: no graph without a CUDA device"
    assert pool.holder_references("nobody") == 0, "a holder never seen holds no reference"


@rule("ERR-517")
def test_device_ints_take_only_1d_integer_arrays_of_the_library_and_never_uint64() -> None:
    from kvref_arraypool.ops import NumpyLikeOps

    ops: Any = NumpyLikeOps(np, device="host", is_device=False)
    narrow = np.array([3, 1], dtype=np.int32)
    assert ops.device_ints(narrow).dtype == np.int64, "int32 ids become int64"
    assert ops.device_ints(narrow, any_width=True) is narrow, "a kernel reads the ids as they are"
    assert ops.device_ints(np.array([1], dtype=np.uint32)).tolist() == [1], "uint32 fits int64"
    assert ops.device_ints(np.array([1], dtype=np.uint64)) is None, "uint64 goes to the host path, which names it"
    for other in ([1, 2], np.array([1.0]), np.array([[1]]), np.array([True])):
        assert ops.device_ints(other) is None, f"{other!r} is not a 1-d integer array: the host path"
    assert ops.cumsum(np.array([True, True])).tolist() == [1, 2] and ops.count(np.array([True, False])) == 1
    a = np.array([1, 2], dtype=np.int64)
    copy = ops.cast(a, "int64")
    a[0] = 9
    assert copy.tolist() == [1, 2], "cast returns a copy the caller owns"


@rule("POOL-105", "ERR-521")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy", ["lru", "lru-leaf", "fifo", "ref-zero"])
@pytest.mark.parametrize("cached", [0, 2])
def test_an_allocation_beyond_what_is_available_is_refused_in_the_oracles_words(
    backend: str, policy: str, cached: int
) -> None:
    said = {}
    for name in ("oracle", backend):
        pool = pool_on(name, 6, policy=policy)
        if cached:
            blocks = pool.allocate(cached, holder="c")
            pool.register(blocks, list(range(1, cached + 1)))
            pool.free(blocks, holder="c")
        with pytest.raises(OutOfBlocksError) as raised:
            pool.allocate(6, holder="x")
        said[name] = str(raised.value)
    assert said[backend] == said["oracle"], f"[ERR-521] {backend} says {said[backend]!r}; the oracle {said['oracle']!r}"


def _held_world(p: Any) -> dict[str, list[int]]:
    """Blocks of "a" (two), of "b" (two), the first of "b"'s also held by "c"."""
    x, y = p.allocate(2, holder="a"), p.allocate(2, holder="b")
    p.acquire(y[:1], holder="c")
    return {"a": x, "b": y}


def _view(p: Any) -> tuple[int, int, list[dict[Any, int]]]:
    return p.num_free, p.num_in_use, [p.holders(b) for b in range(1, p.num_blocks)]


BATCHES: list[tuple[str, Callable[[Any, dict[str, list[int]]], object]]] = [
    ("free_many of an id beyond int64", lambda p, w: p.free_many([[2**70]], holders=["a"])),
    ("free_many by a stranger of a block held alone", lambda p, w: p.free_many([[w["b"][1]]], holders=["zed"])),
    ("free_many by a stranger of a shared block", lambda p, w: p.free_many([[w["b"][0]]], holders=["zed"])),
    ("free_many of numpy arrays", lambda p, w: p.free_many([np.array(w["a"][:1])], holders=["a"])),
    (
        "free_many of one holder's block twice across entries",
        lambda p, w: p.free_many([w["a"][:1], w["a"][:1]], holders=["a", "a"]),
    ),
    ("allocate_many of numpy counts", lambda p, w: p.allocate_many(np.array([1, 0]), holders=["q", "r"])),
    ("allocate_many beyond what is available", lambda p, w: p.allocate_many([3, 9], holders=["q", "r"])),
    ("allocate_many of a count beyond int64", lambda p, w: p.allocate_many([1, 2**70], holders=["q", "r"])),
]


@rule("POOL-103", "POOL-108", "POOL-109", "POOL-116", "POOL-117", "ERR-501", "ERR-521")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("case", "call"), BATCHES, ids=[b[0] for b in BATCHES])
def test_a_batched_call_returns_or_refuses_as_the_oracle_does_word_for_word(
    case: str, call: Callable[[Any, dict[str, list[int]]], object], backend: str
) -> None:
    outcome = {}
    for name in ("oracle", backend):
        pool = pool_on(name, 8)
        world = _held_world(pool)
        before = _view(pool)
        try:
            outcome[name] = ("returned", call(pool, world), _view(pool))
        except KVRefError as e:
            outcome[name] = ("refused", str(e), _view(pool))
            assert _view(pool) == before, f"[ERR-501] {case} on {name}: the refused call changed the pool"
    assert outcome[backend] == outcome["oracle"], f"{case}: {backend} {outcome[backend]}; oracle {outcome['oracle']}"


@rule("ERR-504", "ERR-501")
@pytest.mark.parametrize("backend", ["oracle", "cupy", "torch"])
def test_evict_refuses_a_negative_count_naming_itself(backend: str) -> None:
    pool = pool_on(backend, 4)
    with pytest.raises(KVRefError) as caught:
        pool.evict(-1)
    assert str(caught.value).startswith("[ERR-504] evict: "), f"evict(-1) said {caught.value}"


@rule("PFX-313", "POOL-124")
@pytest.mark.parametrize("backend", ["cupy", "torch"])
@pytest.mark.parametrize("how", ["reset", "clear"])
def test_a_pool_that_dropped_its_cache_holds_its_hash_arrays_as_a_new_pool_does(backend: str, how: str) -> None:
    pool = pool_on(backend, 6)
    ids = pool.allocate(3)
    pool.register(ids, [11, 12, 13])
    pool.free(ids)
    getattr(pool, how)()
    fresh = pool_on(backend, 6).snapshot()
    dropped = pool.snapshot()
    fields = ["hash", "entries", "evictable", "registered"] + (["free"] if how == "clear" else [])  # POOL-124
    for field in fields:
        assert dropped[field] == fresh[field], (
            f"after {how}() {field} is {dropped[field]}; a new pool has {fresh[field]}"
        )


@rule("STATE-002", "PFX-320", "POOL-117")
@pytest.mark.parametrize("backend", ["cupy", "torch"])
def test_many_holders_of_one_block_in_one_batch_are_counted_as_the_oracle_counts_them(backend: str) -> None:
    """Batched calls that give one block several new holders at once (inline pairs, then the table),
    beside holders it already has, and take them away again: every block's holders agree with the
    oracle's after every call, and the invariants hold."""
    pools = [pool_on("oracle", 16), pool_on(backend, 16)]
    script: list[tuple[str, Any]] = [
        ("allocate", (4, "w")),
        ("register", ([11, 12, 13, 14],)),
        ("free", ("w",)),
        ("match_many", ([[11, 12, 13, 14]] * 5, ["a", "b", "c", "d", "e"])),  # five new holders at once
        ("match_many", ([[11, 12], [11, 12, 13], [11]], ["a", "f", "a"])),  # old and new, one of them twice
        ("free_many", ("b", "d")),
        ("match_many", ([[11, 12, 13, 14]] * 3, ["g", "b", "h"])),
        ("free_many", ("a", "c", "e", "f")),
        ("free_many", ("g", "b", "h")),
    ]
    held: list[dict[str, list[int]]] = [{}, {}]
    for op, args in script:
        for pool, mine in zip(pools, held, strict=True):
            if op == "allocate":
                mine["w"] = pool.allocate(args[0], holder=args[1])
            elif op == "register":
                pool.register(mine["w"], args[0])
            elif op == "free":
                pool.free(mine.pop(args[0]), holder=args[0])
            elif op == "match_many":
                for got, holder in zip(pool.match_many(args[0], holders=args[1]), args[1], strict=True):
                    mine.setdefault(holder, []).extend(got)
            else:
                pool.free_many([mine.pop(h) for h in args], holders=list(args))
        assert [pools[0].holders(b) for b in range(16)] == [pools[1].holders(b) for b in range(16)], f"after {op}{args}"
        pools[1].check_invariants()
