"""One cache group's arithmetic on its own: how many blocks a sliding window skips and needs for a hit,
where its hit is found, and what a request's blocks cost the pool at the edge of fitting
(REQ-704, REQ-709, REQ-730, REQ-731).

The manager's differential machines run these through the oracle on both sides; here the numbers
are the chapter's, so an off-by-one in the window's arithmetic or in the count of blocks to take
cannot hide behind itself.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvref.contract.errors import ConfigError, InvalidValueError
from kvref.contract.hashing import ROOT_HASH, hash_block
from kvref.contract.manager import (
    FULL_ATTENTION,
    NULL_BLOCK,
    CacheGroup,
    KVCacheBlocks,
    RequestBlockStored,
    group_key,
)
from kvref.contract.requests import Request
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager
from kvref.oracle.manager.groups import GroupTables
from tests.refusals import refused

rule = pytest.mark.rule


@rule("REQ-731")
@pytest.mark.parametrize(
    ("window", "block_size", "blocks"), [(2, 4, 1), (4, 4, 1), (5, 4, 1), (6, 4, 2), (9, 4, 2), (8, 2, 4), (3, 1, 2)]
)
def test_a_window_hit_needs_the_blocks_its_last_token_looks_over(window: int, block_size: int, blocks: int) -> None:
    g = GroupTables(1, CacheGroup.window(window), OracleBlockPool(4), block_size)
    assert g.spec == CacheGroup.window(window), f"the group keeps the spec it was made from: {g.spec}"
    got = g.run_length()
    assert got == blocks, f"a window of {window} tokens in blocks of {block_size}: run_length {got}, expected {blocks}"


@rule("REQ-730")
@pytest.mark.parametrize(
    ("window", "block_size", "computed", "skipped"),
    [(4, 1, 2, 0), (4, 1, 4, 1), (4, 1, 10, 7), (4, 4, 4, 0), (4, 4, 8, 1), (5, 4, 12, 2), (8, 4, 3, 0)],
)
def test_a_window_skips_the_whole_blocks_before_its_first_token(
    window: int, block_size: int, computed: int, skipped: int
) -> None:
    g = GroupTables(1, CacheGroup.window(window), OracleBlockPool(4), block_size)
    got = g.skipped_blocks(computed)
    assert got == skipped, (
        f"window {window}, blocks of {block_size}, {computed} tokens computed: {got} blocks skipped, expected {skipped}"
    )
    full = GroupTables(0, FULL_ATTENTION, OracleBlockPool(4), block_size)
    assert full.skipped_blocks(computed) == 0 and full.run_length() == 0, "full attention skips nothing"


@rule("REQ-731")
def test_a_window_hit_is_the_rightmost_run_found_past_uncached_blocks_on_its_right() -> None:
    pool = OracleBlockPool(8)
    g = GroupTables(1, CacheGroup.window(4), pool, 4)  # a run of one block is enough
    first, second = pool.allocate(2, holder="x")
    pool.register([first], [11])
    pool.register([second], [12])
    got = g.find_hit([11, 12, 13], 3)
    assert got == [NULL_BLOCK, second], f"block 13 uncached, 12 cached: the hit is [null, {second}], got {got}"
    assert g.find_hit([13, 14], 2) == [], "nothing cached, no hit"
    wide = GroupTables(1, CacheGroup.window(8), pool, 4)  # needs two blocks in a row
    assert wide.find_hit([11, 13, 12], 3) == [first], f"no run of two: the cached blocks from the first, got {wide}"
    full = GroupTables(0, FULL_ATTENTION, pool, 4)
    assert full.find_hit([11, 12], 0) == [] and full.find_hit([11, 12], 1) == [first], "a prefix of at most 0, 1"


@rule("REQ-709")
def test_a_token_that_fits_the_last_block_takes_no_free_block() -> None:
    m = RequestManager(OracleBlockPool(4), block_size=4, max_model_len=64)
    req = Request("a", list(range(10)), block_size=4)
    assert m.allocate_slots(req, 10) is not None and m.pool.num_available == 0, "three blocks, the pool full"
    req.num_computed_tokens = 10
    req.append_output_token_ids(5)
    got = m.allocate_slots(req, 1)
    assert got is not None, "token 11 fits block 3, which the request holds: nothing to take, so it fits"


@rule("REQ-708", "REQ-709")
def test_cached_hits_cost_the_pool_what_they_pin_and_the_new_blocks_exactly() -> None:
    m = RequestManager(OracleBlockPool(5), block_size=4, max_model_len=64)
    a = Request("a", list(range(8)), block_size=4)
    assert m.allocate_slots(a, 8) is not None
    a.num_computed_tokens = 8
    m.free(a)  # two cached blocks, free but evictable: four available in all
    fits = Request("b", list(range(13)), block_size=4)
    hits, computed = m.get_computed_blocks(fits)
    assert computed == 8 and len(hits.blocks[0]) == 2, f"b's first two blocks hit: {hits}, {computed} tokens"
    got = m.allocate_slots(fits, 5, num_new_computed_tokens=8, new_computed_blocks=hits)
    assert got is not None, "two hits pinned (2 of 4 available) and two new blocks: exactly the four available"
    m.free(fits)
    too_long = Request("c", list(range(17)), block_size=4)
    hits, computed = m.get_computed_blocks(too_long)
    assert m.allocate_slots(too_long, 9, num_new_computed_tokens=computed, new_computed_blocks=hits) is None, (
        "two hits and three new blocks need five of four available: refused"
    )


@rule("REQ-712")
def test_hits_of_unequal_length_across_groups_are_refused() -> None:
    m = RequestManager(
        OracleBlockPool(8), block_size=4, max_model_len=64, groups=(FULL_ATTENTION, CacheGroup.window(8))
    )
    before = m.snapshot()
    req = Request("b", list(range(9)), block_size=4)
    refused(
        "hits [1] and []",
        lambda: m.allocate_slots(req, 5, num_new_computed_tokens=4, new_computed_blocks=KVCacheBlocks(((1,), ()))),
        InvalidValueError,
        "REQ-712",
        "allocate_slots: the groups' hits differ in length: [1, 0]",
    )
    assert m.snapshot() == before, "[ERR-501] the refused call changed the manager"


@rule("REQ-714", "REQ-716")
def test_a_preempted_request_counts_its_preemptions_and_its_later_queries_apart() -> None:
    m = RequestManager(OracleBlockPool(8), block_size=4, max_model_len=64, stats_at="lookup")
    req = Request("a", list(range(9)), block_size=4)
    for _ in range(2):
        assert m.allocate_slots(req, 9) is not None
        m.preempt(req)
    assert req.num_preemptions == 2, f"preempted twice, num_preemptions {req.num_preemptions}"
    m.make_prefix_cache_stats()
    m.get_computed_blocks(req)
    stats = m.make_prefix_cache_stats()
    assert stats is not None and (stats.requests, stats.preempted_requests, stats.preempted_queries) == (0, 1, 9), (
        f"a query of a request preempted before counts as preempted: {stats}"
    )


@rule("REQ-715", "REQ-716")
def test_a_reset_is_reported_in_the_next_statistics() -> None:
    m = RequestManager(OracleBlockPool(8), block_size=4, max_model_len=64)
    m.make_prefix_cache_stats()
    assert m.reset_prefix_cache() is True
    stats = m.make_prefix_cache_stats()
    assert stats is not None and stats.reset, f"reset_prefix_cache succeeded; the statistics say {stats}"


@rule("REQ-717", "REQ-733")
def test_stored_events_name_their_group_and_the_ledger_keeps_only_resident_contents() -> None:
    pool = OracleBlockPool(12, enable_events=True)
    groups = (FULL_ATTENTION, CacheGroup.window(8))
    m = RequestManager(pool, block_size=4, max_model_len=64, enable_kv_cache_events=True, groups=groups)
    req = Request("a", list(range(9)), block_size=4)
    assert m.allocate_slots(req, 9) is not None
    stored = [e for e in m.take_events() if isinstance(e, RequestBlockStored)]
    assert sorted(e.group for e in stored) == [0, 0, 1, 1], f"two blocks cached in each group: {stored}"
    m.free(req)
    assert m.reset_prefix_cache() is True
    m.take_events()
    remembered = m.snapshot()["ledger"][1]
    assert remembered == {}, f"every hash was removed; the ledger still remembers {sorted(remembered)}"
    again = Request("b", list(range(9)), block_size=4)
    assert m.allocate_slots(again, 9) is not None
    m.take_events()
    kept = set(m.snapshot()["ledger"][1])
    assert kept == set(m.pool.resident_hashes()) and len(kept) == 4, f"resident contents kept: {kept}"


@rule("ERR-501")
def test_a_managers_snapshot_holds_its_pools_own_snapshot() -> None:
    m = RequestManager(OracleBlockPool(8), block_size=4, max_model_len=64)
    assert m.allocate_slots(Request("a", list(range(5)), block_size=4), 5) is not None
    pool: Any = m.pool
    assert m.snapshot()["pools"] == [pool.snapshot()], "a pool with a snapshot is compared by it"


@rule("REQ-708", "REQ-709", "REQ-718", "REQ-719")
def test_a_request_adopting_held_hits_alone_takes_no_block_and_shares_its_whole_table() -> None:
    m = RequestManager(OracleBlockPool(4), block_size=4, max_model_len=64)
    a = Request("a", list(range(12)), block_size=4)
    assert m.allocate_slots(a, 12) is not None and m.pool.num_available == 0, "three blocks, the pool full"
    c = Request("c", [*range(8), 99], block_size=4)
    hits, computed = m.get_computed_blocks(c)
    assert computed == 8, f"c's first two blocks hit: {hits}"
    got = m.allocate_slots(c, 0, num_new_computed_tokens=8, new_computed_blocks=hits)
    assert got is not None, "two hits a holds, no new token: nothing to take from a full pool, so it fits"
    shared = m.get_blocks("a").blocks[0][:2]
    assert m.get_blocks("c").blocks == (shared,), f"c's table is its two hits: {m.get_blocks('c')}"
    assert m.get_num_common_prefix_blocks(["a", "c"]) == [2], "c's whole table is a's first two blocks"
    assert m.get_num_common_prefix_blocks(["a", "ghost"]) == [0], "a request holding nothing shares nothing"
    assert m.get_blocks("ghost").blocks == ((),), "a request holding nothing has an empty table"


@rule("REQ-703", "REQ-713")
def test_a_freed_request_id_may_come_back_as_a_new_request_object() -> None:
    m = RequestManager(OracleBlockPool(8), block_size=4, max_model_len=64)
    first = Request("a", list(range(5)), block_size=4)
    assert m.allocate_slots(first, 5) is not None
    m.free(first)
    again = Request("a", list(range(50, 55)), block_size=4)
    assert m.allocate_slots(again, 5) is not None, "after free, the id names no request: a new object may take it"


@rule("REQ-733")
@pytest.mark.parametrize("group", [1, 2, 7])
def test_no_group_key_is_the_hash_of_a_block(group: int) -> None:
    first = hash_block(ROOT_HASH, [5])
    key = group_key(first, group)
    assert key != first
    assert key != hash_block(first, [group]), "one-token blocks: the block after it holding token g"
    assert key == group_key(first, group), "a key is a function of the hash and the group"
    assert group_key(first, 0) == first
    assert len({group_key(first, g) for g in range(4)}) == 4


@rule("REQ-733")
def test_a_hybrid_manager_serves_one_token_blocks_whose_tokens_are_group_indices() -> None:
    # with one-token blocks, tokens 0, 1, 2 give the hashes hash_block(h, [1]) that a group key
    # formed that way would repeat; every request must still be admitted and cached as its own
    manager = RequestManager(
        OracleBlockPool(64), block_size=1, max_model_len=64, groups=(FULL_ATTENTION, CacheGroup.window(2))
    )
    for n, tokens in enumerate(([0, 1, 2], [0, 1, 2], [0, 1, 2, 1])):
        req = Request(f"r{n}", tokens, block_size=1)
        blocks, hit = manager.get_computed_blocks(req)
        assert manager.allocate_slots(req, len(tokens) - hit, hit, blocks) is not None
        req.num_computed_tokens = hit  # admitted with its hit, as a scheduler does
        manager.check_invariants()


@rule("REQ-724")
def test_a_full_sequence_admission_reserves_at_most_a_window_and_the_tokens_in_flight() -> None:
    def admitted(**kwargs: Any) -> bool:
        manager = RequestManager(
            OracleBlockPool(7), block_size=4, max_model_len=64, groups=(CacheGroup.window(4),), **kwargs
        )
        req = Request("long", list(range(40)), block_size=4)  # 10 blocks; 6 usable
        blocks, hit = manager.get_computed_blocks(req)
        return manager.allocate_slots(req, 8, hit, blocks, full_sequence_must_fit=True) is not None

    # 8 tokens in flight: the window's 3 tokens and 8 more span ceil(11 / 4) + 1 = 4 blocks at most
    assert admitted(max_in_flight_tokens=8)
    # 60 in flight: min(3 + 60, 64) tokens, 17 blocks, cap nothing: all 10 blocks must fit
    assert not admitted(max_in_flight_tokens=60)
    assert not admitted()  # max_model_len in flight, as vLLM's KVCacheManager defaults


@rule("REQ-724")
def test_a_manager_refuses_no_tokens_in_flight() -> None:
    with pytest.raises(ConfigError, match="REQ-724"):
        RequestManager(OracleBlockPool(7), block_size=4, max_model_len=64, max_in_flight_tokens=0)
