"""Chapter 04, eviction policies: lru, lru-leaf, ref-zero, fifo, lru-leaf-access."""

from __future__ import annotations

from typing import Any

import pytest

from kvref.contract.errors import InvalidTypeError, InvalidValueError
from kvref.contract.events import BlockRemoved
from kvref.contract.protocol import BlockState
from kvref_conformance.suites.base import LEAF_POLICIES, ConformanceSuite, cache_chain, requires, rule
from kvref_conformance.target import Target

__all__ = ["EvictionSuite"]

POLICIES = ("lru", "lru-leaf", "ref-zero", "fifo", "lru-leaf-access")


def evicted_hashes(pool: Any, count: int) -> list[int]:
    """Allocate ``count`` blocks beyond the free ones and report which hashes left, in order."""
    pool.take_events()
    pool.allocate(pool.num_free + count)
    return [e.block_hash for e in pool.take_events() if isinstance(e, BlockRemoved)]


@requires("prefix-cache")
class EvictionSuite(ConformanceSuite):
    """Rules of chapter 04 (eviction policies), for any implementation with a prefix cache."""

    @rule("EVICT-408")
    @pytest.mark.parametrize("policy", ["lru", "lru-leaf", "fifo", "lru-leaf-access"])
    def test_free_blocks_go_first_and_only_the_shortfall_is_evicted(self, impl: Target, policy: str) -> None:
        pool = self.pool(impl, 10, policy=policy, enable_events=True)
        cache_chain(pool, [1, 2, 3, 4])
        pool.allocate(5)
        assert pool.resident_hashes() == {1, 2, 3, 4}, "allocate evicted while free blocks remained"
        pool.allocate(2)
        assert len(pool.resident_hashes()) == 2, "exactly the shortfall of 2 must be evicted"

    @rule("EVICT-408")
    @pytest.mark.parametrize("policy", ["lru", "lru-leaf", "fifo", "lru-leaf-access"])
    def test_a_block_released_without_a_hash_is_taken_before_any_cached_one(self, impl: Target, policy: str) -> None:
        pool = self.pool(impl, 6, policy=policy)
        cache_chain(pool, [1, 2, 3])
        scratch = pool.allocate(pool.num_free, holder="scratch")  # every block that holds no hash
        pool.free(scratch, holder="scratch")  # free again, released after the cached ones, still with no hash
        pool.allocate(len(scratch))
        assert pool.resident_hashes() == {1, 2, 3}, "allocate evicted cached blocks while blocks with no hash were free"

    @rule("EVICT-409")
    @pytest.mark.parametrize("policy", POLICIES)
    def test_eviction_never_takes_a_block_in_use(self, impl: Target, policy: str) -> None:
        pool = self.pool(impl, 6, policy=policy)
        held = pool.allocate(2, holder="h")
        pool.register(held, [1, 2])
        cache_chain(pool, [3, 4, 5], holder="c")
        got = pool.allocate(pool.num_available)
        assert not set(got) & set(held)
        assert all(pool.block_state(b) is BlockState.IN_USE for b in held)

    @requires("events")
    @rule("EVICT-401", "EVICT-402")
    def test_lru_evicts_by_release_order_so_a_tail_first_release_loses_the_tail_first(self, impl: Target) -> None:
        pool = self.pool(impl, 7, policy="lru", enable_events=True)
        a = pool.allocate(3, holder="a")
        pool.register(a, [1, 2, 3])
        b = pool.allocate(3, holder="b")
        pool.register(b, [11, 12, 13])
        pool.free(a[::-1], holder="a")  # released 3, 2, 1
        pool.free(b[::-1], holder="b")  # then 13, 12, 11
        assert evicted_hashes(pool, 4) == [3, 2, 1, 13]

    @requires("events")
    @rule("EVICT-401")
    def test_lru_refreshes_a_block_that_was_hit_and_released_again(self, impl: Target) -> None:
        pool = self.pool(impl, 4, policy="lru", enable_events=True)
        cache_chain(pool, [1, 2, 3])  # released 3, 2, 1
        pool.free(pool.match([1], holder="x"), holder="x")  # 1 released again: now newest
        assert evicted_hashes(pool, 2) == [3, 2]

    @requires("events")
    @rule("EVICT-403")
    def test_lru_leaf_evicts_leaves_only_even_when_a_parent_is_older(self, impl: Target) -> None:
        pool = self.pool(impl, 6, policy="lru-leaf", enable_events=True)
        ids = pool.allocate(3, holder="a")
        pool.register(ids, [1, 2, 3])
        pool.free(ids, holder="a")  # head first: 1 is the oldest release, but it has a child
        assert evicted_hashes(pool, 1) == [3], "lru-leaf must evict the leaf 3, not the older parent 1"

    @requires("events")
    @rule("EVICT-403")
    def test_lru_leaf_may_evict_a_copy_of_a_hash_with_children(self, impl: Target) -> None:
        pool = self.pool(impl, 6, policy="lru-leaf", enable_events=True)
        a = pool.allocate(2, holder="a")
        pool.register(a, [1, 2])
        [dup] = pool.allocate(1, holder="b")
        pool.register([dup], [1])
        pool.free([dup], holder="b")  # a spare copy of 1: evictable though 1 has a child
        pool.free(a[::-1], holder="a")
        pool.take_events()
        pool.allocate(pool.num_free + 1)
        assert pool.block_state(dup) is BlockState.IN_USE and pool.block_hash(dup) is None
        assert pool.take_events() == [], "evicting a spare copy removes no hash"
        assert pool.resident_hashes() == {1, 2}

    @requires("events")
    @rule("EVICT-403")
    @pytest.mark.parametrize("k", range(1, 9))
    def test_lru_leaf_evicting_k_blocks_in_one_call_equals_k_calls_of_one(self, impl: Target, k: int) -> None:
        """A forest with a spare copy in its middle, released head first: the order is pinned by hand."""
        at_once, one_by_one = self._leaf_forest(impl), self._leaf_forest(impl)
        at_once.allocate(at_once.num_free + k)
        one_by_one.allocate(one_by_one.num_free)
        for _ in range(k):
            one_by_one.allocate(1)
        # the spare copy of 2 goes first and removes no hash; then 3, 4, the last 2, 1, 12, 11, 21
        expected = [3, 4, 2, 1, 12, 11, 21][: k - 1]
        for name, pool in (("one call", at_once), (f"{k} calls", one_by_one)):
            removed = [e.block_hash for e in pool.take_events() if isinstance(e, BlockRemoved)]
            assert removed == expected, f"lru-leaf in {name} of {k} evictions removed hashes {removed}, not {expected}"
        cached = {b: at_once.block_hash(b) for b in range(at_once.num_blocks)}
        assert cached == {b: one_by_one.block_hash(b) for b in range(one_by_one.num_blocks)}, (
            f"evicting {k} blocks in one call left other blocks cached than {k} calls of one"
        )
        counts = [(p.num_free, p.num_in_use, p.num_cached, p.num_available) for p in (at_once, one_by_one)]
        assert counts[0] == counts[1], (
            f"[POOL-106] (free, in use, cached, available) after {k} evictions in one call {counts[0]}, "
            f"after {k} calls of one {counts[1]}"
        )

    def _leaf_forest(self, impl: Target) -> Any:
        """Chain 1-2-3 released head first, a spare copy of 2, hash 4 under 2, chain 11-12 tail first,
        then a lone 21: its parent 11 becomes a leaf within the pass that evicts 12, before 21."""
        pool = self.pool(impl, 11, policy="lru-leaf", enable_events=True)
        chain = pool.allocate(3, holder="a")
        pool.register(chain, [1, 2, 3])
        [spare] = pool.allocate(1, holder="c")
        pool.register([spare], [2], parent_hash=1)
        [branch] = pool.allocate(1, holder="b")
        pool.register([branch], [4], parent_hash=2)
        other = pool.allocate(2, holder="d")
        pool.register(other, [11, 12])
        pool.free(chain, holder="a")
        pool.free([spare], holder="c")
        pool.free([branch], holder="b")
        pool.free(other[::-1], holder="d")
        cache_chain(pool, [21])
        pool.take_events()
        return pool

    @requires("events")
    @rule("EVICT-403", "EVICT-404")
    @pytest.mark.parametrize("copies", [2, 3])
    def test_lru_leaf_keeps_one_copy_of_a_hash_whose_child_is_in_use(self, impl: Target, copies: int) -> None:
        """Copies of hash 2 released one after another while its child 3 is in use: all but one may go."""

        def build() -> Any:
            pool = self.pool(impl, 10, policy="lru-leaf", enable_events=True)
            chain = pool.allocate(3, holder="a")
            pool.register(chain, [1, 2, 3])
            spares = pool.allocate(copies - 1, holder="s")
            for spare in spares:
                pool.register([spare], [2], parent_hash=1)
            pool.free([chain[1]], holder="a")
            pool.free(spares, holder="s")
            cache_chain(pool, [11])
            pool.take_events()
            return pool

        reclaimable = copies  # every copy of 2 but one, and 11
        for k in range(1, reclaimable + 1):
            at_once, one_by_one = build(), build()
            at_once.allocate(at_once.num_free + k)
            one_by_one.allocate(one_by_one.num_free)
            for _ in range(k):
                one_by_one.allocate(1)
            for name, pool in (("one call", at_once), (f"{k} calls", one_by_one)):
                assert 2 in pool.resident_hashes(), (
                    f"lru-leaf in {name} of {k} evictions removed hash 2, whose child 3 is in use"
                )
                removed = [e.block_hash for e in pool.take_events() if isinstance(e, BlockRemoved)]
                assert removed == ([11] if k == reclaimable else []), f"{name} of {k} evictions removed {removed}"
            assert {b: at_once.block_hash(b) for b in range(10)} == {b: one_by_one.block_hash(b) for b in range(10)}
        assert at_once.num_available == at_once.num_free, "every reclaimable block was taken"

    @rule("EVICT-404")
    @pytest.mark.parametrize("policy", LEAF_POLICIES)
    def test_lru_leaf_keeps_the_resident_hashes_prefix_closed(self, impl: Target, policy: str) -> None:
        pool = self.pool(impl, 9, policy=policy)
        for start in (1, 11):
            cache_chain(pool, [start, start + 1, start + 2, start + 3])
        for count in range(1, 8):
            pool.allocate(1)
            self.check(pool)
            resident = pool.resident_hashes()
            for h in resident:
                if h not in (1, 11):
                    assert h - 1 in resident, f"after {count} evictions {h} is resident but its parent {h - 1} is not"

    # ------------------------------------------------------------ lru-leaf-access (EVICT-411)

    @staticmethod
    def forest(pool: Any) -> dict[str, int]:
        """Megatron-Core's worked example: A -> B -> {C, F}, A -> D -> E, accessed A, B, {D, F}, {C, E}.

        Each block is allocated by its own request (a request holds a contiguous prefix, as in an
        engine), registered under its parent, and every holder then lets go of its blocks, roots first.
        Returns the block of each name; hashes are A=1, B=2, C=3, D=4, E=5, F=6.
        """
        [a] = pool.allocate(1, holder="A")
        [b] = pool.allocate(1, holder="B")
        d, f = sorted(pool.allocate(2, holder="DF"))  # one call: accessed in ascending id order
        c, e = sorted(pool.allocate(2, holder="CE"))
        pool.register([a], [1])
        pool.register([b], [2], parent_hash=1)
        pool.register([c], [3], parent_hash=2)
        pool.register([d], [4], parent_hash=1)
        pool.register([e], [5], parent_hash=4)
        pool.register([f], [6], parent_hash=2)
        for holder, blocks in (("A", [a]), ("B", [b]), ("DF", [d, f]), ("CE", [c, e])):
            pool.free(blocks, holder=holder)  # released roots first: release order is not access order
        return {"A": a, "B": b, "C": c, "D": d, "E": e, "F": f}

    @rule("EVICT-411", "EVICT-404")
    def test_lru_leaf_access_evicts_the_leaf_accessed_longest_ago_and_peels_its_parent_next(self, impl: Target) -> None:
        pool = self.pool(impl, 7, policy="lru-leaf-access")
        self.forest(pool)
        assert pool.num_free == 0 and pool.num_available == 6
        pool.allocate(1)
        assert pool.resident_hashes() == {1, 2, 3, 4, 5}, (
            "first victim: the leaf F (hash 6), accessed before the leaves C and E; "
            f"resident now {sorted(pool.resident_hashes())}"
        )
        pool.allocate(2)
        assert pool.resident_hashes() == {1, 4, 5}, (
            "then C (accessed before E in one call, the lower id), then B, a leaf once C and F are gone and "
            f"accessed before E: Megatron's example keeps A, D, E; resident {sorted(pool.resident_hashes())}"
        )

    @rule("EVICT-411")
    def test_lru_leaf_access_counts_a_match_as_an_access_and_a_release_as_none(self, impl: Target) -> None:
        pool = self.pool(impl, 7, policy="lru-leaf-access")
        names = self.forest(pool)
        hit = pool.match([1, 2, 6], holder="again")  # A, B and F accessed now: the youngest
        assert hit == [names["A"], names["B"], names["F"]]
        pool.free(hit[::-1], holder="again")
        pool.allocate(2)
        assert pool.resident_hashes() == {1, 2, 6, 4}, (
            "the leaves C and E were accessed before the match of A, B, F, so they go first; "
            f"resident {sorted(pool.resident_hashes())}"
        )
        pool.allocate(1)
        assert pool.resident_hashes() == {1, 2, 6}, (
            f"then D (a leaf once E is gone, accessed before the match); resident {sorted(pool.resident_hashes())}"
        )

    @rule("EVICT-411")
    def test_lru_leaf_access_counts_an_acquire_as_an_access(self, impl: Target) -> None:
        pool = self.pool(impl, 7, policy="lru-leaf-access")
        names = self.forest(pool)
        pool.acquire([names["C"], names["B"], names["A"]], holder="again")  # C accessed now
        pool.free([names["C"], names["B"], names["A"]], holder="again")
        pool.allocate(2)
        assert pool.resident_hashes() == {1, 2, 3, 4}, (
            f"F and then E go, not C, accessed last by acquire; resident {sorted(pool.resident_hashes())}"
        )

    @requires("events")
    @rule("EVICT-405")
    def test_ref_zero_drops_a_hashed_block_when_its_last_reference_goes(self, impl: Target) -> None:
        pool = self.pool(impl, 6, policy="ref-zero", enable_events=True)
        ids = pool.allocate(2, holder="a")
        pool.register(ids, [1, 2])
        pool.acquire(ids, holder="b")
        pool.free(ids[::-1], holder="a")
        assert pool.resident_hashes() == {1, 2}, "b still holds both blocks"
        pool.take_events()
        pool.free(ids[::-1], holder="b")
        assert pool.resident_hashes() == frozenset() and pool.num_cached == 0 and pool.num_free == 5
        assert pool.take_events() == [BlockRemoved(2), BlockRemoved(1)]
        assert pool.stats.evictions == 2

    @requires("events")
    @rule("EVICT-406")
    def test_fifo_evicts_by_registration_order_whatever_the_use_since(self, impl: Target) -> None:
        pool = self.pool(impl, 7, policy="fifo", enable_events=True)
        cache_chain(pool, [1, 2, 3])
        cache_chain(pool, [11, 12, 13])
        pool.free(pool.match([1, 2, 3], holder="x"), holder="x")  # reuse does not refresh under fifo
        assert evicted_hashes(pool, 4) == [1, 2, 3, 11]

    @rule("EVICT-407")
    def test_an_unknown_policy_is_refused(self, impl: Target) -> None:
        with pytest.raises(InvalidValueError) as info:
            impl.create(4, policy="lfu")
        assert "lru-leaf" in str(info.value), f"the message should list the known policies: {info.value}"
        with pytest.raises(InvalidTypeError):
            impl.create(4, policy=3)  # type: ignore[arg-type]
