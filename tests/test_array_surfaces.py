"""The array surfaces' refusals word for word: the block pool's (ERR-517..ERR-520) and the token-slot
allocator's (chapter 06 on arrays), immediate and recorded on the device (ERR-510..ERR-512).

A call checked on the device changes nothing when refused and leaves its error in the record;
``check()`` raises it once, naming the call's operation, its index, the entry and its value, and
how many later calls were refused too. The conformance suite checks the rule of each; here each
message is read whole. The CuPy backend runs its NumPy host path where there is no CUDA device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvref.contract.errors import (
    BlockIdError,
    BlockStateError,
    FreeGroupError,
    InvalidTypeError,
    InvalidValueError,
    KVRefError,
    NotHeldError,
    OutOfBlocksError,
    ReservedBlockError,
)
from kvref_conformance.target import Target
from tests.refusals import refused

rule = pytest.mark.rule

CUPY = Target.from_backend("cupy")


def blocks() -> tuple[Any, list[int]]:
    """A block pool of 8 (4 request slots) after ``allocate([2, 1], [0, 1])``: blocks 1, 2 of slot 0, 3 of slot 1."""
    pool = CUPY.create_block_arrays(8, max_requests=4)
    ids, offsets = pool.allocate([2, 1], [0, 1])
    assert offsets == [0, 2, 3] and ids.tolist() == [1, 2, 3] and ids.dtype == np.int32, (ids, offsets)
    return pool, ids.tolist()


def at(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


IMMEDIATE: list[tuple[str, Callable[[], object], type[KVRefError], str, str]] = [
    (
        "no request slot",
        lambda: CUPY.create_block_arrays(8, max_requests=0),
        InvalidValueError,
        "ERR-517",
        "DeviceBlockPool: max_requests must be at least 1, got 0",
    ),
    (
        "ids of int16",
        lambda: CUPY.create_block_arrays(8, dtype="int16"),
        InvalidValueError,
        "ERR-510",
        "DeviceBlockPool: dtype must be one of ('int32', 'int64'), got 'int16'",
    ),
    (
        "more ids than int32 holds",
        lambda: CUPY.create_block_arrays(2**31 + 2),
        InvalidValueError,
        "ERR-510",
        "DeviceBlockPool: block ids up to 2147483649 do not fit int32; ask for dtype='int64'",
    ),
    (
        "counts and slots unpaired",
        lambda: blocks()[0].allocate([1], [0, 1]),
        InvalidValueError,
        "ERR-506",
        "allocate: 1 counts for 2 request slots",
    ),
    (
        "more blocks than are free",
        lambda: blocks()[0].allocate([3, 2], [0, 2]),
        OutOfBlocksError,
        "POOL-105",
        "allocate: asked for 5 blocks, 4 free of 7 usable; nothing was taken",
    ),
    (
        "a request slot past the last",
        lambda: blocks()[0].allocate([1], [4]),
        InvalidValueError,
        "ERR-517",
        "allocate: request slot 4 outside [0, 4)",
    ),
    (
        "counts as a str",
        lambda: blocks()[0].allocate("ab", [0]),
        InvalidTypeError,
        "ERR-503",
        "allocate: counts must be a sequence of ints, got str",
    ),
    (
        "ids and slots unpaired",
        lambda: blocks()[0].free(at(1, 2), at(0)),
        InvalidValueError,
        "ERR-506",
        "free: 2 block ids for 1 request slots",
    ),
    (
        "one request slot past the last",
        lambda: blocks()[0].acquire(at(1), 9),
        InvalidValueError,
        "ERR-517",
        "acquire: request slot 9 outside [0, 4)",
    ),
    (
        "a query past the last block",
        lambda: blocks()[0].ref_count(99),
        BlockIdError,
        "POOL-103",
        "query: block id 99 outside [0, 8)",
    ),
    (
        "a page of no slot",
        lambda: CUPY.create_slot_arrays(8, page_size=0),
        InvalidValueError,
        "RADIX-601",
        "DeviceSlotAllocator: size 8 must be a positive multiple of page_size 0 (at least 1)",
    ),
    (
        "part of a page",
        lambda: CUPY.create_slot_arrays(10, page_size=4),
        InvalidValueError,
        "RADIX-601",
        "DeviceSlotAllocator: size 10 must be a positive multiple of page_size 4 (at least 1)",
    ),
    (
        "sort not a bool",
        lambda: CUPY.create_slot_arrays(8, sort=1),  # type: ignore[arg-type]
        InvalidValueError,
        "RADIX-601",
        "DeviceSlotAllocator: sort must be a bool, got 1",
    ),
    (
        "slots of int8",
        lambda: CUPY.create_slot_arrays(8, dtype="int8"),
        InvalidValueError,
        "ERR-510",
        "DeviceSlotAllocator: dtype must be one of ('int32', 'int64'), got 'int8'",
    ),
    (
        "an odd number of slots",
        lambda: CUPY.create_slot_arrays(8, page_size=2).alloc(3),
        InvalidValueError,
        "RADIX-604",
        "alloc: 3 slots is not a whole number of pages of 2; a short allocation would lose some",
    ),
    (
        "a batch with an odd count",
        lambda: CUPY.create_slot_arrays(8, page_size=2).alloc_many(at(2, 3)),
        InvalidValueError,
        "RADIX-604",
        "alloc_many: count 1 (3 slots) is not a whole number of pages of 2",
    ),
    (
        "an end without a group",
        lambda: CUPY.create_slot_arrays(8).free_group_end(),
        FreeGroupError,
        "RADIX-607",
        "free_group_end: no free group is open",
    ),
    (
        "a version past the last slot",
        lambda: CUPY.create_slot_arrays(8, page_size=2).version(99),
        BlockIdError,
        "RADIX-606",
        "version: slot 99 outside [0, 10)",
    ),
]


@rule(
    "ERR-503",
    "ERR-506",
    "ERR-510",
    "ERR-517",
    "POOL-103",
    "POOL-105",
    "RADIX-601",
    "RADIX-604",
    "RADIX-606",
    "RADIX-607",
    "ERR-521",
)
@pytest.mark.parametrize(("case", "call", "error", "rule_id", "says"), IMMEDIATE, ids=[c[0] for c in IMMEDIATE])
def test_a_call_refused_at_once_names_its_rule_and_what_is_wrong(
    case: str, call: Callable[[], object], error: type[KVRefError], rule_id: str, says: str
) -> None:
    message = str(refused(case, call, error, rule_id, says))
    assert message == f"[{rule_id}] {says}", f"[ERR-521] {case}: {message!r} says more than {says!r}"


RECORDED_BLOCKS: list[tuple[str, Callable[[Any, list[int]], object], type[KVRefError], str, str]] = [
    (
        "a block past the last",
        lambda p, b: p.free(at(b[0], 99), 0),
        BlockIdError,
        "POOL-103",
        "free (call 0): entry 1 (value 99) is outside the pool's block ids",
    ),
    (
        "the reserved block",
        lambda p, b: p.free(at(0), 0),
        ReservedBlockError,
        "POOL-118",
        "free (call 0): entry 0 (value 0) is a reserved block, never handed out",
    ),
    (
        "a block of another slot",
        lambda p, b: p.free(at(b[2]), 0),
        NotHeldError,
        "POOL-108",
        "free (call 0): entry 0 (value 3) is a block its request slot holds no reference to "
        "(a double or foreign free?)",
    ),
    (
        "a request slot past the last",
        lambda p, b: p.free(at(b[0]), at(7)),
        InvalidValueError,
        "ERR-517",
        "free (call 0): entry 0 (value 7) is a request slot outside [0, max_requests)",
    ),
    (
        "a block twice for one slot",
        lambda p, b: p.free(at(b[0], b[0]), 0),
        NotHeldError,
        "POOL-109",
        "free (call 0): entry 1 (value 1) names a (block, request slot) pair the call named before",
    ),
    (
        "a pair twice among slots",
        lambda p, b: p.free(at(b[2], b[2]), at(1, 1)),
        NotHeldError,
        "POOL-109",
        "free (call 0): entry 1 (value 3) names a (block, request slot) pair the call named before",
    ),
    (
        "a free block",
        lambda p, b: p.acquire(at(5), 2),
        BlockStateError,
        "POOL-119",
        "acquire (call 0): entry 0 (value 5) is a free block, whose content is undefined",
    ),
    (
        "a block the slot holds",
        lambda p, b: p.acquire(at(b[0]), 0),
        InvalidValueError,
        "ERR-518",
        "acquire (call 0): entry 0 (value 1) is a block its request slot holds already (one reference per slot "
        "and block)",
    ),
]


@rule("ERR-501", "ERR-511", "ERR-512", "ERR-517", "ERR-518", "POOL-103", "POOL-108", "POOL-109", "POOL-118", "POOL-119")
@pytest.mark.parametrize(
    ("case", "call", "error", "rule_id", "says"), RECORDED_BLOCKS, ids=[c[0] for c in RECORDED_BLOCKS]
)
def test_a_block_call_refused_on_the_device_changes_nothing_and_is_reported_once(
    case: str, call: Callable[[Any, list[int]], object], error: type[KVRefError], rule_id: str, says: str
) -> None:
    pool, ids = blocks()
    before = pool.snapshot()
    call(pool, ids)  # no host read: the verdict waits in the record
    assert pool.snapshot() == before, f"[ERR-501] {case}: the refused call changed the pool"
    message = str(refused(case, pool.check, error, rule_id, says))
    assert message == f"[{rule_id}] {says}; that call changed nothing", f"{case}: {message!r}"
    pool.check()  # reported once
    assert pool.available_blocks() == 4, "the refused call took or gave back no block"


@rule("ERR-511", "ERR-512")
def test_the_first_refused_call_is_reported_with_how_many_were_refused_after_it() -> None:
    pool, ids = blocks()
    pool.free(at(ids[0]), 0)  # call 0: accepted
    pool.free(at(99), 0)  # call 1: the first refused
    pool.acquire(at(0), 1)  # call 2: refused too
    refused(
        "two refused calls",
        pool.check,
        BlockIdError,
        "POOL-103",
        "free (call 1): entry 0 (value 99) is outside the pool's block ids; that call changed nothing; "
        "1 later call(s) were refused too",
    )
    pool.check()
    assert pool.holders(ids[1]) == [0] and pool.ref_count(ids[1]) == 1 and pool.generation(ids[1]) == 1
    assert pool.snapshot()["free"] == [7, 6, 5, 4, 1], "block 1 went back on top of the free stack"
    assert repr(pool) == "DeviceBlockPool(num_blocks=8, max_requests=4, dtype='int32', device='host')"


def slots() -> tuple[Any, list[int]]:
    """A token-slot allocator of 8 slots in pages of 2 after ``alloc(4)``: slots 2..5."""
    allocator = CUPY.create_slot_arrays(8, page_size=2)
    got = allocator.alloc(4)
    assert got.tolist() == [2, 3, 4, 5] and got.dtype == np.int32, got
    return allocator, got.tolist()


RECORDED_SLOTS: list[tuple[str, Callable[[Any, list[int]], object], type[KVRefError], str, str]] = [
    (
        "a slot past the last",
        lambda a, s: a.free(at(99)),
        BlockIdError,
        "RADIX-606",
        "entry 0 (value 99) is out of range",
    ),
    (
        "the padding page",
        lambda a, s: a.free(at(1)),
        ReservedBlockError,
        "RADIX-602",
        "entry 0 (value 1) is in page 0, the padding page, never handed out",
    ),
    (
        "a page never allocated",
        lambda a, s: a.free(at(s[1], 8)),
        NotHeldError,
        "RADIX-606",
        "entry 1 (value 8) is in a page that is not allocated or was freed earlier in the open group (a double free?)",
    ),
]


@rule("ERR-501", "ERR-511", "ERR-512", "RADIX-602", "RADIX-606")
@pytest.mark.parametrize(
    ("case", "call", "error", "rule_id", "says"), RECORDED_SLOTS, ids=[c[0] for c in RECORDED_SLOTS]
)
def test_a_slot_free_refused_on_the_device_changes_nothing_and_is_reported_once(
    case: str, call: Callable[[Any, list[int]], object], error: type[KVRefError], rule_id: str, says: str
) -> None:
    allocator, held = slots()
    before = allocator.snapshot()
    call(allocator, held)
    assert allocator.snapshot() == before, f"[ERR-501] {case}: the refused free changed the allocator"
    message = str(refused(case, allocator.check, error, rule_id, f"free (call 0): {says}"))
    assert message == f"[{rule_id}] free (call 0): {says}; that call changed nothing", f"{case}: {message!r}"
    allocator.check()
    assert allocator.available_size() == 4, "the refused free gave back no slot"


@rule("RADIX-605", "RADIX-606", "RADIX-607")
def test_a_slot_freed_twice_in_one_group_is_a_double_free_and_groups_do_not_nest() -> None:
    allocator, held = slots()
    allocator.free_group_begin()
    refused(
        "a group in a group",
        allocator.free_group_begin,
        FreeGroupError,
        "RADIX-607",
        "free_group_begin: a free group is already open; groups do not nest",
    )
    allocator.free(at(held[0]))  # part of page 1: the whole page, once the group ends
    allocator.free(at(held[0]))
    refused(
        "the same page twice in a group",
        allocator.check,
        NotHeldError,
        "RADIX-606",
        "free (call 1): entry 0 (value 2) is in a page that is not allocated or was freed earlier in the open "
        "group (a double free?); that call changed nothing",
    )
    allocator.free_group_end()
    assert allocator.available_size() == 6, "page 1 came back once"
    assert repr(allocator) == "DeviceSlotAllocator(size=8, page_size=2, sort=True, dtype='int32', device='host')"
