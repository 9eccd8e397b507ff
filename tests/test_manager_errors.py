"""The request manager oracle's refusals: each names its rule, its call and the argument at fault,
and changes nothing (REQ-703, REQ-711, REQ-712, REQ-716, ERR-501, ERR-521); and the boundaries
where a call stops being refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvref.contract.errors import ConfigError, InvalidTypeError, InvalidValueError, KVRefError
from kvref.contract.manager import FULL_ATTENTION, CacheGroup, KVCacheBlocks
from kvref.contract.requests import Request
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager
from tests.refusals import refused

rule = pytest.mark.rule


def admitted(*, events: bool = False) -> tuple[Any, Request]:
    """Request "a" of 10 tokens admitted and computed (blocks of 4). Typed ``Any``: the cases pass
    what the signatures refuse, on purpose."""
    m = RequestManager(
        OracleBlockPool(24, enable_events=events), block_size=4, max_model_len=64, enable_kv_cache_events=events
    )
    req = Request("a", list(range(10)), block_size=4)
    assert m.allocate_slots(req, 10) is not None
    req.num_computed_tokens = 10
    return m, req


def fresh(n: int = 6, rid: str = "b") -> Request:
    return Request(rid, list(range(100, 100 + n)), block_size=4)


ARGUMENTS = [
    "num_new_tokens",
    "num_new_computed_tokens",
    "num_lookahead_tokens",
    "num_external_computed_tokens",
    "num_draft_tokens",
]

CASES: list[tuple[str, Callable[[Any, Request], object], type[KVRefError], str, str]] = [
    *[
        (
            f"allocate_slots: {arg} a str",
            lambda m, r, a=arg: m.allocate_slots(fresh(), **{"num_new_tokens": 4, a: "1"}),
            InvalidTypeError,
            "REQ-712",
            f"allocate_slots: {arg} must be an integer",
        )
        for arg in ARGUMENTS
    ],
    *[
        (
            f"allocate_slots: {arg} negative",
            lambda m, r, a=arg: m.allocate_slots(fresh(), **{"num_new_tokens": 4, a: -1}),
            InvalidValueError,
            "REQ-712",
            f"allocate_slots: {arg} must be >= 0",
        )
        for arg in ARGUMENTS
    ],
    (
        "allocate_slots: nothing to do",
        lambda m, r: m.allocate_slots(fresh(), 0),
        InvalidValueError,
        "REQ-712",
        "allocate_slots: num_new_tokens must be > 0 when there are no computed tokens to adopt",
    ),
    (
        "allocate_slots: more drafts than new tokens",
        lambda m, r: m.allocate_slots(fresh(), 2, num_draft_tokens=3),
        InvalidValueError,
        "REQ-712",
        "allocate_slots: 3 draft tokens among only 2 new tokens",
    ),
    (
        "allocate_slots: external tokens after admission",
        lambda m, r: m.allocate_slots(r, 1, num_external_computed_tokens=4),
        InvalidValueError,
        "REQ-712",
        "allocate_slots: request 'a' already holds blocks",
    ),
    (
        "allocate_slots: computed tokens without blocks",
        lambda m, r: m.allocate_slots(computed(fresh(), 2), 4),
        InvalidValueError,
        "REQ-712",
        "allocate_slots: request 'b' says 2 tokens are computed, its 0 blocks hold fewer",
    ),
    (
        "allocate_slots: not a request",
        lambda m, r: m.allocate_slots("a", 4),
        InvalidTypeError,
        "REQ-703",
        "allocate_slots: expected a kvref Request, got str",
    ),
    (
        "allocate_slots: computed tokens without blocks given",
        lambda m, r: m.allocate_slots(fresh(), 4, num_new_computed_tokens=4),
        InvalidValueError,
        "REQ-712",
        "allocate_slots: num_new_computed_tokens=4 with no new_computed_blocks",
    ),
    (
        "allocate_slots: hits not a KVCacheBlocks",
        lambda m, r: m.allocate_slots(fresh(), 4, new_computed_blocks="x"),
        InvalidTypeError,
        "REQ-712",
        "allocate_slots: new_computed_blocks must be a KVCacheBlocks of 1 group(s)",
    ),
    (
        "allocate_slots: hits of two groups",
        lambda m, r: m.allocate_slots(fresh(), 4, new_computed_blocks=KVCacheBlocks(((), ()))),
        InvalidTypeError,
        "REQ-712",
        "allocate_slots: new_computed_blocks must be a KVCacheBlocks of 1 group(s)",
    ),
    (
        "allocate_slots: hits for a request holding blocks",
        lambda m, r: m.allocate_slots(r, 1, new_computed_blocks=KVCacheBlocks(((m.get_blocks("a").blocks[0][0],),))),
        InvalidValueError,
        "REQ-712",
        "allocate_slots: request 'a' already holds blocks; hits join only an empty table",
    ),
    (
        "allocate_slots: every block a hit",
        lambda m, r: m.allocate_slots(
            Request("b", list(range(8)), block_size=4),
            1,
            num_new_computed_tokens=7,
            new_computed_blocks=KVCacheBlocks((m.get_blocks("a").blocks[0][:2],)),
        ),
        InvalidValueError,
        "REQ-701",
        "allocate_slots: 2 hits for 8 tokens in blocks of 4; at most 1 may hit",
    ),
    (
        "allocate_slots: hits under other keys",
        lambda m, r: m.allocate_slots(
            fresh(9),
            4,
            num_new_computed_tokens=4,
            new_computed_blocks=KVCacheBlocks((m.get_blocks("a").blocks[0][:1],)),
        ),
        InvalidValueError,
        "REQ-712",
        "allocate_slots: group 0's hits [",
    ),
    (
        "allocate_slots: hits covering other tokens",
        lambda m, r: m.allocate_slots(
            Request("b", list(range(9)), block_size=4),
            4,
            num_new_computed_tokens=3,
            new_computed_blocks=KVCacheBlocks((m.get_blocks("a").blocks[0][:1],)),
        ),
        InvalidValueError,
        "REQ-712",
        "allocate_slots: num_new_computed_tokens=3, the 1 hits cover 4 tokens",
    ),
    (
        "allocate_slots: a second request object with the id",
        lambda m, r: m.allocate_slots(Request("a", [1, 2], block_size=4), 2),
        InvalidValueError,
        "REQ-703",
        "allocate_slots: another request object with id 'a'",
    ),
    (
        "allocate_slots: a request in other blocks",
        lambda m, r: m.allocate_slots(Request("b", [1, 2], block_size=2), 2),
        InvalidValueError,
        "REQ-703",
        "allocate_slots: request 'b' is hashed in blocks of 2, the manager's blocks hold 4",
    ),
    (
        "get_computed_blocks: not a request",
        lambda m, r: m.get_computed_blocks(1),
        InvalidTypeError,
        "REQ-703",
        "get_computed_blocks: expected a kvref Request, got int",
    ),
    ("free: not a request", lambda m, r: m.free("a"), InvalidTypeError, "REQ-703", "free: expected a kvref Request"),
    (
        "cache_blocks: a str",
        lambda m, r: m.cache_blocks(r, "8"),
        InvalidTypeError,
        "REQ-711",
        "cache_blocks: num_computed_tokens must be an integer",
    ),
    (
        "cache_blocks: beyond the blocks",
        lambda m, r: m.cache_blocks(r, 99),
        InvalidValueError,
        "REQ-711",
        "cache_blocks: 99 tokens of request 'a', which has 10 tokens and 3 blocks",
    ),
    (
        "cache_blocks: not a request",
        lambda m, r: m.cache_blocks(None, 4),
        InvalidTypeError,
        "REQ-703",
        "cache_blocks: expected a kvref Request",
    ),
    (
        "record_prefix_cache_stats: a str",
        lambda m, r: m.record_prefix_cache_stats(r, "1"),
        InvalidTypeError,
        "REQ-716",
        "record_prefix_cache_stats: num_hits must be an integer",
    ),
    (
        "record_prefix_cache_stats: every token a hit",
        lambda m, r: m.record_prefix_cache_stats(r, 10),
        InvalidValueError,
        "REQ-716",
        "record_prefix_cache_stats: 10 hits for 10 tokens",
    ),
    (
        "record_prefix_cache_stats: the one token a hit",
        lambda m, r: m.record_prefix_cache_stats(fresh(1), 1),
        InvalidValueError,
        "REQ-716",
        "record_prefix_cache_stats: 1 hits for 1 tokens",
    ),
    (
        "record_prefix_cache_stats: not a request",
        lambda m, r: m.record_prefix_cache_stats(3, 0),
        InvalidTypeError,
        "REQ-703",
        "record_prefix_cache_stats: expected a kvref Request",
    ),
]


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
    refused(case, lambda: call(m, req), error, rule_id, says)
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


class Offering:
    """An oracle pool that offers only the capabilities named."""

    def __init__(self, pool: OracleBlockPool, *capabilities: str) -> None:
        self._pool, self._capabilities = pool, frozenset(capabilities)

    def capabilities(self) -> frozenset[str]:
        return self._capabilities

    def __getattr__(self, name: str) -> object:
        return getattr(self._pool, name)


def in_use(pool: OracleBlockPool) -> OracleBlockPool:
    pool.allocate(1, holder="x")
    return pool


Manager: Any = RequestManager  # called with what its signature refuses, on purpose
WINDOW = (FULL_ATTENTION, CacheGroup.window(8))
CONSTRUCTION: list[tuple[str, Callable[[], object], type[KVRefError], str, str]] = [
    (
        "a str block size",
        lambda: Manager(OracleBlockPool(8), block_size="4", max_model_len=64),
        InvalidTypeError,
        "ERR-503",
        "RequestManager: block_size must be an integer",
    ),
    (
        "a str model length",
        lambda: Manager(OracleBlockPool(8), block_size=4, max_model_len="64"),
        InvalidTypeError,
        "ERR-503",
        "RequestManager: max_model_len must be an integer",
    ),
    (
        "block size 0",
        lambda: Manager(OracleBlockPool(8), block_size=0, max_model_len=64),
        ConfigError,
        "REQ-708",
        "RequestManager: block_size 0 and max_model_len 64 must be >= 1",
    ),
    (
        "model length 0",
        lambda: Manager(OracleBlockPool(8), block_size=4, max_model_len=0),
        ConfigError,
        "REQ-708",
        "RequestManager: block_size 4 and max_model_len 0 must be >= 1",
    ),
    (
        "an unknown stats_at",
        lambda: Manager(OracleBlockPool(8), block_size=4, max_model_len=64, stats_at="x"),
        ConfigError,
        "REQ-716",
        "RequestManager: stats_at must be 'admission' (vLLM 0.32) or 'lookup' (every get_computed_blocks)",
    ),
    (
        "an unknown last_block",
        lambda: Manager(OracleBlockPool(8), block_size=4, max_model_len=64, last_block="x"),
        ConfigError,
        "REQ-705",
        "RequestManager: last_block must be one of",
    ),
    (
        "caching without a prefix cache",
        lambda: Manager(Offering(OracleBlockPool(8)), block_size=4, max_model_len=64),
        ConfigError,
        "REQ-704",
        "RequestManager: caching needs a pool with the prefix-cache",
    ),
    (
        "events without the pool's",
        lambda: Manager(
            Offering(OracleBlockPool(8), "prefix-cache"), block_size=4, max_model_len=64, enable_kv_cache_events=True
        ),
        ConfigError,
        "REQ-717",
        "RequestManager: events need caching and a pool",
    ),
    (
        "events over a pool that records none",
        lambda: Manager(OracleBlockPool(8), block_size=4, max_model_len=64, enable_kv_cache_events=True),
        ConfigError,
        "REQ-717",
        "RequestManager: events are asked for but the pool records none; make it with enable_events=True",
    ),
    (
        "a pool in use",
        lambda: Manager(in_use(OracleBlockPool(8)), block_size=4, max_model_len=64),
        ConfigError,
        "REQ-721",
        "RequestManager: the pool already has 1 blocks in use",
    ),
    (
        "no group",
        lambda: Manager(OracleBlockPool(8), block_size=4, max_model_len=64, groups=()),
        ConfigError,
        "REQ-730",
        "RequestManager: groups must be one or more CacheGroup",
    ),
    (
        "a group that is not one",
        lambda: Manager(OracleBlockPool(8), block_size=4, max_model_len=64, groups=("x",)),
        ConfigError,
        "REQ-730",
        "RequestManager: groups must be one or more CacheGroup",
    ),
    (
        "a window without the null block",
        lambda: Manager(OracleBlockPool(8, reserved_ids=()), block_size=4, max_model_len=64, groups=WINDOW),
        ConfigError,
        "REQ-730",
        "RequestManager: a sliding-window or mamba group needs block 0",
    ),
    (
        "a window with EAGLE",
        lambda: Manager(OracleBlockPool(8), block_size=4, max_model_len=64, groups=WINDOW, use_eagle=True),
        ConfigError,
        "REQ-730",
        "RequestManager: EAGLE and last_block='share' are not specified",
    ),
    (
        "a window with a shared last block",
        lambda: Manager(OracleBlockPool(8), block_size=4, max_model_len=64, groups=WINDOW, last_block="share"),
        ConfigError,
        "REQ-730",
        "RequestManager: EAGLE and last_block='share'",
    ),
]


@rule("ERR-503", "REQ-704", "REQ-705", "REQ-708", "REQ-716", "REQ-717", "REQ-721", "REQ-730")
@pytest.mark.parametrize(("case", "make", "error", "rule_id", "says"), CONSTRUCTION, ids=[c[0] for c in CONSTRUCTION])
def test_a_refused_manager_names_its_rule_and_what_is_wrong(
    case: str, make: Callable[[], object], error: type[KVRefError], rule_id: str, says: str
) -> None:
    refused(case, make, error, rule_id, says)


@rule("REQ-708", "REQ-717")
def test_the_smallest_manager_works_and_reports_no_events_unless_asked() -> None:
    m = RequestManager(OracleBlockPool(8), block_size=1, max_model_len=1)
    assert m.capabilities() == frozenset({"request-manager"}), "events are off unless asked for"
    got = m.allocate_slots(Request("a", [5], block_size=1), 1)
    assert got is not None and len(got.blocks[0]) == 1, f"one token, one block of one: {got}"


@rule("REQ-712")
def test_empty_hits_cover_no_token() -> None:
    m, _ = admitted()
    assert m.allocate_slots(fresh(), 4, new_computed_blocks=KVCacheBlocks(((),))) is not None
