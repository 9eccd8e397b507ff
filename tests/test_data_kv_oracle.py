"""Chapter 08's KV buffers on their own: shapes and defaults, writes and reads by token slot, padding,
prefix copy, and every refusal with its rule, its call and its argument (DATA-801..DATA-809, ERR-521),
on the host path and on the path that checks slots on the device (DATA-815..DATA-817).

The device path runs here over NumPy (the array core's checks on a NumPy "device"), so the CPU runs
the same code a GPU does. The conformance suite compares buffers with buffers of the same oracle;
these tests hold them to the numbers and words the chapter gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from kvref_arraypool.tensors import LibraryTensors

from kvref.contract.errors import BlockIdError, ConfigError, InvalidTypeError, InvalidValueError, KVRefError
from kvref.oracle.data.kv import KVBuffers
from kvref.oracle.data.tensors import NumpyTensors, host_indices
from tests.refusals import refused

rule = pytest.mark.rule


def numpy_device(device: str = "host") -> LibraryTensors:
    """NumPy behind the array core's device checks: the CPU runs what a CUDA device runs."""
    return LibraryTensors(np, name="numpy", device=device)


def buffers(**change: Any) -> KVBuffers:
    """Four slots after the padding, two layers, K of 2 heads x 3, V of 1 head x 5, float32."""
    sizes: dict[str, Any] = {"v_head_num": 1, "v_head_dim": 5, "dtype": "float32"}
    return KVBuffers(4, 2, 2, 3, **{**sizes, **change})


def on_device() -> KVBuffers:
    return buffers(tensors=numpy_device(), checks="device")


def kv_for(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Distinct K ``[n, 2, 3]`` and V ``[n, 1, 5]`` for ``n`` tokens: every value names its token."""
    k = seed * 1000 + np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3)
    v = -seed * 1000 - np.arange(n * 5, dtype=np.float32).reshape(n, 1, 5)
    return k, v


def contents(kv: KVBuffers) -> list[list[Any]]:
    """Every K and V buffer, host-side, for ERR-501."""
    return [np.array(b).tolist() for b in (*kv.k_buffer, *kv.v_buffer)]


# ---------------------------------------------------------------------------------------- shapes


CONSTRUCTION: list[tuple[str, Callable[[], object], str, str]] = [
    *[
        (
            f"{name} {value!r}",
            lambda n=name, v=value: KVBuffers(**{"size": 4, "layer_num": 1, "k_head_num": 2, "k_head_dim": 3, n: v}),
            "DATA-801",
            f"KVBuffers: {name} must be an integer >= 1, got {value!r}",
        )
        for name in ("size", "layer_num", "k_head_num", "k_head_dim", "v_head_num", "v_head_dim")
        for value in (0, 2.0)
    ],
    (
        "block_size 0",
        lambda: KVBuffers(4, 1, 1, 1, layout="paged", block_size=0),
        "DATA-801",
        "KVBuffers: block_size must be an integer >= 1, got 0",
    ),
    (
        "an unknown layout",
        lambda: KVBuffers(4, 1, 1, 1, layout="blocks"),
        "DATA-801",
        "KVBuffers: layout must be token or paged and row heads or flat, got 'blocks', 'heads'",
    ),
    (
        "an unknown row",
        lambda: KVBuffers(4, 1, 1, 1, row="rows"),
        "DATA-801",
        "KVBuffers: layout must be token or paged and row heads or flat, got 'token', 'rows'",
    ),
    (
        "pages that do not divide the size",
        lambda: KVBuffers(5, 1, 1, 1, layout="paged", block_size=2),
        "DATA-801",
        "KVBuffers: a paged layout needs size 5 a multiple of block_size 2, and heads rows",
    ),
    (
        "pages of flat rows",
        lambda: KVBuffers(4, 1, 1, 1, layout="paged", block_size=2, row="flat"),
        "DATA-801",
        "KVBuffers: a paged layout needs size 4 a multiple of block_size 2, and heads rows",
    ),
    (
        "a block size for token slots",
        lambda: KVBuffers(4, 1, 1, 1, block_size=2),
        "DATA-801",
        "KVBuffers: block_size belongs to the paged layout",
    ),
    (
        "a dtype NumPy lacks",
        lambda: KVBuffers(4, 1, 1, 1, dtype="bfloat16"),
        "DATA-805",
        "numpy cannot hold dtype 'bfloat16'; it holds [",
    ),
    (
        "checks neither host nor device",
        lambda: KVBuffers(4, 1, 1, 1, checks="gpu"),
        "DATA-815",
        "KVBuffers: checks must be 'host' or 'device', got 'gpu'",
    ),
    (
        "device checks NumPy lacks",
        lambda: KVBuffers(4, 1, 1, 1, checks="device"),
        "DATA-815",
        "KVBuffers: numpy checks slots on the host only",
    ),
]


@rule("DATA-801", "DATA-805", "DATA-815", "ERR-521")
@pytest.mark.parametrize(("case", "make", "rule_id", "says"), CONSTRUCTION, ids=[c[0] for c in CONSTRUCTION])
def test_a_refused_construction_names_its_rule_and_what_is_wrong(
    case: str, make: Callable[[], object], rule_id: str, says: str
) -> None:
    refused(case, make, ConfigError, rule_id, says)


@rule("DATA-801", "DATA-805", "DATA-808")
def test_by_default_buffers_are_float16_token_slots_on_numpy_with_v_shaped_like_k() -> None:
    kv = KVBuffers(4, 2, 2, 3)
    assert isinstance(kv.tensors, NumpyTensors) and kv.device_checks is None, f"{kv!r}: NumPy, checked on the host"
    assert (kv.dtype, kv.layout, kv.row, kv.block_size, kv.padding) == ("float16", "token", "heads", 1, 1), repr(kv)
    assert [b.shape for b in kv.k_buffer] == [(5, 2, 3)] * 2, "slot 0 (padding) and slots 1..4, per layer"
    assert [b.shape for b in kv.v_buffer] == [(5, 2, 3)] * 2, "V takes K's heads and dims unless given"
    assert all(b.dtype == np.float16 and not b.any() for b in (*kv.k_buffer, *kv.v_buffer)), "zeroed float16"
    assert kv.mem_bytes() == 4 * 5 * 6 * 2, f"mem_bytes {kv.mem_bytes()}: the sum of the four buffers"


@rule("DATA-801", "DATA-808")
def test_each_layout_has_its_shape_and_padding() -> None:
    mla = buffers()
    assert mla.k_buffer[1].shape == (5, 2, 3) and mla.v_buffer[1].shape == (5, 1, 5), "K and V shaped apart"
    assert mla.mem_bytes() == 2 * (5 * 6 + 5 * 5) * 4, f"mem_bytes {mla.mem_bytes()}"
    flat = buffers(row="flat")
    assert flat.k_buffer[0].shape == (5, 6) and flat.v_buffer[0].shape == (5, 5), "flat rows of heads x dim"
    paged = buffers(layout="paged", block_size=2)
    assert paged.k_buffer[0].shape == (3, 2, 2, 3) and paged.v_buffer[0].shape == (3, 2, 1, 5), "[block, slot, h, d]"
    assert (paged.padding, paged.slots) == (2, 6), "the padding is a whole block: slots 0 and 1"
    text = repr(paged)
    assert text == "KVBuffers(4 slots, 2 layers, K (2, 3), V (1, 5), float32, paged, on numpy host)", text


@rule("DATA-815")
def test_a_cuda_device_checks_slots_on_the_device_unless_told_to_check_on_the_host() -> None:
    assert buffers(tensors=numpy_device("cuda:0")).device_checks is not None, "the default on a CUDA device"
    assert buffers(tensors=numpy_device("cuda:0"), checks="host").device_checks is None, "host checks asked for"
    assert buffers(tensors=numpy_device("cpu")).device_checks is None, "the default elsewhere: the host"
    assert on_device().device_checks is not None, "device checks asked for, on a library that has them"


# ---------------------------------------------------------------------------------------- host path


@rule("DATA-803", "DATA-806")
@pytest.mark.parametrize(
    "slots",
    [[1, 4, 3], [1, 2, 3], [1, 3], [3, 1], [2], [[1, 2], [4, 3]]],
    ids=["three out of order", "a run", "every other", "backwards", "one", "a 2 x 2 batch"],
)
@pytest.mark.parametrize("row", ["heads", "flat"])
def test_what_is_written_at_slots_is_read_back_there_and_nowhere_else(slots: list[Any], row: str) -> None:
    kv = buffers(row=row)
    batch = np.asarray(slots).shape
    k, v = kv_for(int(np.prod(batch)))
    kv.set_kv(1, slots, k.reshape(*batch, 6), v.reshape(*batch, 1, 5))  # trailing dims multiply to heads x dim
    got_k, got_v = kv.get_kv(1, slots)
    assert got_k.shape == (*batch, 2, 3) and got_v.shape == (*batch, 1, 5), f"get_kv({slots}): {got_k.shape}"
    assert got_k.reshape(-1, 6).tolist() == k.reshape(-1, 6).tolist(), f"K at {slots} is not what set_kv wrote"
    assert got_v.reshape(-1, 5).tolist() == v.reshape(-1, 5).tolist(), f"V at {slots} is not what set_kv wrote"
    untouched = sorted(set(range(1, 5)) - set(np.ravel(slots).tolist()))
    if untouched:
        others = kv.get_kv(1, untouched)
        assert not others[0].any() and not others[1].any(), f"set_kv({slots}) wrote into slots {untouched}"
    assert not any(b.any() for b in (kv.k_buffer[0], kv.v_buffer[0])), "set_kv on layer 1 wrote into layer 0"


@rule("DATA-802", "DATA-806")
def test_a_padded_token_writes_nowhere_a_read_can_see_and_the_rest_land() -> None:
    kv = buffers()
    k, v = kv_for(3)
    kv.set_kv(0, [0, 2, 0], k, v)
    got_k, got_v = kv.get_kv(0, [2])
    assert got_k[0].tolist() == k[1].tolist() and got_v[0].tolist() == v[1].tolist(), "slot 2 holds token 1's KV"
    assert not kv.get_kv(0, [1, 3, 4])[0].any(), "a padded token's K landed in a usable slot"
    kv.set_kv(0, [0, 0], *kv_for(2, seed=2))  # padded tokens only: nothing to write, and no repeat to refuse
    kv.set_kv(0, [], np.zeros((0, 2, 3)), np.zeros((0, 1, 5)))  # no token at all
    assert kv.get_kv(0, [2])[0].tolist() == got_k.tolist(), "calls that write nothing changed slot 2"
    assert kv.get_kv(0, np.zeros((0,), dtype=np.int64))[0].shape == (0, 2, 3), "an empty read has the row shape"


@rule("DATA-802", "DATA-806")
def test_paged_buffers_keep_a_whole_padding_block_and_store_slots_in_block_order() -> None:
    kv = buffers(layout="paged", block_size=2)
    k, v = kv_for(3)
    kv.set_kv(0, [5, 2, 1], k, v)  # slot 1 is padding here
    assert kv.k_buffer[0][2, 1].tolist() == k[0].tolist(), "slot 5 is block 2's second slot"
    assert kv.k_buffer[0][1, 0].tolist() == k[1].tolist() and kv.get_kv(0, [2])[1][0].tolist() == v[1].tolist()
    assert not kv.k_buffer[0][1, 1].any() and not kv.get_kv(0, [3, 4])[0].any(), "only slots 5 and 2 were written"


@rule("DATA-806")
def test_a_read_is_a_copy_the_caller_owns() -> None:
    kv = buffers()
    kv.set_kv(0, [1, 2], *kv_for(2))
    got_k, got_v = kv.get_kv(0, [1, 2])
    got_k[:] = 7
    got_v[:] = 7
    again = kv.get_kv(0, [1, 2])
    assert again[0].tolist() == kv_for(2)[0].tolist() and again[1].tolist() == kv_for(2)[1].tolist(), (
        "changing what get_kv returned changed the buffers"
    )


@rule("DATA-809")
@pytest.mark.parametrize(
    ("src", "dst"), [([1, 2], [3, 4]), ([4, 1], [2, 3]), ([[1], [2]], [[4], [3]])], ids=["a run", "apart", "2-d"]
)
def test_copy_kv_copies_every_layers_k_and_v_from_each_src_to_its_dst(src: list[Any], dst: list[Any]) -> None:
    kv = buffers()
    for layer in (0, 1):
        kv.set_kv(layer, [1, 2, 3, 4], *kv_for(4, seed=layer + 1))
    kv.copy_kv(src, dst)
    for layer in (0, 1):
        want_k, want_v = kv.get_kv(layer, src)
        got_k, got_v = kv.get_kv(layer, dst)
        assert got_k.tolist() == want_k.tolist() and got_v.tolist() == want_v.tolist(), (
            f"copy_kv({src}, {dst}): layer {layer}'s dst slots do not hold their src slots' K and V"
        )
    kv.copy_kv([], [])  # nothing to copy


def host_buffers() -> KVBuffers:
    kv = buffers()
    kv.set_kv(0, [1, 2], *kv_for(2))
    return kv


HOST_REFUSALS: list[tuple[str, Callable[[KVBuffers], object], type[KVRefError], str, str]] = [
    (
        "set_kv on layer 2",
        lambda kv: kv.set_kv(2, [1], *kv_for(1)),
        BlockIdError,
        "DATA-804",
        "set_kv: layer 2 outside [0, 2)",
    ),
    (
        "set_kv on layer -1",
        lambda kv: kv.set_kv(-1, [1], *kv_for(1)),
        BlockIdError,
        "DATA-804",
        "set_kv: layer -1 outside [0, 2)",
    ),
    (
        "set_kv on layer True",
        lambda kv: kv.set_kv(True, [1], *kv_for(1)),
        BlockIdError,
        "DATA-804",
        "set_kv: layer True outside [0, 2)",
    ),
    ("get_kv on layer 2", lambda kv: kv.get_kv(2, [1]), BlockIdError, "DATA-804", "get_kv: layer 2 outside [0, 2)"),
    (
        "set_kv past the end",
        lambda kv: kv.set_kv(0, [[0, 5]], *(a.reshape(1, 2, -1) for a in kv_for(2))),
        BlockIdError,
        "DATA-804",
        "set_kv: slot 5 outside [0, 5)",
    ),
    (
        "set_kv at -1",
        lambda kv: kv.set_kv(0, [1, -1], *kv_for(2)),
        BlockIdError,
        "DATA-804",
        "set_kv: slot -1 outside [0, 5)",
    ),
    (
        "set_kv at a float",
        lambda kv: kv.set_kv(0, [1.5], *kv_for(1)),
        InvalidTypeError,
        "ERR-503",
        "set_kv: indices must be integers, got float64",
    ),
    (
        "set_kv with k of other heads",
        lambda kv: kv.set_kv(0, [1], np.zeros((1, 2, 2)), kv_for(1)[1]),
        InvalidValueError,
        "DATA-803",
        "set_kv: k of shape (1, 2, 2) for indices of shape (1,): its leading dimensions "
        "must be the indices' and its trailing ones multiply to 2 x 3",
    ),
    (
        "set_kv with k for other tokens",
        lambda kv: kv.set_kv(0, [1, 2], *kv_for(1)),
        InvalidValueError,
        "DATA-803",
        "set_kv: k of shape (1, 2, 3) for indices of shape (2,)",
    ),
    (
        "set_kv with v of other dims",
        lambda kv: kv.set_kv(0, [1], kv_for(1)[0], np.zeros((1, 1, 4))),
        InvalidValueError,
        "DATA-803",
        "set_kv: v of shape (1, 1, 4) for indices of shape (1,): its leading dimensions "
        "must be the indices' and its trailing ones multiply to 1 x 5",
    ),
    (
        "set_kv at slot 1 twice",
        lambda kv: kv.set_kv(0, [1, 0, 1], *kv_for(3)),
        InvalidValueError,
        "DATA-807",
        "set_kv: a usable slot appears twice in one call",
    ),
    ("get_kv at -1", lambda kv: kv.get_kv(0, [-1]), BlockIdError, "DATA-804", "get_kv: slot -1 outside [0, 5)"),
    (
        "get_kv of a float",
        lambda kv: kv.get_kv(0, [2.0]),
        InvalidTypeError,
        "ERR-503",
        "get_kv: indices must be integers, got float64",
    ),
    (
        "get_kv of the padding",
        lambda kv: kv.get_kv(0, [[2], [0]]),
        InvalidValueError,
        "DATA-802",
        "get_kv: source slot 0 is padding and holds no data",
    ),
    (
        "copy_kv unpaired",
        lambda kv: kv.copy_kv([1], [3, 4]),
        InvalidValueError,
        "DATA-809",
        "copy_kv: 1 src slots and 2 dst slots",
    ),
    (
        "copy_kv from the padding",
        lambda kv: kv.copy_kv([1, 0], [3, 4]),
        InvalidValueError,
        "DATA-802",
        "copy_kv: src slot 0 is padding and holds no data",
    ),
    (
        "copy_kv into the padding",
        lambda kv: kv.copy_kv([1, 2], [3, 0]),
        InvalidValueError,
        "DATA-802",
        "copy_kv: dst slot 0 is padding and holds no data",
    ),
    (
        "copy_kv into one slot twice",
        lambda kv: kv.copy_kv([1, 2], [3, 3]),
        InvalidValueError,
        "DATA-809",
        "copy_kv: dst slots repeat or are also src slots",
    ),
    (
        "copy_kv into its own source",
        lambda kv: kv.copy_kv([1, 2], [2, 3]),
        InvalidValueError,
        "DATA-809",
        "copy_kv: dst slots repeat or are also src slots",
    ),
    (
        "copy_kv from past the end",
        lambda kv: kv.copy_kv([9], [3]),
        BlockIdError,
        "DATA-804",
        "copy_kv: slot 9 outside [0, 5)",
    ),
    (
        "copy_kv into past the end",
        lambda kv: kv.copy_kv([1], [9]),
        BlockIdError,
        "DATA-804",
        "copy_kv: slot 9 outside [0, 5)",
    ),
    (
        "copy_kv from floats",
        lambda kv: kv.copy_kv([1.0], [3]),
        InvalidTypeError,
        "ERR-503",
        "copy_kv: src must be integers, got float64",
    ),
    (
        "copy_kv into floats",
        lambda kv: kv.copy_kv([1], [3.0]),
        InvalidTypeError,
        "ERR-503",
        "copy_kv: dst must be integers, got float64",
    ),
]


@rule("DATA-802", "DATA-803", "DATA-804", "DATA-807", "DATA-809", "ERR-501", "ERR-503", "ERR-521")
@pytest.mark.parametrize(("case", "call", "error", "rule_id", "says"), HOST_REFUSALS, ids=[c[0] for c in HOST_REFUSALS])
def test_a_refused_call_names_its_rule_call_and_argument_and_writes_nothing(
    case: str, call: Callable[[KVBuffers], object], error: type[KVRefError], rule_id: str, says: str
) -> None:
    kv = host_buffers()
    before = contents(kv)
    refused(case, lambda: call(kv), error, rule_id, says)
    assert contents(kv) == before, f"[ERR-501] {case}: the refused call changed the buffers"


@rule("DATA-802")
def test_in_paged_buffers_every_slot_of_the_first_block_is_padding() -> None:
    kv = buffers(layout="paged", block_size=2)
    refused(
        "get_kv of slots 2 and 1",
        lambda: kv.get_kv(0, [2, 1]),
        InvalidValueError,
        "DATA-802",
        "get_kv: source slot 1 is padding and holds no data",
    )
    refused(
        "set_kv at slot 2 twice",
        lambda: kv.set_kv(0, [2, 1, 2], *kv_for(3)),
        InvalidValueError,
        "DATA-807",
        "set_kv: a usable slot appears twice",
    )


# ---------------------------------------------------------------------------------------- device path


@rule("DATA-815", "DATA-806", "DATA-809")
def test_slots_given_as_device_arrays_are_written_read_and_copied_there() -> None:
    kv = on_device()
    slots = np.array([[4, 0], [1, 3]])
    k, v = kv_for(4)
    kv.set_kv(1, slots, k.reshape(2, 2, 2, 3), v.reshape(2, 2, 1, 5))
    got_k, got_v = kv.get_kv(1, np.array([[4, 1], [3, 3]]))
    assert got_k.shape == (2, 2, 2, 3) and got_v.shape == (2, 2, 1, 5), f"device get_kv shapes {got_k.shape}"
    assert got_k.reshape(4, 6).tolist() == [k[0].ravel().tolist(), *(k[i].ravel().tolist() for i in (2, 3, 3))]
    assert got_v.reshape(4, 5).tolist() == [v[0].ravel().tolist(), *(v[i].ravel().tolist() for i in (2, 3, 3))]
    kv.copy_kv(np.array([4]), np.array([2]))
    kv.check()  # nothing refused
    assert kv.get_kv(1, [2])[0].tolist() == [k[0].tolist()], "copy_kv on the device: slot 2 holds slot 4's K"
    kv.copy_kv(np.array([], dtype=np.int64), np.array([], dtype=np.int64))  # nothing to copy
    kv.check()
    assert not kv.get_kv(0, [1, 2, 3, 4])[0].any(), "layer 0 was never written"


DEVICE_REFUSALS: list[tuple[str, Callable[[KVBuffers], object], type[KVRefError], str, str]] = [
    (
        "set_kv at slot 2 twice",
        lambda kv: kv.set_kv(0, np.array([2, 2]), *kv_for(2)),
        InvalidValueError,
        "DATA-807",
        "set_kv (call 0): entry 1 (value 2) is a usable slot the call writes twice",
    ),
    (
        "set_kv past the end",
        lambda kv: kv.set_kv(1, np.array([[1], [7]]), *(a.reshape(2, 1, -1) for a in kv_for(2))),
        BlockIdError,
        "DATA-804",
        "set_kv (call 0): entry 1 (value 7) is a slot outside the buffers",
    ),
    (
        "get_kv of the padding",
        lambda kv: kv.get_kv(0, np.array([1, 0])),
        InvalidValueError,
        "DATA-802",
        "get_kv (call 0): entry 1 (value 0) is a padding slot",
    ),
    (
        "get_kv past the end",
        lambda kv: kv.get_kv(1, np.array([-1])),
        BlockIdError,
        "DATA-804",
        "get_kv (call 0): entry 0 (value -1) is a slot outside the buffers",
    ),
    (
        "copy_kv into its own source",
        lambda kv: kv.copy_kv(np.array([1, 2]), np.array([3, 1])),
        InvalidValueError,
        "DATA-809",
        "copy_kv (call 0): entry 3 (value 1) is a dst slot that repeats",
    ),
    (
        "copy_kv from the padding",
        lambda kv: kv.copy_kv(np.array([0]), np.array([3])),
        InvalidValueError,
        "DATA-802",
        "copy_kv (call 0): entry 0 (value 0) is a padding slot",
    ),
]


@rule("DATA-815", "DATA-816", "DATA-817", "DATA-802", "DATA-804", "DATA-807", "DATA-809")
@pytest.mark.parametrize(
    ("case", "call", "error", "rule_id", "says"), DEVICE_REFUSALS, ids=[c[0] for c in DEVICE_REFUSALS]
)
def test_a_call_refused_on_the_device_changes_no_slot_and_check_reports_it_once(
    case: str, call: Callable[[KVBuffers], object], error: type[KVRefError], rule_id: str, says: str
) -> None:
    kv = on_device()
    for layer in (0, 1):
        kv.set_kv(layer, np.array([1, 2, 3, 4]), *kv_for(4, seed=layer + 1))
    kv.check()
    before = [b[1:].tolist() for b in (*kv.k_buffer, *kv.v_buffer)]  # the padding slot absorbs a refused write
    call(kv)  # no host read: the call returns, its verdict waits on the device
    assert [b[1:].tolist() for b in (*kv.k_buffer, *kv.v_buffer)] == before, f"[DATA-817] {case} changed a slot"
    refused(case, kv.check, error, rule_id, says.replace("(call 0)", "(call 2)"))
    kv.check()  # reported once


@rule("DATA-803", "DATA-809", "DATA-815")
def test_shapes_are_refused_at_once_on_the_device_path_too() -> None:
    kv = on_device()
    before = contents(kv)
    refused(
        "set_kv with k of other heads",
        lambda: kv.set_kv(0, np.array([1]), np.zeros((1, 2, 2)), kv_for(1)[1]),
        InvalidValueError,
        "DATA-803",
        "set_kv: k of shape (1, 2, 2) for indices of shape (1,): "
        "its leading dimensions must be the indices' and its trailing ones multiply to 2 x 3",
    )
    refused(
        "set_kv with v of other dims",
        lambda: kv.set_kv(0, np.array([1]), kv_for(1)[0], np.zeros((1, 4))),
        InvalidValueError,
        "DATA-803",
        "set_kv: v of shape (1, 4) for indices of shape (1,): its leading "
        "dimensions must be the indices' and its trailing ones multiply to 1 x 5",
    )
    refused(
        "copy_kv unpaired",
        lambda: kv.copy_kv(np.array([1]), np.array([2, 3])),
        InvalidValueError,
        "DATA-809",
        "copy_kv: 1 src slots and 2 dst slots",
    )
    assert contents(kv) == before, "[ERR-501] a refused shape wrote something"
    kv.check()  # nothing recorded: the shapes were refused before any device check


@rule("DATA-815")
def test_slots_given_as_lists_take_the_host_path_even_when_checks_are_on_the_device() -> None:
    kv = on_device()
    refused(
        "set_kv from a list",
        lambda: kv.set_kv(0, [1, 1], *kv_for(2)),
        InvalidValueError,
        "DATA-807",
        "set_kv: a usable slot appears twice in one call",
    )
    kv.set_kv(0, [1, 2], *kv_for(2))
    kv.copy_kv(np.array([1]), [3])  # one side a list: the host path
    assert kv.get_kv(0, [3])[0].tolist() == [kv_for(2)[0][0].tolist()], "the mixed copy_kv did not copy slot 1"
    kv.check()


# ---------------------------------------------------------------------------------------- host indices


class _CupyLike:
    """An array of another library that reads back to the host with ``get()``."""

    def get(self) -> np.ndarray:
        return np.array([[3, 1]])


class _HasCpu:
    """An array-like with a ``cpu`` attribute that is not a torch tensor (no ``detach``)."""

    cpu = "not a method"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.array([2, 4])


@rule("ERR-503")
def test_host_indices_read_any_array_back_once_and_refuse_what_is_not_integer() -> None:
    assert host_indices(_CupyLike(), op="x").tolist() == [[3, 1]], "a CuPy-like array is read with get()"
    assert host_indices(_HasCpu(), op="x").tolist() == [2, 4], "a cpu attribute alone does not make a torch tensor"
    got = host_indices(np.array([1, 2], dtype=np.int32), op="x")
    assert got.dtype == np.int64 and got.tolist() == [1, 2], f"int32 indices came back as {got.dtype}"
    assert host_indices([], op="x").dtype == np.int64, "no index is no error"
    refused(
        "floats",
        lambda: host_indices(1.5, op="x"),
        InvalidTypeError,
        "ERR-503",
        "x: indices must be integers, got float64",
    )
    refused(
        "bools",
        lambda: host_indices([True], op="x", arg="slots"),
        InvalidTypeError,
        "ERR-503",
        "x: slots must be integers, got bool",
    )
    refused(
        "a dict",
        lambda: host_indices({1: 2}, op="x"),
        InvalidTypeError,
        "ERR-503",
        "x: indices must be integers, got object",
    )


@rule("DATA-805", "DATA-806")
def test_numpy_tensors_copy_what_they_read_back_and_name_what_they_cannot_hold() -> None:
    t = NumpyTensors()
    a = t.zeros((2,), "int32")
    back = t.to_host(a)
    a[0] = 5
    assert back.tolist() == [0, 0], "to_host returned a view of the array, not a copy"
    assert t.values([1.7], "int32").dtype == np.int32 and t.nbytes(a) == 8 and t.index(np.array([1])).dtype == np.int64
    refused(
        "bfloat16",
        lambda: t.zeros((1,), "bfloat16"),
        ConfigError,
        "DATA-805",
        "numpy cannot hold dtype 'bfloat16'; it holds ['float16', 'float32',",
    )


@rule("ERR-503", "DATA-815")
def test_torch_tensors_are_read_back_detached_and_checked_on_their_device() -> None:
    torch = pytest.importorskip("torch")
    from kvref_torch.tensors import TorchTensors

    assert host_indices(torch.tensor([[3, 1]]), op="x").tolist() == [[3, 1]], "a tensor's values, its shape kept"
    refused(
        "a tensor that requires grad",
        lambda: host_indices(torch.tensor([1.0], requires_grad=True), op="x"),
        InvalidTypeError,
        "ERR-503",
        "x: indices must be integers, got float32",
    )
    kv = buffers(tensors=TorchTensors("cpu"), checks="device")
    k, v = kv_for(2)
    kv.set_kv(0, torch.tensor([2, 1]), torch.from_numpy(k).double(), torch.from_numpy(v).double())
    got_k, got_v = kv.get_kv(0, torch.tensor([1, 2]))
    kv.check()
    assert got_k.dtype == torch.float32, f"values given as float64 are held as the buffers' float32: {got_k.dtype}"
    assert got_k.tolist() == [k[1].tolist(), k[0].tolist()] and got_v.tolist() == [v[1].tolist(), v[0].tolist()]
