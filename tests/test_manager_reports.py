"""The request manager oracle's self-check, branch by branch, and what its read-outs say exactly.

``tests/test_manager_invariants.py`` checks that a corrupted table is caught under its rule; here
each branch of ``check_invariants`` is reached on its own and its report read from its start
(REQ-710, REQ-720, REQ-721, REQ-730), the common prefix is counted on tables built by hand
(REQ-718), and the snapshot sees every part of the manager's state (ERR-501).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvref.contract.errors import InvariantViolation
from kvref.contract.manager import FULL_ATTENTION, NULL_BLOCK, CacheGroup
from kvref.contract.requests import Request
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager

rule = pytest.mark.rule
HYBRID = (FULL_ATTENTION, CacheGroup.window(8))


def admitted(max_model_len: int = 64) -> tuple[RequestManager, Request]:
    """Request "a" of 10 tokens, all computed, in a full-attention group and a window of 8 (blocks of 4)."""
    m = RequestManager(OracleBlockPool(24), block_size=4, max_model_len=max_model_len, groups=HYBRID)
    req = Request("a", list(range(10)), block_size=4)
    assert m.allocate_slots(req, 10) is not None
    req.num_computed_tokens = 10
    m.check_invariants()
    return m, req


def table(m: RequestManager, group: int = 0) -> list[int]:
    return m.groups[group].tables["a"]


def swap_first_two(m: RequestManager) -> None:
    t = table(m)
    t[0], t[1] = t[1], t[0]


def one_more_block(m: RequestManager) -> None:
    table(m).extend(m.pool.allocate(1, holder="a"))


def register_the_partial_block(m: RequestManager) -> None:
    t = table(m)
    m.pool.register([t[2]], [12345], parent_hash=m.pool.block_hash(t[1]))


REPORTS: list[tuple[str, Callable[[RequestManager, Request], object], int, str, str]] = [
    (
        "a null block between real ones",
        lambda m, r: table(m, 1).__setitem__(1, NULL_BLOCK),
        64,
        "REQ-730",
        "request 'a', group 1: null blocks [",
    ),
    (
        "a null block in a full-attention table",
        lambda m, r: table(m).__setitem__(0, NULL_BLOCK),
        64,
        "REQ-730",
        "request 'a', group 0: null blocks [0, ",
    ),
    (
        "a block named twice",
        lambda m, r: table(m).__setitem__(1, table(m)[0]),
        64,
        "REQ-721",
        "request 'a', group 0: its table [",
    ),
    (
        "a block the pool does not give the request",
        lambda m, r: table(m).append(20),
        64,
        "REQ-721",
        "request 'a', group 0: its table has block 20, which the pool says it holds 0 times",
    ),
    (
        "computed tokens beyond the table",
        lambda m, r: setattr(r, "num_computed_tokens", 13),
        64,
        "REQ-721",
        "request 'a': 13 computed tokens, 3 blocks of 4",
    ),
    (
        "a table longer than the model allows",
        lambda m, r: one_more_block(m),
        12,
        "REQ-720",
        "request 'a': 4 blocks exceed max_model_len 12",
    ),
    (
        "more blocks counted cached than are full",
        lambda m, r: m.groups[0].num_cached.__setitem__("a", 3),
        64,
        "REQ-710",
        "request 'a', group 0: 3 blocks counted cached, 2 full blocks exist",
    ),
    ("cached blocks out of order", lambda m, r: swap_first_two(m), 64, "REQ-721", "request 'a', group 0: block 0 (id "),
    (
        "a partial block registered",
        lambda m, r: register_the_partial_block(m),
        64,
        "REQ-710",
        "request 'a', group 0: block 2 (id ",
    ),
    (
        "a reference no table lists",
        lambda m, r: m.pool.allocate(1, holder="a"),
        64,
        "REQ-721",
        "request 'a' holds 7 references in the pool, its tables 6 blocks",
    ),
]


@rule("REQ-710", "REQ-720", "REQ-721", "REQ-730")
@pytest.mark.parametrize(("case", "corrupt", "limit", "rule_id", "says"), REPORTS, ids=[r[0] for r in REPORTS])
def test_each_branch_of_the_managers_self_check_reports_what_it_saw(
    case: str, corrupt: Callable[[RequestManager, Request], object], limit: int, rule_id: str, says: str
) -> None:
    m, req = admitted(limit)
    corrupt(m, req)
    with pytest.raises(InvariantViolation) as raised:
        m.check_invariants()
    message = str(raised.value)
    assert raised.value.rule == rule_id, f"{case}: reported as {message!r}; the corruption breaks {rule_id}"
    assert message.startswith(f"[{rule_id}] {says}"), f"{case}: {message!r} does not start {says!r}"


@rule("REQ-721")
def test_references_of_holders_that_are_not_requests_are_not_the_managers() -> None:
    m, _ = admitted()
    m.pool.allocate(2, holder=7)  # another user of the pool, not a request id
    m.check_invariants()


@rule("REQ-718")
def test_the_common_prefix_is_the_run_of_positions_every_scheduled_table_shares() -> None:
    m = RequestManager(OracleBlockPool(32), block_size=4, max_model_len=64)
    prompt = list(range(12))
    reqs = [Request(rid, prompt[:n] + [90 + i] * 5, block_size=4) for i, (rid, n) in enumerate([("a", 12), ("b", 8)])]
    for req in reqs:
        req.num_computed_tokens = 0
        hit, _ = m.get_computed_blocks(req)
        assert m.allocate_slots(req, req.num_tokens, num_new_computed_tokens=0) is not None
        req.num_computed_tokens = req.num_tokens
    assert m.get_num_common_prefix_blocks(["a", "b"]) == [0], "b computed its blocks anew: nothing is shared"
    c = Request("c", prompt + [99] * 5, block_size=4)
    hit, found = m.get_computed_blocks(c)
    assert found == 12, f"c's first three blocks are a's: {found} tokens hit"
    assert m.allocate_slots(c, c.num_tokens - found, num_new_computed_tokens=found, new_computed_blocks=hit)
    assert m.get_num_common_prefix_blocks(["a", "c"]) == [3], "a and c share their first three blocks"
    assert m.get_num_common_prefix_blocks(["a"]) == [len(m.groups[0].tables["a"])], "one request: its whole table"
    assert m.get_num_common_prefix_blocks([]) == [0], "no request: no common prefix"
    assert m.get_num_common_prefix_blocks(["a", "c"], num_running=2) == [3], "vLLM's count: references equal 2"
    assert m.get_num_common_prefix_blocks(["a", "c"], num_running=3) == [0], "no block is held by 3 requests"


@rule("ERR-501")
def test_the_managers_snapshot_has_its_documented_fields_and_sees_every_change() -> None:
    m, req = admitted()
    seen = [m.snapshot()]
    fields = {"tables", "num_cached", "cached_this_step", "ledger", "num_available", "pools"}
    assert set(seen[0]) == fields, f"fields {sorted(seen[0])}"
    assert seen[0]["tables"][0] == {"a": table(m)} and seen[0]["num_cached"][0] == {"a": 2}, f"{seen[0]}"
    m.free(req)
    seen.append(m.snapshot())
    changed = {k for k in seen[0] if seen[0][k] != seen[1][k]}
    assert changed >= {"tables", "num_cached", "num_available", "pools"}, f"a free changed only {sorted(changed)}"


class NoSnapshot:
    """A pool seen only through the protocol's reads: the manager's snapshot falls back on them."""

    def __init__(self, pool: OracleBlockPool) -> None:
        self._pool = pool

    def __getattr__(self, name: str) -> object:
        if name == "snapshot":
            raise AttributeError(name)
        return getattr(self._pool, name)


@rule("ERR-501")
def test_over_a_pool_without_a_snapshot_the_manager_reads_each_blocks_count_and_hash() -> None:
    pool = OracleBlockPool(8)
    m = RequestManager(NoSnapshot(pool), block_size=4, max_model_len=64)  # type: ignore[arg-type]
    req = Request("a", list(range(6)), block_size=4)
    assert m.allocate_slots(req, 6) is not None
    state = m.snapshot()["pools"][0]
    want = tuple((pool.ref_count(b), pool.block_hash(b)) for b in range(8))
    assert state == want and state[1] == (1, pool.block_hash(1)) != (1, None), f"pool view {state}"
