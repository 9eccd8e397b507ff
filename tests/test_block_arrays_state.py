"""The block pool's array surface, value for value: defaults, exact state, host reads, and what fused kernels get.

The conformance suite drives :class:`DeviceBlockPool` beside the oracle through its public calls;
here its views are held to exact values, its constructor's defaults are pinned, each call is held
to the host reads ERR-513 allows, and the fused path is held to its protocol: a call of one
request slot goes to :class:`~kvref_arraypool.block_arrays.BlockKernels` with the pool's own arrays,
and anything else takes the array path. The same holds for the token-slot allocator's
:class:`~kvref_arraypool.slot_arrays.SlotKernels`. Each test runs on NumPy (CuPy's host path) and
on torch's CPU tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from kvref_arraypool import inputs
from kvref_arraypool.block_arrays import DeviceBlockPool
from kvref_arraypool.deferred import CallNames
from kvref_arraypool.ops import ArrayOps
from kvref_arraypool.slot_arrays import DeviceSlotAllocator

from kvref.contract.errors import (
    BlockIdError,
    InvalidTypeError,
    InvalidValueError,
    KVRefError,
    NotHeldError,
    OutOfBlocksError,
)
from tests.refusals import refused

rule = pytest.mark.rule


def host(a: Any) -> list[int]:
    return [int(x) for x in a.tolist()]


def at(ops: ArrayOps, *values: int) -> Any:
    """``values`` as an int64 device array of ``ops``."""
    return ops.asarray(np.array(values, dtype=np.int64))


@rule("ERR-510", "ERR-517")
def test_a_pool_made_with_no_options_has_256_request_slots_and_int32_ids(ops: ArrayOps) -> None:
    pool = DeviceBlockPool(8, ops=ops)
    assert (pool.max_requests, pool.dtype, pool.kernels, pool.num_usable) == (256, "int32", None, 7), repr(pool)
    assert repr(pool) == f"DeviceBlockPool(num_blocks=8, max_requests=256, dtype='int32', device={ops.device!r})"
    ids, offsets = pool.allocate([2], [255])
    assert str(ids.dtype).endswith("int32") and host(ids) == [1, 2] and offsets == [0, 2], (ids, offsets)
    assert pool.holders(1) == [255], "[ERR-517] request slot 255 is the last of 256"
    assert DeviceBlockPool(64, ops=ops).dtype == "int32", "[ERR-510] 64 block ids fit int32"


@rule("ERR-517")
def test_one_request_slot_is_enough(ops: ArrayOps) -> None:
    pool = DeviceBlockPool(4, ops=ops, max_requests=1)
    ids, _ = pool.allocate([3], [0])
    pool.free(ids, 0)
    pool.check()
    assert pool.available_blocks() == 3 and pool.holders(1) == []


BAD_ARGUMENTS = [
    (
        "num_blocks as a str",
        lambda ops: DeviceBlockPool("8", ops=ops),  # type: ignore[arg-type]
        "DeviceBlockPool: num_blocks must be an integer, got str '8'",
    ),
    (
        "max_requests as a str",
        lambda ops: DeviceBlockPool(8, ops=ops, max_requests="x"),  # type: ignore[arg-type]
        "DeviceBlockPool: max_requests must be an integer, got str 'x'",
    ),
    (
        "a count as a str",
        lambda ops: DeviceBlockPool(8, ops=ops).allocate(["x"], [0]),  # type: ignore[list-item]
        "allocate: counts must be an integer, got str 'x'",
    ),
    (
        "slots as a str",
        lambda ops: DeviceBlockPool(8, ops=ops).allocate([1], "ab"),  # type: ignore[arg-type]
        "allocate: slots must be a sequence of ints, got str",
    ),
    (
        "a slot as a str",
        lambda ops: DeviceBlockPool(8, ops=ops).allocate([1], ["a"]),  # type: ignore[list-item]
        "allocate: slots must be an integer, got str 'a'",
    ),
    (
        "block ids as a str",
        lambda ops: DeviceBlockPool(8, ops=ops).free("ab", 0),
        "free: block_ids must be a sequence of integers, got str",
    ),
    (
        "slots of a free as a str",
        lambda ops: DeviceBlockPool(8, ops=ops).acquire([1], "ab"),
        "acquire: slots must be a sequence of integers, got str",
    ),
    (
        "a slot of a free as a float",
        lambda ops: DeviceBlockPool(8, ops=ops).free([1], [1.5]),
        "free: slots[0] must be an integer, got float 1.5",
    ),
    (
        "a query of a str",
        lambda ops: DeviceBlockPool(8, ops=ops).generation("x"),  # type: ignore[arg-type]
        "query: block_id must be an integer, got str 'x'",
    ),
]


@rule("ERR-503", "ERR-514", "ERR-521")
@pytest.mark.parametrize(("case", "call", "says"), BAD_ARGUMENTS, ids=[c[0] for c in BAD_ARGUMENTS])
def test_an_argument_of_the_wrong_type_is_refused_at_once_naming_the_call_and_argument(
    ops: ArrayOps, case: str, call: Any, says: str
) -> None:
    message = str(refused(case, lambda: call(ops), InvalidTypeError, "ERR-503", says))
    assert message == f"[ERR-503] {says}", f"[ERR-521] {case}: {message!r} says more than {says!r}"


@rule("POOL-103", "STATE-002")
def test_queries_take_every_block_id_the_reserved_included_and_refuse_the_rest(ops: ArrayOps) -> None:
    pool = DeviceBlockPool(8, ops=ops)
    assert (pool.ref_count(0), pool.generation(7), pool.holders(7)) == (0, 0, [])
    for block in (-1, 8):
        with pytest.raises(BlockIdError) as raised:
            pool.ref_count(block)
        assert str(raised.value) == f"[POOL-103] query: block id {block} outside [0, 8)", raised.value


@rule("POOL-101", "POOL-111", "STATE-002")
def test_a_fresh_pool_and_a_step_show_exact_stack_references_generations_and_holding_bits(ops: ArrayOps) -> None:
    pool = DeviceBlockPool(4, ops=ops, max_requests=40)  # two 32-slot words per block
    assert pool.snapshot() == {"free": [3, 2, 1], "ref": [0] * 4, "gen": [0] * 4, "bits": [0] * 8}, pool.snapshot()
    ids, offsets = pool.allocate([1, 2], [33, 0])
    assert host(ids) == [1, 2, 3] and offsets == [0, 1, 3], f"[POOL-101] top of the stack first: {host(ids)}"
    assert pool.snapshot() == {"free": [], "ref": [0, 1, 1, 1], "gen": [0, 1, 1, 1], "bits": [0, 0, 0, 2, 1, 0, 1, 0]}
    pool.acquire(at(ops, 2, 3), at(ops, 39, 33))
    pool.free(at(ops, 1), 33)
    pool.check()
    assert pool.holders(2) == [0, 39] and pool.holders(3) == [0, 33] and pool.ref_count(3) == 2
    assert pool.snapshot()["bits"] == [0, 0, 0, 0, 1, 1 << 7, 1, 2], pool.snapshot()
    again, _ = pool.allocate([1], [5])
    assert host(again) == [1] and pool.generation(1) == 2, "[POOL-111] a block handed out twice is at generation 2"


@rule("POOL-109")
def test_two_slots_of_one_block_index_in_one_call_are_two_pairs_not_a_pair_named_twice(ops: ArrayOps) -> None:
    pool = DeviceBlockPool(8, ops=ops, max_requests=4)
    ids, _ = pool.allocate([1, 4], [1, 0])  # block 1 for slot 1; 2..5 for slot 0
    assert host(ids) == [1, 2, 3, 4, 5]
    pool.free(at(ops, 1, 5), at(ops, 1, 0))  # (1, slot 1) and (5, slot 0): distinct pairs
    pool.check()
    assert pool.available_blocks() == 4 and pool.snapshot()["free"][-2:] == [1, 5], pool.snapshot()


@rule("ERR-517", "ERR-511")
def test_a_request_slot_out_of_range_in_a_slot_array_is_reported_with_its_value(ops: ArrayOps) -> None:
    pool = DeviceBlockPool(8, ops=ops, max_requests=4)
    ids, _ = pool.allocate([2], [0])
    pool.free(ids, at(ops, 0, -1))
    refused(
        "a negative request slot",
        pool.check,
        InvalidValueError,
        "ERR-517",
        "free (call 0): entry 1 (value -1) is a request slot outside [0, max_requests)",
    )
    assert pool.ref_count(1) == pool.ref_count(2) == 1


@rule("ERR-510", "ERR-519")
def test_an_empty_step_is_an_empty_array_of_the_pools_dtype(ops: ArrayOps) -> None:
    for dtype in ("int32", "int64"):
        pool = DeviceBlockPool(8, ops=ops, dtype=dtype)
        for counts, slots, offsets in (([0], [3], [0, 0]), ([], [], [0])):
            got, where = pool.allocate(counts, slots)
            assert len(got) == 0 and str(got.dtype).endswith(dtype) and where == offsets, (dtype, got, where)


@rule("ERR-513", "POOL-105")
def test_allocate_within_the_free_blocks_reads_nothing_and_a_free_costs_one_read_later(ops: ArrayOps) -> None:
    pool = DeviceBlockPool(8, ops=ops)
    start = ops.host_reads
    assert pool.available_blocks() == 7 and ops.host_reads == start, "[ERR-513] a fresh pool's count is known"
    ids, _ = pool.allocate([3, 4], [0, 1])
    assert ops.host_reads == start, "[ERR-513] allocating every free block read the device"
    refused(
        "one more",
        lambda: pool.allocate([1], [2]),
        OutOfBlocksError,
        "POOL-105",
        "allocate: asked for 1 blocks, 0 free of 7 usable; nothing was taken",
    )
    assert ops.host_reads == start + 1, "[ERR-513] an allocate past the floor reads once"
    pool.free(ids[:3], 0)
    assert ops.host_reads == start + 1, "[ERR-513] free never waits for the device"
    assert pool.available_blocks() == 3 and pool.available_blocks() == 3
    assert ops.host_reads == start + 2, "[ERR-513] one read confirms the count; the next answer is known"


@rule("ERR-514")
def test_device_arrays_of_ids_and_slots_are_taken_with_no_host_copy(ops: ArrayOps, no_host_path: Any) -> None:
    pool = DeviceBlockPool(8, ops=ops, max_requests=4)
    ids, _ = pool.allocate([2], [1])
    no_host_path(inputs, "index_array")
    pool.acquire(ids, at(ops, 2, 3))
    pool.free(ids, 1)
    pool.check()
    assert pool.holders(1) == [2] and pool.holders(2) == [3]


@rule("ERR-511")
def test_a_call_past_the_names_kept_is_reported_as_free_or_acquire(
    ops: ArrayOps, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CallNames, "LIMIT", 1)
    pool = DeviceBlockPool(8, ops=ops)
    ids, _ = pool.allocate([1], [0])
    pool.acquire(ids, 1)  # call 0, named
    pool.free(at(ops, 99), 0)  # call 1, past the limit
    refused(
        "an unnamed call",
        pool.check,
        BlockIdError,
        "POOL-103",
        "free or acquire (call 1): entry 0 (value 99) is outside the pool's block ids",
    )


class BlockKernelsSpy:
    """A stand-in for fused block kernels: records what each launch is given (and does nothing)."""

    name = "spy"
    max_call = 2

    def __init__(self, ops: ArrayOps) -> None:
        self.ops = ops
        self.launches: list[tuple[str, dict[str, Any]]] = []

    def allocate(self, **given: Any) -> Any:
        self.launches.append(("allocate", given))
        return self.ops.arange(given["total"])

    def call(self, **given: Any) -> None:
        self.launches.append(("call", given))


@rule("ERR-513", "ERR-519", "ERR-520")
def test_a_call_of_one_request_slot_goes_to_the_fused_kernel_with_the_pools_own_arrays(ops: ArrayOps) -> None:
    spy = BlockKernelsSpy(ops)
    pool = DeviceBlockPool(8, ops=ops, max_requests=40, kernels=spy)
    arrays = {"stack": pool._stack, "ref": pool._ref, "gen": pool._gen, "bits": pool._bits, "record": pool.record.array}
    pool.allocate([2, 1], [33, 33])
    ((kind, given),) = spy.launches
    assert kind == "allocate" and {k: given[k] is v for k, v in arrays.items()} == dict.fromkeys(arrays, True), given
    expected_values = {"total": 3, "words": 2, "slot": 33, "dtype": "int32"}
    assert {k: given[k] for k in expected_values} == expected_values, given
    start = ops.host_reads
    assert pool.available_blocks() == 4 and ops.host_reads == start, "[ERR-513] the floor went down by 3, no read"

    ids = ops.cast(at(ops, 5, 6), "int32")
    pool.free(ids, 33)
    kind, given = spy.launches[-1]
    expected = {
        "ref": pool._ref,
        "bits": pool._bits,
        "reserved": pool._reserved,
        "first": pool._last,
        "stack": pool._stack,
        "record": pool.record.array,
        "ids": ids,
    }
    assert kind == "call" and all(given[k] is v for k, v in expected.items()), f"the free's launch got {given}"
    expected_ints = {"num_blocks": 8, "words": 2, "slot": 33, "free": True}
    assert {k: given[k] for k in expected_ints} == expected_ints, given
    assert pool.available_blocks() == 7 and ops.host_reads == start + 1, (
        "[ERR-513] after a free the count is read back from the device (the spy left its counter at 7)"
    )
    pool.acquire([5], 7)
    kind, given = spy.launches[-1]
    assert given["free"] is False and given["slot"] == 7 and host(given["ids"]) == [5], given
    assert ops.host_reads == start + 1, "an acquire changes no free count: nothing to confirm"

    launches = len(spy.launches)
    pool.allocate([1, 1], [1, 2])  # two request slots
    pool.free(at(ops, 1, 2, 3), 33)  # more entries than one launch takes
    pool.free(at(ops), 33)  # nothing
    assert len(spy.launches) == launches, f"calls the kernels do not take were launched: {spy.launches[launches:]}"
    with pytest.raises(NotHeldError):
        pool.check()  # the array path ran the free: slot 33 holds none of 1, 2, 3 (the spy allocated nothing)
    pool.allocate([1], [5])
    assert spy.launches[-1][1]["slot"] == 5, "one request slot's step goes to the kernel with that slot"


@rule("ERR-511", "ERR-514", "ERR-517")
def test_a_fused_call_is_checked_on_the_host_and_named_in_the_report_as_the_array_path_is(ops: ArrayOps) -> None:
    pool = DeviceBlockPool(8, ops=ops, max_requests=4, kernels=BlockKernelsSpy(ops))
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: pool.acquire([5], 9), "[ERR-517] acquire: request slot 9 outside [0, 4)"),
        (lambda: pool.free("ab", 1), "[ERR-503] free: block_ids must be a sequence of integers, got str"),
    ]
    for call, says in cases:
        with pytest.raises(KVRefError) as raised:
            call()
        assert str(raised.value) == says, f"[ERR-514] the fused path refused with {raised.value}"
    pool.acquire([5], 2)  # call 0, launched; the spy records nothing, so write what a kernel would
    pool.record.array[:6] = ops.asarray(np.array([1, 0, 0, 99, 1, 1], dtype=np.int64))  # RANGE, call 0, entry 0
    with pytest.raises(BlockIdError) as raised:
        pool.check()
    assert str(raised.value).startswith("[POOL-103] acquire (call 0): entry 0 (value 99)"), raised.value


class SlotKernelsSpy:
    """A stand-in for fused token-slot kernels: records what each launch is given."""

    name = "spy"
    max_free = 2

    def __init__(self, ops: ArrayOps) -> None:
        self.ops = ops
        self.launches: list[tuple[str, dict[str, Any]]] = []

    def alloc(self, **given: Any) -> Any:
        self.launches.append(("alloc", given))
        return self.ops.arange(given["want"] * given["page_size"])

    def free(self, **given: Any) -> tuple[Any, Any]:
        self.launches.append(("free", given))
        page = self.ops.asarray(np.array([1], dtype=np.int64))
        return page, page == 1

    def free_then_alloc(self, **given: Any) -> Any:
        self.launches.append(("free_then_alloc", given))
        return self.ops.arange(given["want"] * given["page_size"])


@rule("ERR-513", "RADIX-603", "RADIX-607")
def test_alloc_and_free_go_to_the_fused_kernels_with_the_allocators_own_arrays(ops: ArrayOps) -> None:
    spy = SlotKernelsSpy(ops)
    a = DeviceSlotAllocator(8, ops=ops, page_size=2, kernels=spy)
    a.alloc(2)
    a.alloc(4)
    (_, first), (_, second) = spy.launches
    mine = {"ring": a._ring, "state": a._state, "version": a._version, "record": a.record.array}
    assert all(first[k] is v for k, v in mine.items()), f"alloc's launch got {first}"
    assert {k: first[k] for k in ("head", "want", "num_pages", "page_size", "dtype")} == {
        "head": 0,
        "want": 1,
        "num_pages": 4,
        "page_size": 2,
        "dtype": "int32",
    }, first
    assert (second["head"], second["want"]) == (1, 2), f"the second alloc starts past the first: {second}"
    start = ops.host_reads
    assert a.available_size() == 2 and ops.host_reads == start, "[ERR-513] the floor went down by 3 pages, no read"

    slots = ops.cast(at(ops, 2, 3), "int32")
    a.free(slots)
    kind, given = spy.launches[-1]
    mine = {
        "slots": slots,
        "state": a._state,
        "first": a._first,
        "ring": a._ring,
        "released": a._released,
        "record": a.record.array,
    }
    assert kind == "free" and all(given[k] is v for k, v in mine.items()), f"free's launch got {given}"
    assert {k: given[k] for k in ("head", "num_pages", "page_size", "sort", "group")} == {
        "head": 3,
        "num_pages": 4,
        "page_size": 2,
        "sort": True,
        "group": False,
    }, given
    assert a.available_size() == 8 and ops.host_reads == start + 1, (
        "[ERR-513] after a free the count is read back from the device (the spy left its counter at 4 pages)"
    )

    a.free_group_begin()
    a.free([4])
    assert spy.launches[-1][1]["group"] is True and a.snapshot()["group"] == [[1]], "[RADIX-607] the group keeps it"
    a.free_group_end()
    launches = len(spy.launches)
    a.free(ops.cast(at(ops, 2, 4, 6), "int32"))  # more entries than one launch takes: the array path, in int64
    assert len(spy.launches) == launches, "a free longer than max_free was launched"
    with pytest.raises(NotHeldError):
        a.check()  # the spy allocated nothing, so the array path refuses
