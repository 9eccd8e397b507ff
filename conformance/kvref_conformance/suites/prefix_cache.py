"""Chapter 03, hash prefix cache: registration, lookup, hits, reset, events, statistics."""

from __future__ import annotations

import pytest

from kvref.contract.errors import (
    BlockStateError,
    CacheInUseError,
    HashConflictError,
    UnknownHashError,
)
from kvref.contract.events import AllBlocksCleared, BlockRemoved, BlockStored, PrefixCacheStats, apply_events
from kvref.contract.protocol import BlockState
from kvref_conformance.observe import observe
from kvref_conformance.suites.base import ConformanceSuite, cache_chain, fails_unchanged, requires, rule
from kvref_conformance.suites.pool import counts
from kvref_conformance.target import Target

__all__ = ["PrefixCacheSuite"]

CACHING_POLICIES = ("lru", "lru-leaf", "fifo", "lru-leaf-access")


@requires("prefix-cache")
class PrefixCacheSuite(ConformanceSuite):
    """Rules of chapter 03 (hash prefix cache), for any implementation with a prefix cache."""

    @requires("events")
    @rule("PFX-301")
    def test_register_chains_hashes_after_the_given_parent(self, impl: Target) -> None:
        pool = self.pool(impl)
        a = pool.allocate(2, holder="r")
        pool.register(a, [10, 11])
        b = pool.allocate(1, holder="r")
        pool.register(b, [12], parent_hash=11)
        assert [pool.block_hash(x) for x in a + b] == [10, 11, 12]
        assert pool.lookup([10, 11, 12]) == a + b
        assert pool.take_events() == [BlockStored(10, None), BlockStored(11, 10), BlockStored(12, 11)]

    @rule("PFX-302")
    def test_only_blocks_in_use_can_be_registered(self, impl: Target) -> None:
        pool = self.pool(impl)
        fails_unchanged(pool, lambda: pool.register([3], [1]), BlockStateError, "PFX-302")
        [c] = cache_chain(pool, [5])
        fails_unchanged(pool, lambda: pool.register([c], [6], parent_hash=5), BlockStateError, "PFX-302")

    @rule("PFX-303")
    def test_a_block_carries_at_most_one_hash(self, impl: Target) -> None:
        pool = self.pool(impl)
        [b] = pool.allocate(1)
        pool.register([b], [1])
        fails_unchanged(pool, lambda: pool.register([b], [2], parent_hash=1), HashConflictError, "PFX-303")
        c, d = pool.allocate(2)
        fails_unchanged(pool, lambda: pool.register([c, c], [3, 4]), HashConflictError, "PFX-303")
        del d

    @rule("PFX-304")
    def test_the_parent_of_a_registration_must_be_resident(self, impl: Target) -> None:
        pool = self.pool(impl)
        ids = pool.allocate(2)
        fails_unchanged(pool, lambda: pool.register(ids, [2, 3], parent_hash=1), UnknownHashError, "PFX-304")

    @rule("PFX-305")
    def test_several_blocks_may_share_a_hash_and_the_hash_stays_while_one_remains(self, impl: Target) -> None:
        pool = self.pool(impl)
        a = pool.allocate(1, holder="a")
        b = pool.allocate(1, holder="b")
        pool.register(a, [7])
        pool.register(b, [7])
        assert pool.resident_hashes() == {7}
        pool.free(a, holder="a")
        pool.free(b, holder="b")
        pool.allocate(6)  # evicts exactly one of the two copies (5 free + 1 evicted)
        assert pool.resident_hashes() == {7}, "one copy of hash 7 is still cached"
        assert pool.num_cached == 1

    @rule("PFX-306")
    def test_a_resident_hash_keeps_its_parent(self, impl: Target) -> None:
        pool = self.pool(impl)
        pool.register(pool.allocate(2), [1, 2])
        other = pool.allocate(2)
        pool.register(other[:1], [9])
        fails_unchanged(pool, lambda: pool.register(other[1:], [2], parent_hash=9), HashConflictError, "PFX-306")
        fails_unchanged(pool, lambda: pool.register(other[1:], [9], parent_hash=9), HashConflictError, "PFX-306")

    @rule("PFX-306")
    def test_a_registration_may_not_close_a_loop_through_an_orphaned_child(self, impl: Target) -> None:
        pool = self.pool(impl, 5, policy="lru")  # only lru orphans a child
        a = pool.allocate(2)
        pool.register(a, [1, 2])
        pool.free(a)  # head first: 1 is evicted first, leaving 2 resident under the absent 1
        b = pool.allocate(3)
        assert pool.resident_hashes() == {2}
        fails_unchanged(pool, lambda: pool.register(b[:1], [1], parent_hash=2), HashConflictError, "PFX-306")

    @rule("PFX-307")
    def test_lookup_returns_the_longest_resident_prefix_and_stops_at_the_first_miss(self, impl: Target) -> None:
        pool = self.pool(impl)
        ids = cache_chain(pool, [1, 2, 3])
        assert pool.lookup([1, 2, 3, 4]) == ids
        assert pool.lookup([1, 9, 3]) == ids[:1], "the walk must stop at the first miss"
        assert pool.lookup([2, 3]) == [], "hash 2 is resident with parent 1, not the root"
        assert pool.lookup([2, 3], parent_hash=1) == ids[1:]
        assert pool.lookup([]) == []

    @rule("REQ-701")
    @requires("request-prefix")
    def test_a_request_never_hits_on_its_last_token(self, impl: Target) -> None:
        pool = self.pool(impl, 8)
        ids = cache_chain(pool, [1, 2, 3, 4])
        got = pool.match_request([1, 2, 3, 4], num_tokens=16, block_size=4, holder="r")
        assert got == ids[:3], f"[REQ-701] 16 tokens in blocks of 4: 3 blocks may hit, got {len(got)}"
        pool.free(got[::-1], holder="r")
        assert len(pool.match_request([1, 2, 3, 4], num_tokens=17, block_size=4, holder="s")) == 4
        assert pool.match_request([1], num_tokens=4, block_size=4, holder="t") == []

    @rule("PFX-321")
    def test_lookup_changes_nothing(self, impl: Target) -> None:
        pool = self.pool(impl)
        cache_chain(pool, [1, 2, 3])
        pool.take_events()
        before = observe(pool)
        pool.lookup([1, 2, 3])
        assert observe(pool) == before, "lookup changed the state; it must be a pure query"

    @rule("PFX-321", "EVICT-401")
    def test_a_lookup_does_not_refresh_what_it_finds(self, impl: Target) -> None:
        pool = self.pool(impl, 7)
        old = cache_chain(pool, [1, 2, 3])
        cache_chain(pool, [11, 12, 13])  # released after the first chain
        pool.lookup([1, 2, 3])  # a query: must not make the first chain younger
        pool.allocate(pool.num_free + 1)
        assert pool.block_hash(old[2]) is None and 3 not in pool.resident_hashes(), (
            "[PFX-321] after a lookup of the oldest chain, eviction spared it: the lookup refreshed its recency"
        )

    @rule("PFX-308")
    def test_lookup_returns_some_copy_of_a_shared_hash(self, impl: Target) -> None:
        pool = self.pool(impl)
        a = pool.allocate(1, holder="a")
        b = pool.allocate(1, holder="b")
        pool.register(a, [7])
        pool.register(b, [7])
        assert pool.lookup([7])[0] in a + b

    @rule("PFX-309")
    def test_match_is_lookup_plus_acquire_plus_statistics(self, impl: Target) -> None:
        pool = self.pool(impl)
        ids = cache_chain(pool, [1, 2, 3])
        got = pool.match([1, 2, 5], holder="r")
        assert got == ids[:2]
        assert all(pool.holders(b) == {"r": 1} for b in got)
        assert pool.stats == PrefixCacheStats(requests=1, queries=3, hits=2)

    @rule("PFX-310")
    def test_a_hit_is_pinned_until_released(self, impl: Target) -> None:
        pool = self.pool(impl)
        ids = cache_chain(pool, [1, 2, 3])
        pool.match([1], holder="r")
        pool.allocate(pool.num_available)
        assert pool.block_state(ids[0]) is BlockState.IN_USE and pool.block_hash(ids[0]) == 1
        assert pool.resident_hashes() == {1}, "eviction took a pinned block"

    @rule("PFX-311")
    @pytest.mark.parametrize("policy", CACHING_POLICIES)
    def test_a_released_hashed_block_stays_cached(self, impl: Target, policy: str) -> None:
        pool = self.pool(impl, 8, policy=policy)
        [b] = cache_chain(pool, [1])
        assert pool.block_state(b) is BlockState.CACHED
        assert pool.lookup([1]) == [b]

    @requires("events")
    @rule("PFX-312", "EVICT-410")
    def test_an_evicted_block_comes_back_unhashed_and_unfindable(self, impl: Target) -> None:
        pool = self.pool(impl)
        ids = cache_chain(pool, [1, 2, 3, 4, 5, 6, 7])
        pool.take_events()
        got = pool.allocate(1)
        assert got[0] in ids and pool.block_hash(got[0]) is None
        assert pool.lookup([1, 2, 3, 4, 5, 6, 7]) == ids[:6], "the evicted tail block must not be found"
        assert pool.take_events() == [BlockRemoved(7)]

    @rule("PFX-313")
    def test_reset_is_refused_while_a_block_is_in_use(self, impl: Target) -> None:
        pool = self.pool(impl)
        cache_chain(pool, [1, 2])
        pool.allocate(1)
        fails_unchanged(pool, pool.reset, CacheInUseError, "PFX-313")

    @requires("events")
    @rule("PFX-314", "PFX-319")
    def test_reset_frees_every_cached_block_and_emits_one_all_cleared(self, impl: Target) -> None:
        pool = self.pool(impl)
        ids = cache_chain(pool, [1, 2, 3])
        gens = [pool.generation(b) for b in ids]
        pool.take_events()
        pool.reset()
        assert pool.resident_hashes() == frozenset() and pool.num_free == 7 and pool.num_cached == 0
        assert [pool.generation(b) for b in ids] == gens
        assert pool.take_events() == [AllBlocksCleared()]
        assert pool.stats.resets == 1
        cache_chain(pool, [4])
        pool.reset()
        assert pool.stats.resets == 2, f"[PFX-318] two successful resets counted as {pool.stats.resets}"

    @requires("events")
    @rule("PFX-315")
    def test_events_are_taken_once_in_order_and_absent_when_off(self, impl: Target) -> None:
        quiet = self.pool(impl, 4, enable_events=False)
        cache_chain(quiet, [1])
        assert quiet.take_events() == []
        loud = self.pool(impl, 4, enable_events=True)
        cache_chain(loud, [1, 2])
        assert loud.take_events() == [BlockStored(1, None), BlockStored(2, 1)]
        assert loud.take_events() == []

    @requires("events")
    @rule("PFX-316", "PFX-317")
    @pytest.mark.parametrize("policy", ["lru", "lru-leaf", "ref-zero", "fifo", "lru-leaf-access"])
    def test_replaying_events_reproduces_the_resident_hashes(self, impl: Target, policy: str) -> None:
        pool = self.pool(impl, 6, policy=policy, enable_events=True)
        view: set[int] = set()
        a = pool.allocate(2, holder="a")
        b = pool.allocate(2, holder="b")
        pool.register(a, [1, 2])
        pool.register(b, [1, 2])  # second copies: no event
        view = apply_events(view, pool.take_events())
        assert view == pool.resident_hashes() == {1, 2}
        pool.free(a[::-1], holder="a")
        pool.allocate(3)  # 1 free + evicts copies, never the last copy of a held hash
        view = apply_events(view, pool.take_events())
        assert view == pool.resident_hashes(), f"events give {view}, cache holds {set(pool.resident_hashes())}"

    @requires("events")
    @rule("PFX-317")
    def test_removing_one_of_two_copies_emits_nothing(self, impl: Target) -> None:
        pool = self.pool(impl)
        a = pool.allocate(1, holder="a")
        b = pool.allocate(1, holder="b")
        pool.register(a, [7])
        pool.register(b, [7])
        pool.free(a, holder="a")
        pool.take_events()
        pool.allocate(6)  # 5 free + evicts a's copy
        assert pool.take_events() == [], "a hash with another cached copy is still resident"
        assert 7 in pool.resident_hashes()

    @requires("events")
    @rule("PFX-317")
    def test_registering_a_second_copy_of_a_resident_hash_emits_nothing(self, impl: Target) -> None:
        pool = self.pool(impl)
        a = pool.allocate(1, holder="a")
        b = pool.allocate(1, holder="b")
        pool.register(a, [7])
        pool.take_events()
        pool.register(b, [7])
        assert pool.take_events() == [], "hash 7 was already resident; a second copy stores nothing new"

    @rule("PFX-318")
    def test_statistics_count_match_calls_only(self, impl: Target) -> None:
        pool = self.pool(impl)
        cache_chain(pool, [1, 2, 3])
        pool.lookup([1, 2, 3])
        assert pool.stats.requests == 0 and pool.stats.queries == 0
        pool.match([1, 2, 3, 4], holder="x")
        pool.match([9], holder="y")
        s = pool.stats
        assert (s.requests, s.queries, s.hits) == (2, 5, 3)
        assert s.hit_rate == pytest.approx(3 / 5)

    @rule("PFX-318")
    def test_statistics_count_evictions(self, impl: Target) -> None:
        pool = self.pool(impl)
        cache_chain(pool, [1, 2, 3, 4, 5, 6, 7])
        pool.allocate(3)
        assert pool.stats.evictions == 3

    @rule("PFX-320")
    @requires("batching")
    def test_match_many_equals_match_in_order(self, impl: Target) -> None:
        batched, single = self.pool(impl, 8), self.pool(impl, 8)
        for p in (batched, single):
            cache_chain(p, [1, 2, 3])
        lists = [[1, 2], [1, 2, 3, 4], [5]]
        got = batched.match_many(lists, holders=["a", "b", "c"])
        want = [single.match(hl, holder=h) for hl, h in zip(lists, ["a", "b", "c"], strict=True)]
        assert [len(g) for g in got] == [len(w) for w in want], f"batched {got} vs one by one {want}"
        assert counts(batched) == counts(single)
        assert batched.stats == single.stats
        for g, w in zip(got, want, strict=True):  # a and b hit blocks 1 and 2 in the same call
            for mine, theirs in zip(g, w, strict=True):
                assert batched.holders(mine) == single.holders(theirs), (
                    f"[PFX-320] after match_many({lists}), block {mine} is held by {batched.holders(mine)}; matched "
                    f"one by one it is held by {single.holders(theirs)} (two holders hit it in one call)"
                )
