"""Chapter 08's oracle room on its own: the request-to-token table, the state pool and the routing
store refuse bad shapes and calls under their rule, naming the call and the argument (ERR-521), and
lay out what they hold as the chapter says (DATA-810..DATA-832).

The conformance suite drives these through a data plane; here each piece is held to its exact
words and numbers, which a differential run beside itself cannot do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvref.contract.errors import BlockIdError, ConfigError, InvalidTypeError, InvalidValueError, KVRefError
from kvref.oracle.data.plane import DataPlane
from kvref.oracle.data.routing import RoutingStore
from kvref.oracle.data.states import StatePool
from kvref.oracle.data.table import ReqToTokenTable
from tests.refusals import refused

rule = pytest.mark.rule

STATE_SIZES = {
    "max_reqs": 2,
    "num_layers": 2,
    "num_v_heads": 1,
    "head_k_dim": 3,
    "head_v_dim": 2,
    "conv_dim": 4,
    "conv_kernel_size": 3,
}


Routing: Any = RoutingStore  # built from a dict of sizes, some wrong on purpose


def states(**change: Any) -> StatePool:
    return StatePool(**{**STATE_SIZES, **change})


CONSTRUCTION: list[tuple[str, Callable[[], object], str, str]] = [
    *[
        (
            f"table {name} {value!r}",
            lambda n=name, v=value: ReqToTokenTable(**{"max_reqs": 2, "max_context_len": 4, n: v}),
            "DATA-810",
            f"ReqToTokenTable: {name} must be an integer >= 1, got {value!r}",
        )
        for name in ("max_reqs", "max_context_len")
        for value in (0, 2.0)
    ],
    *[
        (
            f"states {name} 0",
            lambda n=name: states(**{n: 0}),
            "DATA-820",
            f"StatePool: {name} must be a positive integer",
        )
        for name in STATE_SIZES
    ],
    (
        "states conv kernel 1",
        lambda: states(conv_kernel_size=1),
        "DATA-820",
        "StatePool: conv_kernel_size must be a positive integer, got 1",
    ),
    (
        "states track slots -1",
        lambda: states(max_track_slots=-1),
        "DATA-821",
        "StatePool: max_track_slots must be an integer >= 0, got -1",
    ),
    (
        "states track slots 1.0",
        lambda: states(max_track_slots=1.0),
        "DATA-821",
        "StatePool: max_track_slots must be an integer >= 0, got 1.0",
    ),
    *[
        (
            f"routing {name} 0",
            lambda n=name: Routing(**{"num_blocks": 4, "block_size": 2, "num_layers": 1, "topk": 2, n: 0}),
            "DATA-830",
            f"RoutingStore: {name} must be an integer >= 1, got 0",
        )
        for name in ("num_blocks", "block_size", "num_layers", "topk")
    ],
]


@rule("DATA-810", "DATA-820", "DATA-821", "DATA-830", "ERR-521")
@pytest.mark.parametrize(("case", "make", "rule_id", "says"), CONSTRUCTION, ids=[c[0] for c in CONSTRUCTION])
def test_a_refused_construction_names_its_rule_and_what_is_wrong(
    case: str, make: Callable[[], object], rule_id: str, says: str
) -> None:
    refused(case, make, ConfigError, rule_id, says)


@rule("DATA-810", "DATA-820", "DATA-830")
def test_the_smallest_shapes_are_accepted() -> None:
    ReqToTokenTable(1, 1)
    states(max_reqs=1, num_layers=1, num_v_heads=1, head_k_dim=1, head_v_dim=1, conv_dim=1, conv_kernel_size=2)
    RoutingStore(1, 1, 1, 1)


def table() -> ReqToTokenTable:
    t = ReqToTokenTable(3, 4)
    t.alloc(1)  # row 1 held
    return t


def routing() -> RoutingStore:
    return RoutingStore(4, 2, 1, 2)


CALLS: list[tuple[str, Callable[[], Any], Callable[[Any], object], type[KVRefError], str, str]] = [
    (
        "table alloc -1",
        table,
        lambda t: t.alloc(-1),
        InvalidValueError,
        "DATA-810",
        "alloc: n must be an integer >= 0, got -1",
    ),
    (
        "table alloc 1.0",
        table,
        lambda t: t.alloc(1.0),
        InvalidValueError,
        "DATA-810",
        "alloc: n must be an integer >= 0, got 1.0",
    ),
    (
        "table free of a free row",
        table,
        lambda t: t.free(2),
        InvalidValueError,
        "DATA-812",
        "free: row 2 is not handed out",
    ),
    (
        "table free of a str",
        table,
        lambda t: t.free("1"),
        InvalidValueError,
        "DATA-812",
        "free: row '1' is not handed out",
    ),
    (
        "table write to a free row",
        table,
        lambda t: t.write(2, 0, [5]),
        InvalidValueError,
        "DATA-813",
        "write: row 2 is not handed out",
    ),
    (
        "table write past the end",
        table,
        lambda t: t.write(1, 3, [5, 6]),
        InvalidValueError,
        "DATA-813",
        "write: positions from 3, 2 of them, of row 1 outside [0, 4)",
    ),
    (
        "table write from -1",
        table,
        lambda t: t.write(1, -1, [5]),
        InvalidValueError,
        "DATA-813",
        "write: positions from -1, 1 of them",
    ),
    (
        "table write from 1.0",
        table,
        lambda t: t.write(1, 1.0, [5]),
        InvalidValueError,
        "DATA-813",
        "write: positions from 1.0, 1 of them",
    ),
    (
        "table read of a free row",
        table,
        lambda t: t.read(3, 0, 1),
        InvalidValueError,
        "DATA-813",
        "read: row 3 is not handed out",
    ),
    (
        "table read past the end",
        table,
        lambda t: t.read(1, 0, 5),
        InvalidValueError,
        "DATA-813",
        "read: [0, 5) outside [0, 4]",
    ),
    (
        "table read backwards",
        table,
        lambda t: t.read(1, 2, 1),
        InvalidValueError,
        "DATA-813",
        "read: [2, 1) outside [0, 4]",
    ),
    ("table read from -1", table, lambda t: t.read(1, -1, 1), InvalidValueError, "DATA-813", "read: [-1, 1)"),
    ("table read to 1.0", table, lambda t: t.read(1, 0, 1.0), InvalidValueError, "DATA-813", "read: [0, 1.0)"),
    (
        "states reset past the end",
        states,
        lambda s: s.reset_states([3]),
        BlockIdError,
        "DATA-821",
        "reset_states: slots [3] outside [0, 3)",
    ),
    (
        "states reset of -1",
        states,
        lambda s: s.reset_states([-1]),
        BlockIdError,
        "DATA-821",
        "reset_states: slots [-1] outside [0, 3)",
    ),
    (
        "states copy unpaired",
        states,
        lambda s: s.copy_states([1], [2, 1]),
        InvalidValueError,
        "DATA-823",
        "copy_states: 1 src and 2 dst slots; slot 0 is never a dst",
    ),
    (
        "states copy into 0",
        states,
        lambda s: s.copy_states([1], [0]),
        InvalidValueError,
        "DATA-823",
        "copy_states: 1 src and 1 dst slots",
    ),
    (
        "states copy from past the end",
        states,
        lambda s: s.copy_states([3], [1]),
        BlockIdError,
        "DATA-821",
        "copy_states: src [3]",
    ),
    (
        "states free of a request slot",
        states,
        lambda s: s.free_track_slot(1),
        InvalidValueError,
        "DATA-821",
        "free_track_slot: slot 1 is not a track slot handed out",
    ),
    (
        "states layer past the end",
        states,
        lambda s: s.layer_state(2),
        BlockIdError,
        "DATA-821",
        "layer_state: layer 2 outside the pool",
    ),
    ("states layer -1", states, lambda s: s.layer_state(-1), BlockIdError, "DATA-821", "layer_state: layer -1"),
    ("states layer 1.0", states, lambda s: s.layer_state(1.0), BlockIdError, "DATA-821", "layer_state: layer 1.0"),
    ("states read past the end", states, lambda s: s.read_states(3), BlockIdError, "DATA-821", "read_states: slot [3]"),
    (
        "states write past the end",
        states,
        lambda s: s.write_states(3, 0, 0),
        BlockIdError,
        "DATA-821",
        "write_states: slot [3]",
    ),
    (
        "routing a block past the end",
        routing,
        lambda r: r.store_flat(np.zeros((1, 1, 2)), [4], [0]),
        BlockIdError,
        "DATA-830",
        "store_flat: a block outside [0, 4) in [4]",
    ),
    (
        "routing a block -1",
        routing,
        lambda r: r.forget([-1]),
        BlockIdError,
        "DATA-830",
        "forget: a block outside [0, 4) in [-1]",
    ),
    (
        "routing offsets unpaired",
        routing,
        lambda r: r.store_flat(np.zeros((1, 1, 2)), [1], [0, 1]),
        InvalidValueError,
        "DATA-830",
        "store_flat: routing (1, 1, 2) for 1 blocks and 2 offsets; expected (1, (1, 2))",
    ),
    (
        "routing of another shape",
        routing,
        lambda r: r.store_flat(np.zeros((1, 1, 3)), [1], [0]),
        InvalidValueError,
        "DATA-830",
        "store_flat: routing (1, 1, 3) for 1 blocks",
    ),
    (
        "routing an offset past the block",
        routing,
        lambda r: r.store_flat(np.zeros((1, 1, 2)), [1], [2]),
        InvalidValueError,
        "DATA-830",
        "store_flat: an offset outside [0, 2)",
    ),
    (
        "routing an offset -1",
        routing,
        lambda r: r.store_flat(np.zeros((1, 1, 2)), [1], [-1]),
        InvalidValueError,
        "DATA-830",
        "store_flat: an offset outside [0, 2)",
    ),
    (
        "routing a position twice",
        routing,
        lambda r: r.store_flat(np.zeros((2, 1, 2)), [1, 1], [0, 0]),
        InvalidValueError,
        "DATA-830",
        "store_flat: a (block, offset) appears twice",
    ),
    (
        "routing more tokens than blocks hold",
        routing,
        lambda r: r.reconstruct([1], 3),
        InvalidValueError,
        "DATA-831",
        "reconstruct: 3 tokens for 1 blocks of 2",
    ),
    (
        "routing -1 tokens",
        routing,
        lambda r: r.reconstruct([1], -1),
        InvalidValueError,
        "DATA-831",
        "reconstruct: -1 tokens",
    ),
    (
        "routing 1.0 tokens",
        routing,
        lambda r: r.reconstruct([1], 1.0),
        InvalidValueError,
        "DATA-831",
        "reconstruct: 1.0 tokens",
    ),
]


def state_of(obj: Any) -> Any:
    """Everything an object of this room holds, host-side, for ERR-501."""
    if isinstance(obj, ReqToTokenTable):
        return obj.req_to_token.tolist(), sorted(obj._free), sorted(obj._held)
    if isinstance(obj, StatePool):
        return obj.recurrent_state.tolist(), obj.conv_state.tolist(), sorted(obj._track_free)
    return obj.routing.tolist(), obj.known.tolist()


@rule("DATA-810", "DATA-812", "DATA-813", "DATA-821", "DATA-823", "DATA-830", "DATA-831", "ERR-501", "ERR-521")
@pytest.mark.parametrize(("case", "make", "call", "error", "rule_id", "says"), CALLS, ids=[c[0] for c in CALLS])
def test_a_refused_call_names_its_rule_and_call_and_changes_nothing(
    case: str, make: Callable[[], Any], call: Callable[[Any], object], error: type[KVRefError], rule_id: str, says: str
) -> None:
    obj = make()
    before = state_of(obj)
    refused(case, lambda: call(obj), error, rule_id, says)
    assert state_of(obj) == before, f"[ERR-501] {case}: the refused call changed the state"


@rule("DATA-810", "DATA-811", "DATA-812", "DATA-813", "DATA-814")
def test_the_table_hands_out_the_lowest_row_zeroed_and_reads_fresh_copies() -> None:
    t = ReqToTokenTable(3, 4)
    assert t.req_to_token.shape == (4, 4) and t.available_size() == 3, "rows 0..3, row 0 reserved"
    assert t.alloc(2) == [1, 2] and t.alloc(2) is None and t.available_size() == 1, "lowest rows first; all or none"
    t.write(1, 1, [7, 8, 9])
    got = t.read(1, 0, 4)
    got[0] = 99
    assert t.read(1, 0, 4).tolist() == [0, 7, 8, 9] and t.read(1, 2, 2).tolist() == [], "a read is a fresh copy"
    t.write(1, 4, [])  # an empty write at the end writes nothing
    t.free(1)
    assert t.alloc(1) == [1] and t.read(1, 0, 4).tolist() == [0, 0, 0, 0], "a row handed out again reads as 0"
    assert t.alloc(0) == [], "no row asked, none given"
    t.clear()
    assert t.available_size() == 3 and not t.req_to_token.any(), "clear frees and zeroes every row"


@rule("DATA-820", "DATA-821", "DATA-822", "DATA-823", "DATA-824")
def test_states_are_laid_out_by_slot_and_track_slots_follow_the_request_slots() -> None:
    s = states(max_track_slots=2, dtype="float16")
    assert s.recurrent_state.shape == (2, 5, 1, 2, 3) and s.recurrent_state.dtype == np.float32, "[l, slot, v, dv, dk]"
    assert s.conv_state.shape == (2, 5, 4, 2) and s.conv_state.dtype == np.float16, "[l, slot, conv_dim, kernel - 1]"
    assert s.mem_bytes() == 2 * 5 * 6 * 4 + 2 * 5 * 8 * 2, f"both states: {s.mem_bytes()} bytes"
    assert [s.alloc_track_slot(), s.alloc_track_slot(), s.alloc_track_slot()] == [3, 4, None], "after slots 1..2"
    s.write_states(1, np.ones((2, 1, 2, 3)), np.ones((2, 4, 2)))
    s.copy_states([1], [3])
    recurrent, conv = s.read_states(3)
    assert recurrent.sum() == 12 and conv.sum() == 16, "a copy takes both states of every layer"
    s.reset_states([3])
    assert s.read_states(3)[0].sum() == 0 and s.read_states(1)[0].sum() == 12, "a reset zeroes the slots given only"
    layer, conv_layer = s.layer_state(1)
    assert layer.shape == (5, 1, 2, 3) and conv_layer.shape == (5, 4, 2), "one layer, every slot"
    s.free_track_slot(3)
    assert s.alloc_track_slot() == 3, "a freed track slot comes back"
    assert states().alloc_track_slot() is None, "no track slots unless asked for"


@rule("DATA-830", "DATA-831", "DATA-832")
def test_routing_is_stored_by_position_and_rebuilt_only_where_every_position_has_it() -> None:
    r: Any = routing()
    tokens = np.arange(6).reshape(3, 1, 2)
    r.store_flat(tokens, [2, 2, 1], [0, 1, 0])
    assert r.reconstruct([2, 1], 3).tolist() == tokens.tolist(), "positions in block order, trimmed to 3"
    assert r.reconstruct([2, 1], 4) is None, "block 1's second position holds no routing"
    assert r.reconstruct([], 0).tolist() == [], "no token, no routing"
    r.store_flat(np.zeros((0, 1, 2)), [], [])  # nothing to store
    r.forget([2])
    assert r.reconstruct([2], 1) is None and r.reconstruct([1], 1).tolist() == [[[4, 5]]], "forget drops block 2 only"


@rule("DATA-810", "DATA-811")
def test_the_table_hands_out_one_row_by_default_and_its_last_rows_too() -> None:
    t = ReqToTokenTable(3, 4)
    assert t.alloc() == [1] and t.alloc(2) == [2, 3], "alloc() is one row; the last two free rows fit alloc(2)"
    t.write(3, 0, np.array([[5, 6], [7, 8]]))
    assert t.read(3, 0, 4).tolist() == [5, 6, 7, 8], "a batch of slots is written in order"
    refused(
        "write of floats",
        lambda: t.write(3, 0, [1.5]),
        InvalidTypeError,
        "ERR-503",
        "write: slots must be integers, got float64",
    )


@rule("DATA-821", "DATA-823", "DATA-824")
def test_state_slots_are_named_by_their_call_and_argument_and_layer_0_is_a_layer() -> None:
    s = states()
    for case, call, error, rule_id, says in [
        (
            "reset of floats",
            lambda: s.reset_states([1.5]),
            InvalidTypeError,
            "ERR-503",
            "reset_states: slots must be integers, got float64",
        ),
        (
            "copy from floats",
            lambda: s.copy_states([1.5], [2]),
            InvalidTypeError,
            "ERR-503",
            "copy_states: src must be integers",
        ),
        (
            "copy into floats",
            lambda: s.copy_states([1], [2.5]),
            InvalidTypeError,
            "ERR-503",
            "copy_states: dst must be integers",
        ),
        (
            "copy into past the end",
            lambda: s.copy_states([1], [3]),
            BlockIdError,
            "DATA-821",
            "copy_states: dst [3] outside [0, 3)",
        ),
    ]:
        refused(case, call, error, rule_id, says)
    s.write_states(2, np.full((2, 1, 2, 3), 2.0), np.full((2, 4, 2), 3.0))
    s.copy_states(np.array([[2]]), np.array([[1]]))
    recurrent, conv = s.layer_state(0)
    assert recurrent[1].sum() == 12 and conv[1].sum() == 24, "layer 0's view shows slot 1's copied states"


@rule("DATA-830", "DATA-831")
def test_routing_takes_block_0_and_names_at_most_eight_blocks_it_refuses() -> None:
    r: Any = routing()
    r.store_flat(np.ones((2, 1, 2)), np.array([[0, 0]]), np.array([[0, 1]]))
    assert r.reconstruct([0], 2).tolist() == [[[1, 1]], [[1, 1]]], "block 0 is a block like any other"
    for case, call, error, rule_id, says in [
        (
            "forget of ten blocks",
            lambda: r.forget([9] * 10),
            BlockIdError,
            "DATA-830",
            "forget: a block outside [0, 4) in [9, 9, 9, 9, 9, 9, 9, 9]",
        ),
        (
            "reconstruct past the end",
            lambda: r.reconstruct([9], 0),
            BlockIdError,
            "DATA-830",
            "reconstruct: a block outside [0, 4) in [9]",
        ),
        (
            "blocks as floats",
            lambda: r.store_flat(np.ones((1, 1, 2)), [1.0], [0]),
            InvalidTypeError,
            "ERR-503",
            "store_flat: blocks must be integers",
        ),
        (
            "offsets as floats",
            lambda: r.store_flat(np.ones((1, 1, 2)), [1], [0.0]),
            InvalidTypeError,
            "ERR-503",
            "store_flat: offsets must be integers",
        ),
    ]:
        message = str(refused(case, call, error, rule_id, says))
        assert not says.endswith("]") or message == f"[{rule_id}] {says}", f"{case}: {message!r} names more blocks"


@rule("DATA-801", "DATA-810", "DATA-820", "DATA-830")
def test_every_part_a_data_plane_builds_keeps_its_arrays_in_that_plane_s_library() -> None:
    torch = pytest.importorskip("torch")
    from kvref_torch.tensors import TorchTensors

    plane = DataPlane(TorchTensors("cpu"))
    kv = plane.kv_buffers(size=4, layer_num=1, k_head_num=1, k_head_dim=2, dtype="float32")
    table = plane.req_to_token(max_reqs=2, max_context_len=4)
    pool = plane.state_pool(**STATE_SIZES)
    store = plane.routing(num_blocks=4, block_size=2, num_layers=1, topk=2)
    held = {"kv": kv.k_buffer[0], "table": table.req_to_token, "states": pool.conv_state, "routing": store.routing}
    assert all(isinstance(a, torch.Tensor) for a in held.values()), {k: type(a) for k, a in held.items()}
    k = np.arange(6, dtype=np.float64).reshape(3, 1, 2)
    kv.set_kv(0, [3, 1, 2], k, -k)  # float64 given, float32 held
    kv.set_kv(0, [0, 4], k[:2] + 10, k[:2] + 10)  # a padded token among them
    got = kv.get_kv(0, [3, 1, 2, 4])[0]
    assert got.dtype == torch.float32 and got.reshape(-1).tolist() == [0, 1, 2, 3, 4, 5, 12, 13], got
    table.alloc(1)
    table.write(1, 0, [7, 8])
    assert table.read(1, 0, 2).tolist() == [7, 8] and table.req_to_token.dtype == torch.int32
    pool.write_states(1, np.ones((2, 1, 2, 3)), np.ones((2, 4, 2)))
    assert pool.recurrent_state.dtype == torch.float32 and float(pool.read_states(1)[0].sum()) == 12.0
    store.store_flat(np.full((1, 1, 2), 3), [1], [1])
    assert store.routing.dtype == torch.int32 and store.reconstruct([0, 1], 4) is None
    assert store.routing[1, 1].tolist() == [[3, 3]], "routing stored at block 1, offset 1"
