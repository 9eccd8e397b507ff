"""Chapter 01, block pool: allocation, release, sharing, generations, paused holders, batches."""

from __future__ import annotations

from typing import Any

import pytest

from kvref.contract.errors import (
    BlockIdError,
    BlockStateError,
    InvalidValueError,
    NotHeldError,
    OutOfBlocksError,
    PausedHolderError,
    ReservedBlockError,
    StaleBlockError,
)
from kvref.contract.protocol import BlockState
from kvref_conformance.observe import observe
from kvref_conformance.suites.base import (
    LEAF_POLICIES,
    ConformanceSuite,
    cache_chain,
    corner,
    fails_unchanged,
    requires,
    rule,
)
from kvref_conformance.target import Target

__all__ = ["PoolSuite", "counts"]


def counts(pool: Any) -> tuple[int, int, int, frozenset[int]]:
    """What two pools of one implementation share after the same operations, ids aside."""
    return pool.num_free, pool.num_in_use, pool.num_cached, frozenset(pool.resident_hashes())


class PoolSuite(ConformanceSuite):
    """Rules of chapter 01 (block pool), for any implementation."""

    @rule("POOL-101")
    @pytest.mark.parametrize(
        ("num_blocks", "reserved"),
        [(-1, (0,)), (1, (0,)), (0, ()), (4, (4,)), (4, (-1,)), (4, (1, 1)), (2, (0, 1))],
    )
    def test_creating_a_pool_with_impossible_sizes_raises(
        self, impl: Target, num_blocks: int, reserved: tuple[int, ...]
    ) -> None:
        with pytest.raises(InvalidValueError) as info:
            self.pool(impl, num_blocks, reserved_ids=reserved)
        assert info.value.rule in ("POOL-101", "ERR-504"), f"wrong rule cited: {info.value}"

    @rule("POOL-101", "POOL-102")
    def test_a_pool_may_reserve_any_ids_and_never_hands_them_out(self, impl: Target) -> None:
        pool = self.pool(impl, 6, reserved_ids=(5, 2))
        ids = pool.allocate(4)
        assert sorted(ids) == [0, 1, 3, 4], f"allocate handed out {ids}; reserved 2 and 5 must never appear"
        assert pool.block_state(5) is BlockState.RESERVED

    @rule("POOL-102")
    def test_the_null_block_is_never_handed_out_even_when_everything_else_is_taken(self, impl: Target) -> None:
        pool = self.pool(impl)
        ids = pool.allocate(7)
        assert 0 not in ids, f"allocate(7) returned the reserved block 0: {ids}"
        fails_unchanged(pool, lambda: pool.allocate(1), OutOfBlocksError, "POOL-105")

    @rule("POOL-118")
    @pytest.mark.parametrize("op", ["free", "acquire"])
    def test_passing_the_reserved_block_raises_reserved_block_error(self, impl: Target, op: str) -> None:
        pool = self.pool(impl)
        pool.allocate(2)
        fails_unchanged(pool, lambda: getattr(pool, op)([0]), ReservedBlockError, "POOL-118")

    @rule("POOL-103")
    @pytest.mark.parametrize("bad", [-1, 8, 10**12])
    @pytest.mark.parametrize("op", ["free", "acquire"])
    def test_ids_out_of_range_raise_block_id_error_and_negative_ids_never_wrap(
        self, impl: Target, op: str, bad: int
    ) -> None:
        pool = self.pool(impl)
        pool.allocate(7)
        fails_unchanged(pool, lambda: getattr(pool, op)([bad]), BlockIdError, "POOL-103")

    @rule("POOL-103")
    @pytest.mark.parametrize("query", ["ref_count", "holders", "generation", "block_state", "block_hash"])
    def test_per_block_queries_check_the_range_too(self, impl: Target, query: str) -> None:
        pool = self.pool(impl)
        if query == "block_hash" and not impl.has("prefix-cache"):
            pytest.skip("block_hash belongs to the prefix cache")
        with pytest.raises(BlockIdError):
            getattr(pool, query)(8)
        with pytest.raises(BlockIdError):
            getattr(pool, query)(-1)

    @rule("POOL-104")
    def test_allocate_returns_distinct_blocks_each_with_one_reference_for_the_holder(self, impl: Target) -> None:
        pool = self.pool(impl)
        ids = pool.allocate(5, holder="r1")
        assert len(ids) == 5 and len(set(ids)) == 5, f"allocate(5) returned {ids}; expected 5 distinct ids"
        for b in ids:
            assert pool.ref_count(b) == 1, f"block {b} has {pool.ref_count(b)} references after allocate"
            assert pool.holders(b) == {"r1": 1}, f"block {b} holders {pool.holders(b)}, expected r1 once"
            assert pool.block_state(b) is BlockState.IN_USE
        assert pool.num_in_use == 5 and pool.num_free == 2

    @rule("POOL-104")
    def test_allocate_zero_returns_nothing_and_changes_nothing(self, impl: Target) -> None:
        pool = self.pool(impl)
        before = observe(pool)
        assert pool.allocate(0) == []
        assert observe(pool) == before

    @rule("POOL-105")
    @pytest.mark.parametrize("count", [8, 9, 10**9])
    def test_allocate_is_all_or_nothing_when_the_pool_is_short(self, impl: Target, count: int) -> None:
        pool = self.pool(impl)
        fails_unchanged(pool, lambda: pool.allocate(count), OutOfBlocksError, "POOL-105")

    @rule("POOL-105", "EVICT-408")
    @requires("prefix-cache", "events")
    def test_a_short_allocate_evicts_nothing_and_emits_no_event(self, impl: Target) -> None:
        pool = self.pool(impl)
        cache_chain(pool, [1, 2, 3])
        pool.take_events()
        fails_unchanged(pool, lambda: pool.allocate(8), OutOfBlocksError, "POOL-105")
        assert pool.resident_hashes() == {1, 2, 3}
        assert pool.take_events() == []

    @rule("POOL-106")
    @requires("prefix-cache")
    @pytest.mark.parametrize("policy", ["lru", "lru-leaf", "ref-zero", "fifo", "lru-leaf-access"])
    def test_num_available_is_exactly_the_largest_allocation_that_succeeds(self, impl: Target, policy: str) -> None:
        pool = self.pool(impl, 10, policy=policy)
        head = pool.allocate(4, holder="w")
        pool.register(head, [1, 2, 3, 4])
        pool.free(head[:1:-1], holder="w")  # 4 then 3 become cached (dropped under ref-zero)
        below = pool.allocate(2, holder="x")
        pool.register(below, [5, 6], parent_hash=2)  # 5, 6 are held below 1 and 2
        pool.free([head[1], head[0]], holder="w")  # 1, 2 cached; under lru-leaf they must stay
        available = pool.num_available
        if policy in LEAF_POLICIES:
            assert available == 3 + 2, f"{policy}: 3 free + the leaves 3, 4 evictable, got {available}"
        with pytest.raises(OutOfBlocksError):
            pool.allocate(available + 1)
        got = pool.allocate(available)
        assert len(got) == available
        self.check(pool)

    @rule("POOL-106")
    @requires("prefix-cache")
    @pytest.mark.parametrize("policy", LEAF_POLICIES)
    def test_under_lru_leaf_an_ancestor_of_a_held_block_is_not_available(self, impl: Target, policy: str) -> None:
        pool = self.pool(impl, 5, policy=policy)
        ids = pool.allocate(3, holder="a")
        pool.register(ids, [1, 2, 3])
        pool.free([ids[1], ids[0]], holder="a")  # 1 and 2 cached, 3 still held below them
        assert pool.num_cached == 2 and pool.num_available == 1, (
            f"num_available {pool.num_available}: hashes 1 and 2 (cached) are ancestors of the held 3 and cannot be "
            "evicted without breaking prefix closure; only the one free block is available"
        )

    @rule("POOL-107")
    @corner  # no dependent frees an id twice in one call
    def test_free_drops_one_reference_per_occurrence_including_duplicates_in_one_call(self, impl: Target) -> None:
        pool = self.pool(impl)
        [b] = pool.allocate(1, holder="r")
        pool.acquire([b, b], holder="r")
        assert pool.ref_count(b) == 3
        pool.free([b, b], holder="r")
        assert pool.ref_count(b) == 1, f"free([b, b]) left {pool.ref_count(b)} references, expected 3 - 2 = 1"
        pool.free([b], holder="r")
        assert pool.block_state(b) is BlockState.FREE
        self.check(pool)

    @rule("POOL-107", "STATE-002")
    def test_two_holders_sharing_a_block_release_independently(self, impl: Target) -> None:
        pool = self.pool(impl)
        [b] = pool.allocate(1, holder="a")
        pool.acquire([b], holder="b")
        pool.free([b], holder="a")
        assert pool.holders(b) == {"b": 1}, f"after a's free the holders are {pool.holders(b)}, expected b only"
        assert pool.block_state(b) is BlockState.IN_USE

    @rule("POOL-108")
    def test_freeing_a_block_held_only_by_another_holder_raises_not_held(self, impl: Target) -> None:
        pool = self.pool(impl)
        [b] = pool.allocate(1, holder="owner")
        fails_unchanged(pool, lambda: pool.free([b], holder="intruder"), NotHeldError, "POOL-108")

    @rule("POOL-108")
    def test_a_holder_that_released_a_shared_block_cannot_release_it_again(self, impl: Target) -> None:
        pool = self.pool(impl)
        [b] = pool.allocate(1, holder="a")
        pool.acquire([b], holder="c")
        pool.free([b], holder="a")
        fails_unchanged(pool, lambda: pool.free([b], holder="a"), NotHeldError, "POOL-108")
        assert pool.holders(b) == {"c": 1} and pool.block_state(b) is BlockState.IN_USE, (
            f"after a released its reference twice, block {b} has holders {pool.holders(b)}: c's must stay"
        )

    @rule("POOL-108")
    def test_double_free_is_refused_so_the_block_is_never_handed_out_twice(self, impl: Target) -> None:
        pool = self.pool(impl)
        [b] = pool.allocate(1)
        pool.free([b])
        fails_unchanged(pool, lambda: pool.free([b]), NotHeldError, "POOL-108")
        ids = pool.allocate(7)
        assert ids.count(b) == 1, f"block {b} handed out {ids.count(b)} times in {ids}"

    @rule("POOL-108")
    @requires("prefix-cache")
    def test_freeing_a_cached_block_raises_not_held(self, impl: Target) -> None:
        pool = self.pool(impl)
        [b] = cache_chain(pool, [42])
        fails_unchanged(pool, lambda: pool.free([b]), NotHeldError, "POOL-108")

    @rule("POOL-109")
    def test_freeing_more_occurrences_than_references_held_drops_nothing(self, impl: Target) -> None:
        pool = self.pool(impl)
        a, b = pool.allocate(2, holder="r")
        fails_unchanged(pool, lambda: pool.free([a, b, b], holder="r"), NotHeldError, "POOL-109")
        assert pool.ref_count(a) == 1, "the valid part of a refused free must not be applied"

    @rule("POOL-110")
    @requires("prefix-cache")
    def test_acquire_shares_an_in_use_block_and_pins_a_cached_one(self, impl: Target) -> None:
        pool = self.pool(impl)
        [live] = pool.allocate(1, holder="a")
        pool.acquire([live], holder="b")
        assert pool.holders(live) == {"a": 1, "b": 1}
        [cached] = cache_chain(pool, [9])
        pool.acquire([cached], holder="c")
        assert pool.block_state(cached) is BlockState.IN_USE
        assert pool.num_cached == 0

    @rule("POOL-123")
    def test_a_returned_list_is_the_callers_own(self, impl: Target) -> None:
        pool = self.pool(impl, 16)
        first = pool.allocate(2, holder="a")
        kept = [int(b) for b in first]
        pool.free(kept[1:], holder="a")  # the request drops its tail block
        pool.allocate(1, holder="z")
        assert [int(b) for b in first] == kept, (
            f"[POOL-123] allocate(2) returned {kept}; after freeing its last block and allocate(1) that list reads "
            f"{[int(b) for b in first]}: it is a view of the pool's state, not the caller's own"
        )
        pool.free(kept[:1], holder="a")
        again = pool.allocate(3, holder="b")
        taken = [int(b) for b in again]
        if isinstance(again, list):  # the caller writes into its list: the pool must not see it
            again[0] = taken[1]
        more = [int(b) for b in pool.allocate(4, holder="c")]
        assert not set(more) & set(taken), f"[POOL-123] after a write into {taken}, allocate(4) handed out {more}"
        if impl.has("prefix-cache"):
            chain = cache_chain(pool, [11, 12], holder="d")
            hit = pool.match([11, 12], holder="e")
            seen = [int(b) for b in hit]
            pool.free(seen[::-1], holder="e")
            pool.match([11], holder="f")
            assert [int(b) for b in hit] == seen == chain, (
                f"[POOL-123] match returned {seen}; after a free and another match that list reads "
                f"{[int(b) for b in hit]}"
            )

    @rule("POOL-119")
    def test_acquiring_a_free_block_raises_block_state_error(self, impl: Target) -> None:
        pool = self.pool(impl)
        fails_unchanged(pool, lambda: pool.acquire([3]), BlockStateError, "POOL-119")

    @rule("POOL-111")
    @requires("prefix-cache")
    def test_the_generation_counts_allocations_only(self, impl: Target) -> None:
        pool = self.pool(impl)
        [b] = pool.allocate(1)
        assert pool.generation(b) == 1
        pool.acquire([b], holder="x")
        pool.free([b], holder="x")
        pool.register([b], [77])
        pool.free([b])
        pool.match([77], holder="y")
        assert pool.generation(b) == 1, "acquire, free, register and match must not change the generation"
        pool.free([b], holder="y")
        pool.reset()
        assert pool.generation(b) == 1, "reset must not change the generation"
        again = pool.allocate(7)
        assert b in again and pool.generation(b) == 2, f"reallocating block {b} must bump its generation to 2"

    @rule("POOL-112")
    def test_a_stale_reference_is_detected_after_the_block_was_handed_out_again(self, impl: Target) -> None:
        pool = self.pool(impl)
        [b] = pool.allocate(1, holder="old")
        stale = pool.generation(b)
        pool.free([b], holder="old")
        again = pool.allocate(pool.num_free, holder="old")  # every free block, so b among them
        assert b in again, f"allocate of every free block did not return the freed block {b}"
        pool.free([x for x in again if x != b], holder="old")
        fails_unchanged(pool, lambda: pool.free([b], holder="old", generations=[stale]), StaleBlockError, "POOL-112")
        fails_unchanged(pool, lambda: pool.acquire([b], holder="new", generations=[stale]), StaleBlockError, "POOL-112")
        pool.free([b], holder="old", generations=[pool.generation(b)])

    @rule("POOL-113", "POOL-120")
    @requires("pause")
    def test_paused_holders_count_against_a_soft_limit_that_never_fails_a_call(self, impl: Target) -> None:
        pool = self.pool(impl, 10, paused_limit=2)
        a = pool.allocate(3, holder="a")
        pool.allocate(2, holder="b")
        pool.pause("a")
        assert pool.paused_used == 3 and pool.paused_excess == 1
        pool.allocate(4, holder="b")  # over the paused limit, the active side still allocates
        pool.free(a[:2], holder="a")  # a paused holder may give blocks back
        assert pool.paused_used == 1 and pool.paused_excess == 0
        pool.resume("a")
        assert pool.paused_used == 0

    @rule("POOL-114")
    @pytest.mark.parametrize(
        "op",
        [
            pytest.param("allocate", marks=requires("pause")),
            pytest.param("acquire", marks=requires("pause")),
            pytest.param("match", marks=requires("pause", "prefix-cache")),
            pytest.param("allocate_many", marks=requires("pause", "batching")),
            pytest.param("match_many", marks=requires("pause", "batching", "prefix-cache")),
        ],
    )
    def test_a_paused_holder_obtains_no_new_reference(self, impl: Target, op: str) -> None:
        pool = self.pool(impl, 10)
        ids = pool.allocate(2, holder="p")
        if impl.has("prefix-cache"):
            pool.register(ids, [1, 2])
        pool.pause("p")
        calls = {
            "allocate": lambda: pool.allocate(1, holder="p"),
            "acquire": lambda: pool.acquire(ids[:1], holder="p"),
            "match": lambda: pool.match([1], holder="p"),
            "allocate_many": lambda: pool.allocate_many([1, 1], holders=["q", "p"]),
            "match_many": lambda: pool.match_many([[1], [1]], holders=["q", "p"]),
        }
        fails_unchanged(pool, calls[op], PausedHolderError, "POOL-114")

    @rule("POOL-114")
    @requires("pause")
    def test_an_empty_call_by_a_paused_holder_is_no_request_and_succeeds(self, impl: Target) -> None:
        pool = self.pool(impl)
        pool.pause("p")
        assert pool.allocate(0, holder="p") == []
        pool.acquire([], holder="p")

    @rule("POOL-121")
    @requires("pause")
    def test_pausing_twice_or_resuming_an_active_holder_raises(self, impl: Target) -> None:
        pool = self.pool(impl)
        pool.pause("h")
        fails_unchanged(pool, lambda: pool.pause("h"), PausedHolderError, "POOL-121")
        pool.resume("h")
        fails_unchanged(pool, lambda: pool.resume("h"), PausedHolderError, "POOL-121")

    @rule("POOL-115")
    def test_which_ids_allocate_returns_is_the_implementations_choice_but_always_usable(self, impl: Target) -> None:
        pool = self.pool(impl)
        ids = pool.allocate(7)
        assert sorted(ids) == list(range(1, 8)), f"allocate(7) on 8 blocks with 0 reserved gave {ids}"

    def admits_as_one_by_one(self, batched: Any, single: Any, sizes: list[int], holders: list[str]) -> None:
        """``allocate_many`` on ``batched`` admits what allocating the entries one by one on ``single``
        (in the same state) admits, up to the first that does not fit, and leaves the same counts (POOL-116)."""
        got = batched.allocate_many(sizes, holders=holders)
        want = []
        for count, holder in zip(sizes, holders, strict=True):
            try:
                want.append(single.allocate(count, holder=holder))
            except OutOfBlocksError:
                break
        assert [len(g) for g in got] == [len(w) for w in want], f"batched {got} vs one by one {want}"
        for p in (batched, single):
            self.check(p)
        assert counts(batched) == counts(single), f"{counts(batched)} != {counts(single)}"

    @rule("POOL-116")
    @requires("batching")
    def test_allocate_many_admits_the_longest_prefix_that_fits_and_stops_there(self, impl: Target) -> None:
        pool = self.pool(impl, 11)
        got = pool.allocate_many([3, 4, 5, 1], holders=["a", "b", "c", "d"])
        assert [len(x) for x in got] == [3, 4], (
            f"admitted sizes {[len(x) for x in got]}; 3 + 4 fit in 10, 5 does not, and d must not jump the queue"
        )
        assert pool.num_free == 3
        assert all(pool.holders(b) == {"a": 1} for b in got[0])

    @rule("POOL-116")
    @requires("batching", "prefix-cache")
    def test_allocate_many_matches_sequential_allocation_with_eviction(self, impl: Target) -> None:
        batched, single = self.pool(impl, 8), self.pool(impl, 8)
        for p in (batched, single):
            cache_chain(p, [1, 2, 3, 4])
        self.admits_as_one_by_one(batched, single, [2, 3, 4], ["a", "b", "c"])

    @rule("POOL-116", "EVICT-404")
    @requires("batching", "prefix-cache")
    @pytest.mark.parametrize("policy", ["lru", "lru-leaf", "lru-leaf-access", "fifo", "ref-zero"])
    def test_allocate_many_matches_sequential_allocation_when_held_blocks_have_cached_ancestors(
        self, impl: Target, policy: str
    ) -> None:
        batched, single = self.pool(impl, 10, policy=policy), self.pool(impl, 10, policy=policy)
        for p in (batched, single):
            held = p.allocate(3, holder="h")
            p.register(held, [1, 2, 3])
            p.free(held[1::-1], holder="h")  # 2 then 1 cached, 3 still held below them
            cache_chain(p, [11, 12])
        self.admits_as_one_by_one(batched, single, [3, 2, 2, 2], ["a", "b", "c", "d"])
        if policy in LEAF_POLICIES:
            assert {1, 2} <= batched.resident_hashes(), "an ancestor of a held block was evicted (EVICT-404)"

    @rule("POOL-117")
    @requires("batching")
    def test_free_many_counts_duplicates_across_entries_of_one_holder(self, impl: Target) -> None:
        pool = self.pool(impl, 8)
        [b] = pool.allocate(1, holder="r")
        fails_unchanged(pool, lambda: pool.free_many([[b], [b]], holders=["r", "r"]), NotHeldError, "POOL-109")

    @rule("POOL-117")
    @requires("batching")
    def test_free_many_is_atomic_when_a_later_entry_is_bad(self, impl: Target) -> None:
        pool = self.pool(impl, 8)
        a = pool.allocate(2, holder="a")
        b = pool.allocate(2, holder="b")
        fails_unchanged(pool, lambda: pool.free_many([a, b], holders=["a", "a"]), NotHeldError, "POOL-108")
        pool.free_many([a, b[::-1]], holders=["a", "b"])
        assert pool.num_free == 7

    @rule("POOL-117")
    @requires("batching")
    def test_free_many_of_two_holders_sharing_a_block_drops_both_references(self, impl: Target) -> None:
        pool = self.pool(impl, 8)
        [b] = pool.allocate(1, holder="a")
        pool.acquire([b], holder="b")
        pool.free_many([[b], [b]], holders=["a", "b"])
        assert pool.ref_count(b) == 0, "a batched scatter that decrements once per id would leak a reference here"
        self.check(pool)
