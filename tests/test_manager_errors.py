"""The request manager oracle's refusals: each names its rule, its call and the argument at fault,
and changes nothing (REQ-703, REQ-711, REQ-712, REQ-716, ERR-501, ERR-521); and the boundaries
where a call stops being refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvref.contract.errors import InvalidTypeError, InvalidValueError, KVRefError
from kvref.contract.requests import Request
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager

rule = pytest.mark.rule


def admitted(*, events: bool = False) -> tuple[Any, Request]:
    """Request "a" of 10 tokens admitted and computed (blocks of 4). Typed ``Any``: the cases pass
    what the signatures refuse, on purpose."""
    m = RequestManager(OracleBlockPool(24), block_size=4, max_model_len=64, enable_kv_cache_events=events)
    req = Request("a", list(range(10)), block_size=4)
    assert m.allocate_slots(req, 10) is not None
    req.num_computed_tokens = 10
    return m, req


def fresh(n: int = 6, rid: str = "b") -> Request:
    return Request(rid, list(range(100, 100 + n)), block_size=4)


ARGUMENTS = ["num_new_tokens", "num_new_computed_tokens", "num_lookahead_tokens", "num_external_computed_tokens",
             "num_draft_tokens"]  # fmt: skip

CASES: list[tuple[str, Callable[[Any, Request], object], type[KVRefError], str, str]] = [
    *[(f"allocate_slots: {arg} a str", lambda m, r, a=arg: m.allocate_slots(fresh(), **{"num_new_tokens": 4, a: "1"}),
       InvalidTypeError, "REQ-712", f"allocate_slots: {arg} must be an integer") for arg in ARGUMENTS],
    *[(f"allocate_slots: {arg} negative", lambda m, r, a=arg: m.allocate_slots(fresh(), **{"num_new_tokens": 4, a: -1}),
       InvalidValueError, "REQ-712", f"allocate_slots: {arg} must be >= 0") for arg in ARGUMENTS],
    ("allocate_slots: nothing to do", lambda m, r: m.allocate_slots(fresh(), 0), InvalidValueError, "REQ-712",
     "allocate_slots: num_new_tokens must be > 0 when there are no computed tokens to adopt"),
    ("allocate_slots: more drafts than new tokens", lambda m, r: m.allocate_slots(fresh(), 2, num_draft_tokens=3),
     InvalidValueError, "REQ-712", "allocate_slots: 3 draft tokens among only 2 new tokens"),
    ("allocate_slots: external tokens after admission", lambda m, r: m.allocate_slots(r, 1,
     num_external_computed_tokens=4), InvalidValueError, "REQ-712", "allocate_slots: request 'a' already holds blocks"),
    ("allocate_slots: computed tokens without blocks", lambda m, r: m.allocate_slots(computed(fresh(), 2), 4),
     InvalidValueError, "REQ-712", "allocate_slots: request 'b' says 2 tokens are computed, its 0 blocks hold fewer"),
    ("allocate_slots: not a request", lambda m, r: m.allocate_slots("a", 4), InvalidTypeError, "REQ-703",
     "allocate_slots: expected a kvref Request, got str"),
    ("cache_blocks: a str", lambda m, r: m.cache_blocks(r, "8"), InvalidTypeError, "REQ-711",
     "cache_blocks: num_computed_tokens must be an integer"),
    ("cache_blocks: beyond the blocks", lambda m, r: m.cache_blocks(r, 99), InvalidValueError, "REQ-711",
     "cache_blocks: 99 tokens of request 'a', which has 10 tokens and 3 blocks"),
    ("cache_blocks: not a request", lambda m, r: m.cache_blocks(None, 4), InvalidTypeError, "REQ-703",
     "cache_blocks: expected a kvref Request"),
    ("record_prefix_cache_stats: a str", lambda m, r: m.record_prefix_cache_stats(r, "1"), InvalidTypeError,
     "REQ-716", "record_prefix_cache_stats: num_hits must be an integer"),
    ("record_prefix_cache_stats: every token a hit", lambda m, r: m.record_prefix_cache_stats(r, 10),
     InvalidValueError, "REQ-716", "record_prefix_cache_stats: 10 hits for 10 tokens"),
    ("record_prefix_cache_stats: the one token a hit", lambda m, r: m.record_prefix_cache_stats(fresh(1), 1),
     InvalidValueError, "REQ-716", "record_prefix_cache_stats: 1 hits for 1 tokens"),
    ("record_prefix_cache_stats: not a request", lambda m, r: m.record_prefix_cache_stats(3, 0), InvalidTypeError,
     "REQ-703", "record_prefix_cache_stats: expected a kvref Request"),
]  # fmt: skip


def computed(req: Request, n: int) -> Request:
    req.num_computed_tokens = n
    return req


@rule("ERR-501", "ERR-521", "REQ-703", "REQ-711", "REQ-712", "REQ-716")
@pytest.mark.parametrize(("case", "call", "error", "rule_id", "says"), CASES, ids=[c[0] for c in CASES])
def test_a_refused_manager_call_names_its_rule_call_and_argument_and_changes_nothing(
    case: str, call: Callable[[Any, Request], object], error: type[KVRefError], rule_id: str, says: str
) -> None:
    m, req = admitted()
    before = m.snapshot()
    with pytest.raises(error) as raised:
        call(m, req)
    message = str(raised.value)
    assert raised.value.rule == rule_id, f"{case}: raised {message!r}; the rule it breaks is {rule_id}"
    assert message.startswith(f"[{rule_id}] {says}"), f"[ERR-521] {case}: {message!r} does not start {says!r}"
    assert m.snapshot() == before, f"[ERR-501] {case}: the refused call changed the manager"


@rule("REQ-712")
def test_counts_given_as_numpy_integers_are_counts() -> None:
    m, _ = admitted()
    req = fresh(9)
    got = m.allocate_slots(req, np.int64(8), num_lookahead_tokens=np.int32(1), num_draft_tokens=np.int16(1))
    assert got is not None and len(got.blocks[0]) == 3, f"8 tokens and 1 lookahead take 3 blocks of 4, got {got}"


@rule("REQ-708", "REQ-709")
def test_external_tokens_join_the_table_at_admission_and_the_whole_sequence_may_have_to_fit() -> None:
    m, _ = admitted()
    req = fresh(9)
    got = m.allocate_slots(req, 1, num_external_computed_tokens=8)
    assert got is not None and len(m.groups[0].tables["b"]) == 3, "8 external tokens fill 2 blocks, the 9th a third"
    assert len(got.blocks[0]) == 1, f"the connector's blocks are in the table, not returned: {got}"
    m2, _ = admitted()
    assert m2.allocate_slots(Request("c", list(range(200, 240)), block_size=4), 40) is not None, "c takes 10 blocks"
    d = Request("d", list(range(300, 381)), block_size=4)  # 81 tokens, capped at 64: 16 blocks; 10 are available
    assert m2.allocate_slots(d, 8, full_sequence_must_fit=True) is None, "the whole of d cannot fit"
    assert m2.allocate_slots(d, 8) is not None, "its first chunk of 8 tokens fits"


@rule("REQ-716")
def test_a_request_may_record_every_token_but_its_last_as_a_hit() -> None:
    m, req = admitted()
    m.record_prefix_cache_stats(req, 9)
    m.record_prefix_cache_stats(fresh(1), 0)


@rule("REQ-717")
def test_the_manager_names_its_capabilities() -> None:
    assert admitted()[0].capabilities() == frozenset({"request-manager"})
    assert admitted(events=True)[0].capabilities() == frozenset({"request-manager", "events"})
