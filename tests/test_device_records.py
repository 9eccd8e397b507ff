"""The pieces under every array surface, on their own: the device error record, call names, the data
plane's slot checks and the open-addressing hash table (ERR-511, ERR-512, DATA-815..DATA-817, STATE-006).

Each is held to exact values: what a report says and how many later refusals it counts, which
name a call gets past the kept names, where a refused data-plane call writes, and how the hash
table's live keys, tombstones and capacity move.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvref_arraypool.data_checks import DeviceSlotChecks
from kvref_arraypool.deferred import CallNames, DeviceErrorRecord, ErrorKind
from kvref_arraypool.ops import ArrayOps, NumpyLikeOps
from kvref_arraypool.table import EMPTY, TOMB, HashTable

from kvref.contract.errors import BlockIdError, InvalidValueError
from tests.refusals import refused

rule = pytest.mark.rule


def arr(ops: ArrayOps, *values: int) -> Any:
    return ops.asarray(np.array(values, dtype=np.int64))


def host(a: Any) -> list[int]:
    return [int(x) for x in a.tolist()]


BAD = {1: ErrorKind("ERR-999", InvalidValueError, "is bad")}


@rule("ERR-511", "ERR-512")
def test_a_record_holds_six_slots_and_the_owners_counters_and_reports_each_round_afresh(ops: ArrayOps) -> None:
    assert len(DeviceErrorRecord(ops, BAD).array) == 6 and len(DeviceErrorRecord(ops, BAD, counters=2).array) == 8
    record, names = DeviceErrorRecord(ops, BAD), CallNames("a call")
    for _ in range(3):  # calls 0, 1, 2: all refused
        names.add("op")
        record.note(arr(ops, 0, 1), arr(ops, 7, 8))
    three = "op (call 0): entry 1 (value 8) is bad; that call changed nothing; 2 later call(s) were refused too"
    refused("three refused calls", lambda: record.report(record.read(), names), InvalidValueError, "ERR-999", three)
    names.add("op")
    record.note(arr(ops, 1), arr(ops, 5))  # call 3: refused, the only one since the report
    message = str(
        refused(
            "one more",
            lambda: record.report(record.read(), names),
            InvalidValueError,
            "ERR-999",
            "op (call 3): entry 0 (value 5) is bad",
        )
    )
    assert message.endswith("that call changed nothing"), f"[ERR-512] the second report counts old refusals: {message}"
    record.report(record.read(), names)  # nothing left to report
    assert host(record.array) == [0, 0, 0, 0, 0, 4], "[ERR-511] a cleared record keeps only the call count"


@rule("ERR-511")
def test_call_names_keep_the_first_limit_names_after_a_read_and_fall_back_past_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(CallNames, "LIMIT", 2)
    names = CallNames("a call")
    for op in ("free", "acquire", "free again"):
        names.add(op)
    assert names.after_read(3, 1) == "acquire" and names.after_read(3, None) == "a call"
    for op in ("free", "acquire", "free again"):
        names.add(op)
    assert names.after_read(6, 5) == "a call", "the third name after a read is past LIMIT = 2: not kept"
    names.add("one")
    assert names.after_read(7, 7) == "a call", "call 7 was never named (one name since call 6)"
    assert names.after_read(7, 2) == "a call", "a call before the last read has no name kept"
    assert names.made == 7, f"{names.made} calls counted; seven were named, two of them past LIMIT"
    assert CallNames("fresh").made == 0


@rule("DATA-815")
def test_the_data_checks_take_only_integer_arrays_of_their_library_flattened_with_their_shape(ops: ArrayOps) -> None:
    checks = DeviceSlotChecks(ops, 8)
    flat, shape = checks.take(ops.asarray(np.array([[1, 2], [3, 4]], dtype=np.int64))) or (None, None)
    assert flat is not None and host(flat) == [1, 2, 3, 4] and shape == (2, 2), (flat, shape)
    assert checks.take([1, 2]) is None and checks.take(np.float64(3.0)) is None
    assert checks.take(SimpleNamespace(shape=(2,))) is None, "an object with a shape but no reshape is not an array"
    floats = ops.asarray(np.array([1, 2], dtype=np.int64)) * 0.5
    assert checks.take(floats) is None, "float slots are the host path's to refuse"


@rule("DATA-802", "DATA-804", "DATA-809", "DATA-816")
def test_a_refused_copy_moves_nothing_from_slot_zero_and_names_the_entry_out_of_range(ops: ArrayOps) -> None:
    checks = DeviceSlotChecks(ops, 8)
    src, dst = checks.copies(arr(ops, 3, 9), arr(ops, 4, 5), op="copy_kv", padding=1)
    assert host(src) == [0, 0] and host(dst) == [0, 0], f"[DATA-816] a refused copy moved {host(src)} -> {host(dst)}"
    refused(
        "a src past the buffers",
        checks.check,
        BlockIdError,
        "DATA-804",
        "copy_kv (call 0): entry 1 (value 9) is a slot outside the buffers; that call changed nothing",
    )
    src, dst = checks.copies(arr(ops, 3, 4), arr(ops, 4, 5), op="copy_kv", padding=1)  # dst 4 is also a src
    assert host(src) == [0, 0] and host(dst) == [0, 0]
    refused(
        "a dst that is a src",
        checks.check,
        InvalidValueError,
        "DATA-809",
        "copy_kv (call 1): entry 2 (value 4) is a dst slot that repeats or is also a src slot",
    )
    src, dst = checks.copies(arr(ops, 3, 4), arr(ops, 5, 6), op="copy_kv", padding=1)
    assert (host(src), host(dst)) == ([3, 4], [5, 6])
    checks.check()  # accepted: nothing to report


@rule("DATA-807", "DATA-816")
def test_a_data_plane_call_past_the_names_kept_is_reported_as_a_data_plane_call(
    ops: ArrayOps, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CallNames, "LIMIT", 1)
    checks = DeviceSlotChecks(ops, 8)
    assert host(checks.writes(arr(ops, 2, 3), op="set_kv", padding=1)) == [2, 3]
    assert host(checks.writes(arr(ops, 2, 2), op="set_kv", padding=1)) == [0, 0], "a refused write goes to slot 0"
    refused(
        "an unnamed call",
        checks.check,
        InvalidValueError,
        "DATA-807",
        "a data-plane call (call 1): entry 1 (value 2) is a usable slot the call writes twice",
    )


def _table(ops: ArrayOps, hint: int, *, growable: bool) -> HashTable:
    return HashTable(ops, hint, growable=growable)


@rule("STATE-006")
def test_a_table_counts_live_keys_and_tombstones_and_rebuilds_when_they_pass_its_load(ops: ArrayOps) -> None:
    table = HashTable(ops, 8, growable=False)
    assert table.capacity == 16 and (table.live, table.tombs) == (0, 0), "8 keys at 60% need 16 slots"
    keys = arr(ops, *range(100, 109))
    table.insert(keys, arr(ops, *range(9)))
    assert (table.live, table.tombs) == (9, 0)
    table.delete(arr(ops, 100, 101))
    assert (table.live, table.tombs) == (7, 2), "a delete leaves tombstones"
    assert host(table.find(keys)) == [-1, -1, 2, 3, 4, 5, 6, 7, 8]
    table.delete(arr(ops, 102))
    assert (table.capacity, table.live, table.tombs) == (16, 6, 3), "deletes never rebuild: live + tombs stays 9"
    table.insert(arr(ops, 200), arr(ops, 99))  # 6 + 3 + 1 = 10 > 9.6: rebuilt in place first
    assert (table.capacity, table.live, table.tombs) == (16, 7, 0), "a rebuild clears the tombstones"
    assert sorted(host(table.keys)) == [EMPTY] * 9 + [*range(103, 109), 200], "no TOMB survives a rebuild"
    assert host(table.find(keys)) == [-1, -1, -1, 3, 4, 5, 6, 7, 8], "the rebuild kept every value"
    table.delete(arr(ops))  # nothing to delete
    assert (table.live, table.tombs) == (7, 0)
    table.clear()
    assert (table.live, table.tombs) == (0, 0) and host(table.find(keys)) == [-1] * 9
    assert TOMB not in host(table.keys)


@rule("STATE-006")
def test_find_near_answers_keys_within_eight_slots_of_home_and_flags_the_rest(ops: ArrayOps) -> None:
    """A lookup on a device reads ``find_near``'s flags with its own: only a flagged key may be wrong."""
    table = _table(ops, 8, growable=False)

    def home(key: int) -> int:  # where a key lands in an empty table
        table.clear()
        table.insert(arr(ops, key), arr(ops, 0))
        return host(table.keys).index(key)

    crowd = [k for k in range(1000, 3000) if home(k) == 3][:10]
    elsewhere = next(k for k in range(5000, 6000) if home(k) not in range(3, 12))
    table.clear()
    table.insert(arr(ops, *crowd[:9]), arr(ops, *range(9)))  # slots 3..11: one of them lies 8 past home
    layout = host(table.keys)
    past = [(layout.index(k) - 3) % 16 >= 8 for k in crowd[:9]]
    values, far = table.find_near(arr(ops, *crowd, elsewhere))
    assert sum(past) == 1 and host(far) == [*past, True, False], (
        f"find_near flagged {host(far)} for 9 keys of one home ({past}: 8 slots past it), an absent one of "
        "that home and one elsewhere; expected the key past the window and the absent one flagged"
    )
    near = [v for v, p in zip(host(values), past, strict=False) if not p]
    assert near == [i for i, p in enumerate(past) if not p] and host(values)[-1] == -1, f"find_near gave {host(values)}"


@rule("STATE-006")
def test_a_growable_table_doubles_until_its_keys_fill_at_most_thirty_percent(ops: ArrayOps) -> None:
    table = _table(ops, 16, growable=True)
    assert table.capacity == 32
    table.insert(arr(ops, *range(20)), arr(ops, *range(20, 40)))  # 20 > 19.2: grown to hold 20 at 30%
    assert (table.capacity, table.live, table.tombs) == (128, 20, 0), (table.capacity, table.live, table.tombs)
    assert host(table.find(arr(ops, 0, 19, 20))) == [20, 39, -1]
    table.delete(arr(ops, *range(0, 20, 2)))
    assert (table.capacity, table.live, table.tombs) == (128, 10, 10), "a delete leaves tombstones"
    keys, values = table.items()
    assert sorted(zip(host(keys), host(values), strict=True)) == [(k, k + 20) for k in range(1, 20, 2)]
    exact = _table(ops, 16, growable=True)
    exact.insert(arr(ops, *range(35)), arr(ops, *range(35)))  # 35 keys at 30% need 116.7 slots: 128, not 256
    assert exact.capacity == 128, f"[STATE-006] 35 keys grew a table to {exact.capacity} slots; 128 hold them at 27%"


@rule("STATE-006")
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_table_under_crowded_inserts_and_deletes_finds_what_a_dict_finds(data: st.DataObject) -> None:
    """Inserts of many keys at once into a small table (contested slots, long probes, reused tombstones)."""
    ops = NumpyLikeOps(np, device="host", is_device=False)
    growable = data.draw(st.booleans(), label="growable")
    table = _table(ops, 4 if growable else 12, growable=growable)  # a fixed table holds its hint, no more
    model: dict[int, int] = {}
    for step in range(data.draw(st.integers(1, 12), label="steps")):
        deleting = len(model) > 0 and data.draw(st.booleans(), label=f"delete at {step}")
        if deleting:
            gone = data.draw(st.lists(st.sampled_from(sorted(model)), unique=True, min_size=1), label="deleted")
            table.delete(arr(ops, *gone))
            for key in gone:
                del model[key]
        else:
            fresh = data.draw(st.lists(st.integers(0, 400).filter(lambda k: k not in model), unique=True, max_size=9))
            fresh = fresh if growable else fresh[: 12 - len(model)]
            table.insert(arr(ops, *fresh), arr(ops, *[k * 10 + step for k in fresh]))
            model.update({k: k * 10 + step for k in fresh})
        probe = sorted(set(model) | {1000, 1001})
        got = dict(zip(probe, host(table.find(arr(ops, *probe))), strict=True))
        want = {k: model.get(k, -1) for k in probe}
        assert got == want, f"after step {step} the table finds {got}, a dict {want}"
        assert table.live == len(model), f"live {table.live} for {len(model)} keys"


@rule("STATE-006")
def test_fill_at_writes_a_value_at_positions_or_under_a_mask_alike_in_every_library(ops: ArrayOps) -> None:
    a = ops.zeros(6)
    ops.fill_at(a, arr(ops, 4, 1, 4), 7)  # a position named twice is written once
    assert host(a) == [0, 7, 0, 0, 7, 0], f"fill_at at positions gave {host(a)}"
    ops.fill_at(a, ops.asarray(np.array([True, False, False, True, False, False])), -1)
    assert host(a) == [-1, 7, 0, -1, 7, 0], f"fill_at under a mask gave {host(a)}: a mask is not the positions 0 and 1"
    ops.put(a, arr(ops, 2, 5), arr(ops, 20, 50))
    assert host(a) == [-1, 7, 20, -1, 7, 50], f"put of an array gave {host(a)}"


@rule("STATE-006")
@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["insert", "delete", "find"]), st.lists(st.integers(0, 60), max_size=24)),
        max_size=30,
    )
)
def test_a_table_counts_what_a_dict_holds_and_the_tombstones_it_keeps(steps: list[tuple[str, list[int]]]) -> None:
    """Inserts, deletes and finds of batches of distinct keys (as the pool guarantees) in a table that
    grows: every find, the live count and the tombstone count agree with a dict and the slots."""
    numpy_ops = NumpyLikeOps(np, device="host", is_device=False)
    table = HashTable(numpy_ops, 8, growable=True)
    model: dict[int, int] = {}
    for i, (what, raw) in enumerate(steps):
        keys = list(dict.fromkeys(raw))
        if what == "insert":
            keys = [k for k in keys if k not in model]
            table.insert(arr(numpy_ops, *keys), arr(numpy_ops, *(k * 7 for k in keys)))
            model.update({k: k * 7 for k in keys})
        elif what == "delete":
            keys = [k for k in keys if k in model]
            table.delete(arr(numpy_ops, *keys))
            for k in keys:
                del model[k]
        want = [model.get(k, -1) for k in range(61)]
        got = host(table.find(arr(numpy_ops, *range(61))))
        assert got == want, f"step {i} ({what} {keys}): the table finds {got}, the dict {want}"
        assert table.live == len(model), f"step {i}: the table counts {table.live} live keys, {len(model)} are present"
        used = host(table.keys)
        assert table.tombs == used.count(TOMB), (
            f"step {i}: the table counts {table.tombs} tombstones, holds {used.count(TOMB)}"
        )
