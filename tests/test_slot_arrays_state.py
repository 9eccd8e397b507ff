"""The token-slot allocator's array surface, value for value: what each call leaves behind and what it reads.

The conformance suite compares the array surface with the oracle through its public calls; here
each view is held to exact values (the free order, the release list, page states, versions,
the open group), the constructor's defaults are pinned, and every call is held to the host reads
ERR-513 allows: none while the host's floor covers an ``alloc``, one after a ``free``. Each test
runs on NumPy (CuPy's host path) and on torch's CPU tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from kvref_arraypool import inputs, slots
from kvref_arraypool.ops import ArrayOps
from kvref_arraypool.slot_arrays import DeviceSlotAllocator
from kvref_arraypool.slots import ArraySlotAllocator

from kvref.contract.errors import BlockIdError, InvalidTypeError, InvalidValueError, KVRefError, NotHeldError
from kvref.oracle.radix import OracleSlotAllocator
from tests.refusals import refused

rule = pytest.mark.rule


def host(a: Any) -> list[int]:
    return [int(x) for x in a.tolist()]


@rule("RADIX-601", "ERR-510")
def test_an_allocator_made_with_no_options_has_pages_of_one_sorted_release_and_int32_ids(ops: ArrayOps) -> None:
    a = DeviceSlotAllocator(8, ops=ops)
    assert (a.page_size, a.sort, a.dtype, a.kernels) == (1, True, "int32", None), repr(a)
    assert repr(a) == f"DeviceSlotAllocator(size=8, page_size=1, sort=True, dtype='int32', device={ops.device!r})"
    got = a.alloc(8)
    assert got is not None and str(got.dtype).endswith("int32"), f"[ERR-510] alloc(8) with no dtype gave {got!r}"
    assert host(got) == list(range(1, 9)), f"[RADIX-601] a fresh allocator of 8 handed out {host(got)}"


@rule("ERR-510")
def test_int32_ids_are_refused_only_past_what_int32_holds(ops: ArrayOps) -> None:
    assert DeviceSlotAllocator(4096, ops=ops).dtype == "int32", "[ERR-510] 4097 slot ids fit int32"
    refused(
        "2**31 usable slots",
        lambda: DeviceSlotAllocator(2**31, ops=ops),
        InvalidValueError,
        "ERR-510",
        "DeviceSlotAllocator: 2147483649 slot ids do not fit int32; ask for dtype='int64'",
    )
    refused(
        "2**31 slots in pages of 4",
        lambda: DeviceSlotAllocator(2**31, ops=ops, page_size=4),
        InvalidValueError,
        "ERR-510",
        "DeviceSlotAllocator: 2147483652 slot ids do not fit int32",
    )


BAD_ARGUMENTS = [
    (
        "size as a str",
        lambda ops: DeviceSlotAllocator("8", ops=ops),  # type: ignore[arg-type]
        "DeviceSlotAllocator: size must be an integer, got str '8'",
    ),
    (
        "page_size as a float",
        lambda ops: DeviceSlotAllocator(8, ops=ops, page_size=1.5),  # type: ignore[arg-type]
        "DeviceSlotAllocator: page_size must be an integer, got float 1.5",
    ),
    (
        "alloc of a str",
        lambda ops: DeviceSlotAllocator(8, ops=ops).alloc("4"),  # type: ignore[arg-type]
        "alloc: need_size must be an integer, got str '4'",
    ),
    (
        "a version as a str",
        lambda ops: DeviceSlotAllocator(8, ops=ops).is_current(1, "v"),  # type: ignore[arg-type]
        "is_current: version must be an integer, got str 'v'",
    ),
    (
        "a slot as a str",
        lambda ops: DeviceSlotAllocator(8, ops=ops).version("x"),  # type: ignore[arg-type]
        "version: slot must be an integer, got str 'x'",
    ),
    (
        "a slot of is_current as a str",
        lambda ops: DeviceSlotAllocator(8, ops=ops).is_current("x", 0),  # type: ignore[arg-type]
        "is_current: slot must be an integer, got str 'x'",
    ),
    (
        "free of a str",
        lambda ops: DeviceSlotAllocator(8, ops=ops).free("abc"),
        "free: indices must be a sequence of integers, got str",
    ),
    (
        "free of a float",
        lambda ops: DeviceSlotAllocator(8, ops=ops).free([1.5]),
        "free: indices[0] must be an integer, got float 1.5",
    ),
]


@rule("ERR-503", "ERR-514", "ERR-521")
@pytest.mark.parametrize(("case", "call", "says"), BAD_ARGUMENTS, ids=[c[0] for c in BAD_ARGUMENTS])
def test_an_argument_of_the_wrong_type_is_refused_at_once_naming_the_call_and_argument(
    ops: ArrayOps, case: str, call: Any, says: str
) -> None:
    message = str(refused(case, lambda: call(ops), InvalidTypeError, "ERR-503", says))
    assert message == f"[ERR-503] {says}", f"[ERR-521] {case}: {message!r} says more than {says!r}"


@rule("RADIX-606", "RADIX-608")
def test_queries_take_every_slot_id_the_padding_pages_included_and_refuse_the_rest_in_the_oracles_words(
    ops: ArrayOps,
) -> None:
    a, oracle = DeviceSlotAllocator(8, ops=ops, page_size=2), OracleSlotAllocator(8, page_size=2)
    assert a.version(0) == 0 and a.version(9) == 0 and not a.is_allocated(0), "[RADIX-606] slots 0 and 9 exist"
    for query in ("version", "is_allocated", "is_current"):
        for slot in (-1, 10, 2**70):
            with pytest.raises(BlockIdError) as raised:
                getattr(a, query)(slot, 0) if query == "is_current" else getattr(a, query)(slot)
            mine = raised.value
            assert str(mine) == f"[RADIX-606] {query}: slot {slot} outside [0, 10)", mine
            with pytest.raises(KVRefError) as theirs:
                getattr(oracle, query)(slot, 0) if query == "is_current" else getattr(oracle, query)(slot)
            assert str(mine) == str(theirs.value), f"{query}({slot}): {mine} where the oracle says {theirs.value}"


@rule("RADIX-601", "RADIX-605", "RADIX-608")
def test_a_fresh_allocator_shows_every_page_free_in_order_and_no_version_yet(ops: ArrayOps) -> None:
    a = DeviceSlotAllocator(6, ops=ops, page_size=2)
    assert a.snapshot() == {
        "free": [1, 2, 3],
        "released": [],
        "state": [0, 0, 0, 0],
        "version": [0] * 8,
        "group": None,
    }, f"a fresh allocator of 3 pages of 2 shows {a.snapshot()}"
    assert a.allocated_pages().tolist() == [False] * 4 and a.pending_pages() == set()


@rule("RADIX-603", "RADIX-608")
def test_each_alloc_bumps_the_version_of_exactly_the_slots_it_hands_out_by_one(ops: ArrayOps) -> None:
    a = DeviceSlotAllocator(8, ops=ops, page_size=2, sort=False)
    got = host(a.alloc(4))
    assert got == [2, 3, 4, 5], f"[RADIX-603] alloc(4) in pages of 2 gave {got}"
    versions = [a.version(s) for s in range(10)]
    assert versions == [0, 0, 1, 1, 1, 1, 0, 0, 0, 0], f"[RADIX-608] versions after one alloc(4): {versions}"
    assert a.is_current(2, 1) and not a.is_current(2, 0) and not a.is_current(6, 0), "[RADIX-608] slot 2 is at 1"
    a.free(got[:2])
    a.check()
    assert not a.is_current(2, 1), "[RADIX-608] a freed slot's last version is stale"
    assert a.is_current(4, 1) and a.is_allocated(5) and not a.is_allocated(3)
    again = host(a.alloc(6))
    assert again == [6, 7, 8, 9, 2, 3], f"[RADIX-610] without sort the freed page goes to the back: {again}"
    assert [a.version(s) for s in (2, 3, 4, 6)] == [2, 2, 1, 1], "[RADIX-608] page 1 handed out twice, page 3 once"


@rule("RADIX-610", "ERR-510")
def test_without_sort_an_alloc_that_wraps_the_free_ring_hands_out_every_page_once(ops: ArrayOps) -> None:
    a = DeviceSlotAllocator(4, ops=ops, sort=False)
    assert host(a.alloc(1)) == [1]
    assert a.snapshot()["free"] == [2, 3, 4], "the ring starts after the page handed out"
    a.free([1])
    a.check()
    assert a.snapshot()["free"] == [2, 3, 4, 1], "[RADIX-610] a freed page joins the back of the free list"
    got = host(a.alloc(4))
    assert got == [2, 3, 4, 1], f"[RADIX-603] alloc(4) across the ring's end gave {got}"
    assert a.alloc(1) is None and a.available_size() == 0


@rule("RADIX-610")
def test_with_sort_freed_pages_wait_on_the_release_list_in_the_order_freed(ops: ArrayOps) -> None:
    a = DeviceSlotAllocator(4, ops=ops)
    assert host(a.alloc(2)) == [1, 2]
    a.free([2])
    a.free([1])
    a.check()
    snap = a.snapshot()
    assert (snap["free"], snap["released"]) == ([3, 4], [2, 1]), f"[RADIX-610] after frees of 2 then 1: {snap}"
    assert snap["state"] == [0, 0, 0, 0, 0] and snap["version"] == [0, 1, 1, 0, 0], snap
    assert host(a.alloc(3)) == [1, 2, 3], "[RADIX-610] a merge sorts the free and released pages, lowest first"


@rule("RADIX-607")
def test_an_open_group_shows_its_pages_as_pending_and_still_allocated(ops: ArrayOps) -> None:
    a = DeviceSlotAllocator(8, ops=ops, page_size=2)
    got = host(a.alloc(6))
    a.free_group_begin()
    a.free(got[:2])
    a.free([got[0], 99])  # refused: page 1 again, and a slot out of range
    a.free(got[4:])
    snap = a.snapshot()
    assert snap["group"] == [[1], [], [3]], f"[RADIX-607] the group keeps pages 1 and 3 (the refused free none): {snap}"
    assert a.pending_pages() == {1, 3} and snap["state"] == [0, 2, 1, 2, 0], snap
    assert a.allocated_pages().tolist() == [False, True, True, True, False], "a pending page is still allocated"
    assert a.pages_held([2, 4, 6, 8]) == [True, True, True, False]
    with pytest.raises(NotHeldError):
        a.check()
    a.free_group_end()
    assert a.pending_pages() == set() and a.snapshot()["group"] is None
    assert a.allocated_pages().tolist() == [False, False, True, False, False] and a.available_size() == 6


@rule("RADIX-606", "RADIX-613")
def test_pages_held_says_false_for_the_padding_page_and_for_slots_outside_the_allocator(ops: ArrayOps) -> None:
    a = DeviceSlotAllocator(8, ops=ops, page_size=2)
    a.alloc(8)
    asked = [-1, 0, 1, 2, 5, 9, 10, 11, 2**40]
    held = a.pages_held(asked)
    assert held == [False, False, False, True, True, True, False, False, False], (
        f"pages_held({asked}) with every page allocated gave {held}: only slots 2..9 are in allocated pages"
    )


@rule("ERR-513")
def test_alloc_within_the_free_pages_reads_nothing_and_a_free_costs_one_read_later(ops: ArrayOps) -> None:
    a = DeviceSlotAllocator(8, ops=ops)
    start = ops.host_reads
    assert a.available_size() == 8 and ops.host_reads == start, "[ERR-513] a fresh allocator's count is known"
    first, second = a.alloc(4), a.alloc(4)
    assert ops.host_reads == start, f"[ERR-513] alloc(4) twice from 8 free read the device {ops.host_reads - start}x"
    assert a.alloc(1) is None and ops.host_reads == start + 1, "[ERR-513] an alloc past the floor reads once"
    a.free(first)
    assert ops.host_reads == start + 1, "[ERR-513] free never waits for the device"
    assert a.available_size() == 4 and a.available_size() == 4, "the free gave 4 slots back"
    assert ops.host_reads == start + 2, "[ERR-513] one read confirms the count; the next answer is known"
    a.free(second)
    a.check()
    assert a.available_size() == 8 and ops.host_reads == start + 3, "[ERR-513] check confirmed the count"
    a.clear()
    assert a.available_size() == 8 and ops.host_reads == start + 3, "[RADIX-609] clear knows every page is free"
    assert host(a.alloc(0)) == [] and ops.host_reads == start + 3


@rule("ERR-510")
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_an_empty_alloc_is_an_empty_array_of_the_allocators_dtype(ops: ArrayOps, dtype: str) -> None:
    got = DeviceSlotAllocator(4, ops=ops, dtype=dtype).alloc(0)
    assert got is not None and len(got) == 0 and str(got.dtype).endswith(dtype), (
        f"[ERR-510] alloc(0) gave {got!r}, asked for {dtype}"
    )


@rule("ERR-511", "ERR-512")
def test_check_runs_its_explanation_only_when_an_error_waits(ops: ArrayOps) -> None:
    a = DeviceSlotAllocator(4, ops=ops)
    calls: list[str] = []
    a.check(lambda: calls.append("clean"))
    assert calls == [], "check ran its explanation with no error recorded"

    class Explained(Exception):
        pass

    def explain() -> None:
        raise Explained("the immediate check's own words")

    a.free([3])
    with pytest.raises(Explained):
        a.check(explain)
    a.check()  # the error was reported (by the explanation) once


@rule("ERR-514")
def test_a_device_array_of_slots_is_freed_on_the_device_with_no_host_copy(ops: ArrayOps, no_host_path: Any) -> None:
    a = DeviceSlotAllocator(8, ops=ops)
    got = a.alloc(4)
    no_host_path(inputs, "index_array")
    a.free(got)  # int32, as alloc made it
    a.free(ops.asarray(np.array([], dtype=np.int64)))
    a.check()
    assert a.available_size() == 8


def _outcome(call: Any) -> tuple[str, str] | list[int] | None:
    try:
        got = call()
    except KVRefError as exc:
        return type(exc).__name__, str(exc)
    return None if got is None else list(got)


def _array(allocator: Any, values: list[int]) -> Any:
    """``values`` as an array of the allocator's library (NumPy for the oracle)."""
    given = np.array(values, dtype=np.int64)
    return allocator.ops.asarray(given) if isinstance(allocator, ArraySlotAllocator) else given


LIST_CALLS = [
    ("a double free", lambda a, s: a.free([s[0]])),
    ("a double free after a good slot", lambda a, s: a.free([s[2], s[0]])),
    ("a slot never handed out", lambda a, s: a.free([s[1], 7])),
    ("a slot never handed out after a good one", lambda a, s: a.free([s[3], 7])),
    ("a device array with a slot never handed out", lambda a, s: a.free(_array(a, [s[2], 7]))),
    ("the padding page", lambda a, s: a.free([1])),
    ("a slot out of range", lambda a, s: a.free([s[1], 99])),
    ("a huge slot", lambda a, s: a.free([2**70])),
    ("a str", lambda a, s: a.free("ab")),
    ("a float", lambda a, s: a.free([2.0])),
    ("a device array with a double free", lambda a, s: a.free(_array(a, [s[1], s[0]]))),
    ("an extend with unpaired lengths", lambda a, s: a.alloc_extend([0], [2, 2], [0])),
    ("an extend past its own end", lambda a, s: a.alloc_extend([4], [2], [0])),
    ("a decode of a str", lambda a, s: a.alloc_decode("ab", [0])),
    ("a decode of no token", lambda a, s: a.alloc_decode([0], [0])),
    ("an extend of two pages", lambda a, s: a.alloc_extend([0], [4], [0])),
    ("a decode into a fresh page", lambda a, s: a.alloc_decode([3], [s[1]])),
    ("a decode with unpaired last slots", lambda a, s: a.alloc_decode([3, 5], [s[3]])),
    ("an extend with unpaired last slots", lambda a, s: a.alloc_extend([0, 0], [2, 2], [s[3]])),
]


@rule("RADIX-602", "RADIX-606", "RADIX-613", "RADIX-615", "ERR-503", "ERR-521")
@pytest.mark.parametrize(("case", "call"), LIST_CALLS, ids=[c[0] for c in LIST_CALLS])
def test_the_list_protocol_answers_and_refuses_as_the_oracles_allocator_word_for_word(
    ops: ArrayOps, case: str, call: Any
) -> None:
    mine = ArraySlotAllocator(8, ops=ops, page_size=2)
    oracle = OracleSlotAllocator(8, page_size=2)
    held = mine.alloc(4)
    assert held == oracle.alloc(4) == [2, 3, 4, 5]
    mine.free([held[0]])
    oracle.free([held[0]])
    got, expected = _outcome(lambda: call(mine, held)), _outcome(lambda: call(oracle, held))
    assert got == expected, f"{case}: the array allocator gave {got}, the oracle {expected}"
    assert mine.available_size() == oracle.available_size(), f"{case}: the two disagree on what is free"


@rule("ERR-514")
def test_the_list_protocol_frees_a_device_array_with_no_host_copy(ops: ArrayOps, no_host_path: Any) -> None:
    a = ArraySlotAllocator(8, ops=ops)
    ids = a.alloc_ids(4)
    no_host_path(slots, "index_array")
    a.free(ids)
    assert a.available_size() == 8


@rule("RADIX-601", "ERR-510")
def test_the_list_protocol_defaults_to_pages_of_one_sorted_and_hands_out_int64_arrays(ops: ArrayOps) -> None:
    a = ArraySlotAllocator(4, ops=ops)
    assert repr(a) == f"ArraySlotAllocator(size=4, page_size=1, sort=True, device={ops.device!r}, available=4)"
    ids = a.alloc_ids(2)
    assert ids is not None and str(ids.dtype).endswith("int64") and host(ids) == [1, 2], ids
    a.free([2])
    a.free([1])
    assert a.alloc(1) == [3] and a.alloc(2) == [1, 2], "[RADIX-610] sorted release by default"
    same = ArraySlotAllocator.over(a.arrays)
    assert same.arrays is a.arrays and same.available_size() == a.available_size() == 1
