"""The oracle manager's own checks: check_invariants sees a corrupted table (REQ-710, REQ-721, REQ-730),
and calls it must refuse are refused, changing nothing (REQ-711, REQ-712, REQ-718)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvref.contract.errors import InvalidValueError, InvariantViolation
from kvref.contract.manager import FULL_ATTENTION, NULL_BLOCK, CacheGroup, KVCacheBlocks
from kvref.contract.requests import Request
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager

HYBRID = (FULL_ATTENTION, CacheGroup.window(8))


def admitted(tokens: int = 10, blocks: int = 24) -> tuple[RequestManager, Request]:
    m = RequestManager(OracleBlockPool(blocks), block_size=4, max_model_len=64, groups=HYBRID)
    req = Request("a", list(range(tokens)), block_size=4)
    assert m.allocate_slots(req, tokens) is not None
    req.num_computed_tokens = tokens
    return m, req


def corrupted(change: Callable[[RequestManager], object], rule: str, says: str | None = None) -> None:
    """Corrupt an admitted request's state with ``change``: check_invariants must raise under ``rule``
    (with exactly the message ``says``, when given)."""
    m, _ = admitted()
    m.check_invariants()
    change(m)
    with pytest.raises(InvariantViolation) as info:
        m.check_invariants()
    assert info.value.rule == rule, f"check_invariants named {info.value.rule} ({info.value}), expected {rule}"
    assert says is None or str(info.value) == f"[{rule}] {says}", f"check_invariants said {info.value}; expected {says}"


@pytest.mark.rule("REQ-721")
def test_a_table_naming_a_block_the_pool_does_not_give_it_is_seen() -> None:
    corrupted(lambda m: m.groups[0].tables["a"].append(20), "REQ-721")


@pytest.mark.rule("REQ-730")
def test_a_null_block_inside_the_window_is_seen() -> None:
    def punch(m: RequestManager) -> None:
        table = m.groups[1].tables["a"]
        m.pool.free([table[0]], holder="a")
        table[0] = NULL_BLOCK  # 10 computed tokens leave no block behind a window of 8

    corrupted(
        punch,
        "REQ-730",
        "request 'a', group 1: 1 null blocks in [0, 5, 6], but 10 computed tokens leave "
        "only 0 blocks behind the window",
    )


@pytest.mark.rule("REQ-721")
def test_a_holder_the_manager_does_not_know_is_seen_with_its_references() -> None:
    corrupted(
        lambda m: m.pool.allocate(2, holder="ghost"),
        "REQ-721",
        "request 'ghost' holds 2 references in the pool, its tables 0 blocks",
    )


@pytest.mark.rule("REQ-721")
def test_a_block_the_pool_says_a_request_holds_twice_is_seen_with_the_count() -> None:
    def twice(m: RequestManager) -> None:
        m.pool.acquire([m.groups[0].tables["a"][1]], holder="a")

    corrupted(twice, "REQ-721", "request 'a', group 0: its table has block 2, which the pool says it holds 2 times")


@pytest.mark.rule("REQ-710")
def test_a_cached_count_beyond_the_full_blocks_is_seen() -> None:
    corrupted(lambda m: m.groups[0].num_cached.__setitem__("a", 3), "REQ-710")


@pytest.mark.rule("REQ-710")
def test_a_registered_partial_block_is_seen() -> None:
    def register_tail(m: RequestManager) -> None:
        table = m.groups[0].tables["a"]
        m.pool.register([table[2]], [12345], parent_hash=m.pool.block_hash(table[1]))

    corrupted(register_tail, "REQ-710")


@pytest.mark.rule("REQ-712")
def test_a_null_block_right_of_a_window_run_is_not_a_hit() -> None:
    m, _ = admitted(9)
    b = Request("b", list(range(9)), block_size=4)
    hits, computed = m.get_computed_blocks(b)
    full, window = hits.blocks
    for forged in ((full, (NULL_BLOCK, NULL_BLOCK)), (full, (window[0], NULL_BLOCK))):
        before = m.snapshot()
        with pytest.raises(InvalidValueError) as info:
            m.allocate_slots(b, 1, computed, KVCacheBlocks(forged))
        assert info.value.rule == "REQ-712" and m.snapshot() == before, f"{forged}: {info.value}"


@pytest.mark.rule("REQ-712")
def test_external_tokens_for_a_request_that_holds_blocks_are_refused() -> None:
    m, req = admitted(8)
    before = m.snapshot()
    with pytest.raises(InvalidValueError) as info:
        m.allocate_slots(req, 4, num_external_computed_tokens=20)
    assert info.value.rule == "REQ-712" and m.snapshot() == before, f"{info.value}"


@pytest.mark.rule("REQ-711")
def test_caching_nothing_for_a_request_that_holds_nothing_is_a_no_op() -> None:
    m, _ = admitted()
    m.cache_blocks(Request("zz", list(range(5)), block_size=4), 0)
    with pytest.raises(InvalidValueError):
        m.cache_blocks(Request("zz", list(range(5)), block_size=4), 4)


@pytest.mark.rule("REQ-718")
def test_null_blocks_are_never_a_common_prefix() -> None:
    m = RequestManager(OracleBlockPool(40), block_size=4, max_model_len=64, groups=HYBRID)
    for rid, base in (("a", 0), ("b", 100)):
        req = Request(rid, [base + i for i in range(16)], block_size=4)
        m.allocate_slots(req, 16)
        req.num_computed_tokens = 16
        req.append_output_token_ids([7])
        m.allocate_slots(req, 1)  # the window's first two blocks become null
    assert m.get_num_common_prefix_blocks(["a", "b"]) == [0, 0], "[REQ-718] null blocks are held by nobody"
