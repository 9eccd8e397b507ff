"""kvref's batched step over the block array surface, value for value (chapter 07's REQ-750..REQ-756).

The conformance suite runs the rules and a machine beside the oracle manager; here the step is held
to what only kvref's implementation can show: no device read in a step or a release while the free
count covers them (REQ-754), each refusal word for word (REQ-751), and the table as the engine's
kernels see it: one ``max_requests x max_blocks`` array in the pool's dtype. NumPy and torch's CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kvref_arraypool.block_arrays import DeviceBlockPool
from kvref_arraypool.block_tables import DeviceBlockTables
from kvref_arraypool.ops import ArrayOps

from kvref.contract.errors import InvalidTypeError, InvalidValueError, KVRefError, NotHeldError

rule = pytest.mark.rule


def tables(ops: ArrayOps, num_blocks: int = 64, **settings: Any) -> DeviceBlockTables:
    pool = DeviceBlockPool(num_blocks, ops=ops, max_requests=settings.pop("max_requests", 8))
    return DeviceBlockTables(pool, block_size=settings.pop("block_size", 4), max_blocks=settings.pop("max_blocks", 4))


@rule("REQ-754", "ERR-513")
def test_a_step_and_a_release_read_nothing_from_the_device_while_the_free_blocks_cover_them(ops: ArrayOps) -> None:
    t = tables(ops)
    start = ops.host_reads
    for tokens in range(1, 17):  # sixteen decode steps of four requests: a block every fourth
        t.step([0, 1, 2, 3], [tokens] * 4)
    t.release([1, 3])
    t.step([1, 3, 5], [16, 16, 16])  # within the floor: the host still counts 63 - 16 - 12
    assert ops.host_reads == start, f"[REQ-754] the steps and the release read the device {ops.host_reads - start}x"
    assert [t.num_blocks(s) for s in range(8)] == [4, 4, 4, 4, 0, 4, 0, 0]
    assert t.pool.available_blocks() == 63 - 20 and ops.host_reads == start + 1, "one read confirms the release"


@rule("REQ-753", "ERR-510")
def test_the_table_is_one_row_per_request_slot_in_the_pools_dtype_padded_with_the_null_block(ops: ArrayOps) -> None:
    t = tables(ops, max_requests=3, max_blocks=2)
    assert tuple(t.table.shape) == (3, 2) and str(t.table.dtype).endswith("int32"), (t.table.shape, t.table.dtype)
    ids, _ = t.step([1], [5])
    assert [[int(x) for x in r] for r in t.table.tolist()] == [[0, 0], [1, 2], [0, 0]], t.table
    ids[:] = 0  # the caller's own array: the table keeps its ids
    assert t.blocks(1) == [1, 2], "[ERR-510] writing into a step's output reached the table"
    assert repr(t) == f"DeviceBlockTables(rows=3, max_blocks=2, block_size=4, pool={t.pool!r})"


REFUSALS = [
    (
        "a slot twice",
        lambda t: t.step([0, 0], [4, 4]),
        InvalidValueError,
        "REQ-751",
        "step: request slots [0, 0] name one slot twice",
    ),
    (
        "a slot past the last",
        lambda t: t.step([8], [4]),
        InvalidValueError,
        "ERR-517",
        "step: request slot 8 outside [0, 8)",
    ),
    (
        "a release of a negative slot",
        lambda t: t.release([-1]),
        InvalidValueError,
        "ERR-517",
        "release: request slot -1 outside [0, 8)",
    ),
    (
        "tokens past a row",
        lambda t: t.step([0, 1], [4, 17]),
        InvalidValueError,
        "REQ-751",
        "step: request slot 1's 17 tokens need 5 blocks; a row holds 4",
    ),
    (
        "unpaired counts",
        lambda t: t.step([0, 1], [4]),
        InvalidValueError,
        "REQ-751",
        "step: 1 token counts for 2 request slots",
    ),
    (
        "slots as a str",
        lambda t: t.step("01", [4, 4]),
        InvalidTypeError,
        "ERR-503",
        "step: slots must be a sequence of ints, got str",
    ),
    (
        "counts as a set",
        lambda t: t.step([0], {4}),
        InvalidTypeError,
        "ERR-503",
        "step: num_tokens must be a sequence of ints, got set",
    ),
    (
        "a count as a float",
        lambda t: t.step([0], [4.5]),
        InvalidTypeError,
        "ERR-503",
        "step: num_tokens must be an integer, got float 4.5",
    ),
    (
        "a query of a str",
        lambda t: t.blocks("a"),
        InvalidTypeError,
        "ERR-503",
        "blocks: slots must be an integer, got str 'a'",
    ),
]


@rule("REQ-751", "ERR-503", "ERR-517", "ERR-521")
@pytest.mark.parametrize(("case", "call", "error", "rule_id", "says"), REFUSALS, ids=[c[0] for c in REFUSALS])
def test_a_refused_step_names_its_rule_and_changes_nothing(
    ops: ArrayOps, case: str, call: Any, error: type[KVRefError], rule_id: str, says: str
) -> None:
    t = tables(ops)
    t.step([2], [6])
    before = [[int(x) for x in r] for r in t.table.tolist()]
    with pytest.raises(error) as raised:
        call(t)
    assert str(raised.value) == f"[{rule_id}] {says}", f"[ERR-521] {case}: {raised.value}"
    assert [[int(x) for x in r] for r in t.table.tolist()] == before and t.num_blocks(2) == 2, f"{case} changed a row"
    assert t.pool.available_blocks() == 61, f"[REQ-751] {case} took or gave back blocks"


@rule("REQ-756")
def test_tables_are_made_over_an_unused_array_pool_with_rows_of_at_least_one_block(ops: ArrayOps) -> None:
    pool = DeviceBlockPool(8, ops=ops, max_requests=2)
    cases: list[tuple[str, Callable[[], object], str]] = [
        (
            "no block size",
            lambda: DeviceBlockTables(pool, block_size=0, max_blocks=2),
            "[REQ-756] DeviceBlockTables: block_size 0 and max_blocks 2 must be >= 1",
        ),
        (
            "no room",
            lambda: DeviceBlockTables(pool, block_size=4, max_blocks=0),
            "[REQ-756] DeviceBlockTables: block_size 4 and max_blocks 0 must be >= 1",
        ),
        (
            "a list pool",
            lambda: DeviceBlockTables("pool", block_size=4, max_blocks=2),  # type: ignore[arg-type]
            "[ERR-503] DeviceBlockTables: pool must be a DeviceBlockPool, got str",
        ),
    ]
    for what, call, says in cases:
        with pytest.raises(KVRefError) as raised:
            call()
        assert str(raised.value) == says, f"{what}: {raised.value}"
    pool.allocate([1], [0])
    with pytest.raises(InvalidValueError, match=r"\[REQ-756\] DeviceBlockTables: the pool already has blocks in use"):
        DeviceBlockTables(pool, block_size=4, max_blocks=2)
    unpadded = DeviceBlockPool(8, ops=ops, max_requests=2, reserved_ids=(7,))
    with pytest.raises(InvalidValueError, match=r"\[REQ-756\] DeviceBlockTables: block 0 pads the rows"):
        DeviceBlockTables(unpadded, block_size=4, max_blocks=2)


@rule("REQ-752", "ERR-511", "ERR-501")
def test_a_release_the_pool_refuses_keeps_every_row_it_named_and_check_gives_them_back(ops: ArrayOps) -> None:
    t = tables(ops)
    t.step([0, 1, 2], [8, 8, 4])  # 0: [1, 2]; 1: [3, 4]; 2: [5]
    t.pool.free([t.blocks(1)[0]], 1)  # behind the tables' back
    t.pool.check()
    t.release([0, 1])  # refused on the device: block 3 is no longer slot 1's
    t.release([2])  # accepted
    assert t.num_blocks(0) == t.num_blocks(1) == 0, "until the check, the host believes the release"
    with pytest.raises(NotHeldError, match=r"\[POOL-108\] free \(call \d+\): entry 3 \(value 3\)"):
        t.check()
    assert (t.blocks(0), t.blocks(1), t.blocks(2)) == ([1, 2], [3, 4], []), "[REQ-752] the refused rows came back"
    assert t.pool.ref_count(1) == t.pool.ref_count(2) == t.pool.ref_count(4) == 1 and t.pool.ref_count(5) == 0
    t.check()  # reported once
    t.step([1], [4])
    t.release([0])
    t.check()
    assert t.pool.available_blocks() == 63 - 1, "slot 0 gave back 1 and 2; only block 4 is in use (3 was freed outside)"


@rule("REQ-752", "ERR-511", "ERR-513")
def test_a_step_whose_host_read_reports_a_refused_release_gives_its_rows_back(ops: ArrayOps) -> None:
    t = tables(ops, num_blocks=8, max_blocks=8)
    t.step([0, 1], [8, 12])  # 0: [1, 2]; 1: [3, 4, 5]
    t.pool.free([t.blocks(0)[1]], 0)  # behind the tables' back
    t.pool.check()
    t.release([0])  # refused on the device: block 2 is no longer slot 0's
    with pytest.raises(NotHeldError, match=r"\[POOL-108\] free \(call \d+\)"):
        t.step([2], [16])  # 4 blocks: more than the 3 the host counts free, so the pool reads the device
    assert (t.blocks(0), t.blocks(1), t.blocks(2)) == ([1, 2], [3, 4, 5], []), "[REQ-752] the refused row came back"
    ids, offsets = t.step([2], [12])  # reported once; the step then goes through
    assert offsets == [0, 3] and t.blocks(2) == ops.tolist(ids)


@rule("REQ-752", "ERR-511")
def test_the_rows_kept_for_a_refused_release_are_let_go_once_the_pool_has_reported_its_calls(ops: ArrayOps) -> None:
    t = tables(ops)
    for _ in range(50):  # an engine that checks the pool itself, never the tables
        t.step([0, 1], [4, 4])
        t.release([0, 1])
        t.pool.check()
    assert t.releases_unconfirmed == 0, f"[REQ-752] {t.releases_unconfirmed} confirmed releases still kept"
    t.step([0], [4])
    t.release([0])
    assert t.releases_unconfirmed == 1, "the release since the last read is kept until a read confirms it"
