"""The manager at its bounds: what it caches under draft tokens and max_model_len, the full-sequence
gate for a running request, statistics of a preempted request at lookup, and the views it gives
with caching off or over a pool that offers only the protocol (REQ-708..REQ-710, REQ-716, REQ-717,
REQ-720, REQ-721, REQ-724).
"""

from __future__ import annotations

from typing import Any

import pytest

from kvref.contract.errors import ConfigError
from kvref.contract.requests import Request
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager

rule = pytest.mark.rule


def registered(m: RequestManager, rid: str) -> int:
    """How many blocks of ``rid``'s table are registered under a hash."""
    return sum(1 for b in m.get_block_ids(rid)[0] if m.pool.block_hash(b) is not None)


@rule("REQ-710")
def test_draft_tokens_are_never_cached_even_when_the_request_lists_them() -> None:
    m = RequestManager(OracleBlockPool(16), block_size=4, max_model_len=64)
    req = Request("a", list(range(12)), block_size=4)  # the last 4 tokens are drafts
    assert m.allocate_slots(req, 12, num_draft_tokens=4) is not None
    assert registered(m, "a") == 2, f"[REQ-710] 12 tokens of which 4 are drafts cached {registered(m, 'a')} blocks"


@rule("REQ-710", "REQ-720")
def test_a_request_longer_than_max_model_len_caches_only_the_blocks_it_may_hold() -> None:
    m = RequestManager(OracleBlockPool(16), block_size=4, max_model_len=10)
    req = Request("a", list(range(12)), block_size=4)
    got = m.allocate_slots(req, 12)
    assert got is not None and len(got.blocks[0]) == 3, f"[REQ-720] max_model_len 10 in blocks of 4 gave {got}"
    assert registered(m, "a") == 2, (
        f"[REQ-710] {registered(m, 'a')} blocks cached: the third holds tokens 8 and 9 only, never 10 and 11"
    )
    m.check_invariants()


@rule("REQ-710")
def test_new_tokens_beyond_the_requests_own_cache_only_its_full_blocks() -> None:
    m = RequestManager(OracleBlockPool(16), block_size=4, max_model_len=64)
    req = Request("a", list(range(6)), block_size=4)
    got = m.allocate_slots(req, 10)  # room for 10 tokens; the request has 6
    assert got is not None and len(got.blocks[0]) == 3 and registered(m, "a") == 1, (got, registered(m, "a"))
    m.check_invariants()


@rule("REQ-720", "REQ-721")
def test_a_table_of_max_model_len_tokens_not_a_whole_number_of_blocks_is_within_bounds() -> None:
    m = RequestManager(OracleBlockPool(16), block_size=4, max_model_len=10)
    req = Request("a", list(range(10)), block_size=4)
    got = m.allocate_slots(req, 10)
    assert got is not None and len(got.blocks[0]) == 3, f"[REQ-720] 10 tokens of 4 need 3 blocks, got {got}"
    req.num_computed_tokens = 10
    m.check_invariants()  # 3 blocks for max_model_len 10: not more than it may hold


@rule("REQ-724")
def test_the_full_sequence_gate_counts_the_blocks_a_running_request_holds_already() -> None:
    m = RequestManager(OracleBlockPool(6), block_size=4, max_model_len=64)  # 5 usable blocks
    req = Request("a", list(range(16)), block_size=4)
    assert m.allocate_slots(req, 8, full_sequence_must_fit=True) is not None  # a chunk: 2 blocks
    req.num_computed_tokens = 8
    assert m.allocate_slots(Request("b", list(range(4)), block_size=4), 4) is not None  # 1 block: 2 left
    assert m.pool.num_available == 2
    got = m.allocate_slots(req, 4, full_sequence_must_fit=True)
    assert got is not None and len(got.blocks[0]) == 1, (
        f"[REQ-724] the gate asked 'a' (16 tokens, holding 2 of its 4 blocks) for more than the 2 it lacks: {got}"
    )


@rule("REQ-716")
def test_at_lookup_a_request_preempted_once_is_counted_as_preempted() -> None:
    m = RequestManager(OracleBlockPool(16), block_size=4, max_model_len=64, stats_at="lookup", log_stats=True)
    req = Request("a", list(range(9)), block_size=4)
    m.get_computed_blocks(req)
    assert m.allocate_slots(req, 9) is not None
    m.preempt(req)
    assert req.num_preemptions == 1
    m.get_computed_blocks(req)
    stats = m.make_prefix_cache_stats()
    assert stats is not None and (stats.requests, stats.preempted_requests, stats.preempted_hits) == (1, 1, 8), stats


class ProtocolOnly:
    """A pool seen only through the protocol: no ``snapshot`` and no ``events_enabled``, as a peer's may be."""

    def __init__(self, pool: OracleBlockPool) -> None:
        self._pool = pool

    def __getattr__(self, name: str) -> Any:
        if name in ("snapshot", "events_enabled"):
            raise AttributeError(name)
        return getattr(self._pool, name)


def _pool_with_a_cached_block() -> tuple[OracleBlockPool, int]:
    pool = OracleBlockPool(8, enable_events=True)
    (block,) = pool.allocate(1, holder="earlier")
    pool.register([block], [777])
    pool.free([block], holder="earlier")
    return pool, block


@rule("REQ-717")
def test_events_over_a_pool_that_does_not_say_whether_it_records_them_are_taken_on_trust() -> None:
    pool, _ = _pool_with_a_cached_block()
    m = RequestManager(ProtocolOnly(pool), block_size=4, max_model_len=64, enable_kv_cache_events=True)
    assert m.enable_kv_cache_events
    silent = OracleBlockPool(8)
    with pytest.raises(ConfigError) as raised:
        RequestManager(silent, block_size=4, max_model_len=64, enable_kv_cache_events=True)
    assert raised.value.rule == "REQ-717", raised.value


@rule("REQ-704", "REQ-721")
def test_with_caching_off_the_manager_shows_no_hash_even_over_a_pool_that_has_cached_blocks() -> None:
    pool, block = _pool_with_a_cached_block()
    assert pool.block_hash(block) == 777
    m = RequestManager(ProtocolOnly(pool), block_size=4, max_model_len=64, enable_caching=False)
    assert m.block_hash(block) is None, f"[REQ-704] caching is off, yet block {block} shows a hash"
    view = m.snapshot()
    hashes = [h for _, h in view["pools"][0]] if "pools" in view else None
    assert hashes == [None] * 8, f"a manager without caching shows hashes in its snapshot: {view}"


@rule("REQ-724", "REQ-734")
def test_the_full_sequence_gate_adds_up_whole_blocks_in_every_group() -> None:
    from kvref.contract.manager import FULL_ATTENTION, CacheGroup

    groups = (FULL_ATTENTION, CacheGroup.window(8))
    m = RequestManager(OracleBlockPool(4), block_size=4, max_model_len=64, groups=groups)  # 3 usable blocks
    req = Request("a", list(range(6)), block_size=4)
    before = m.snapshot()
    got = m.allocate_slots(req, 4, full_sequence_must_fit=True)
    assert got is None and m.snapshot() == before, (
        f"[REQ-724] 6 tokens need 2 whole blocks in each of 2 groups, 4 > 3 available, yet allocate_slots gave {got}"
    )


@rule("REQ-710", "REQ-730")
def test_the_cached_count_of_each_group_is_what_it_registered() -> None:
    from kvref.contract.manager import FULL_ATTENTION, CacheGroup

    m = RequestManager(
        OracleBlockPool(24), block_size=4, max_model_len=64, groups=(FULL_ATTENTION, CacheGroup.window(8))
    )
    req = Request("a", list(range(10)), block_size=4)
    assert m.allocate_slots(req, 10) is not None
    counts = (m.num_cached_blocks("a"), m.num_cached_blocks("a", 0), m.num_cached_blocks("a", 1))
    assert counts == (2, 2, 2), f"[REQ-710] 10 tokens fill 2 blocks in each group; cached counts {counts}"
    assert m.num_cached_blocks("nobody") == 0 and m.num_cached_blocks("nobody", 1) == 0
    m.groups[1].num_cached["a"] = 1  # the window's own count, apart from full attention's
    assert (m.num_cached_blocks("a"), m.num_cached_blocks("a", 1)) == (2, 1), "the default group is 0, full attention"
