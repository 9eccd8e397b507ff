"""Making room and starting over, as Megatron-Core's allocator offers them: ``evict(k)`` ahead of an
allocation (EVICT-412, its ``evict_lru_blocks``) and ``clear()`` of everything, blocks in use
included (POOL-124, its ``reset``). For any target declaring ``evict`` or ``clear``.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvref.contract.errors import KVRefError, NotHeldError
from kvref.contract.events import AllBlocksCleared
from kvref_conformance.observe import observe
from kvref_conformance.suites.base import LEAF_POLICIES, ConformanceSuite, cache_chain, requires, rule
from kvref_conformance.target import Target

__all__ = ["StartingOverSuite"]

#: The policies under which cached blocks wait to be evicted (under ref-zero nothing is cached).
CACHING = ("lru", "lru-leaf", "fifo", "lru-leaf-access")


def two_chains(pool: Any) -> None:
    """Two cached chains of three blocks, released tail first, and two blocks held aside."""
    cache_chain(pool, [1, 2, 3], holder="a")
    cache_chain(pool, [11, 12, 13], holder="b")
    pool.allocate(2, holder="held")


@requires("prefix-cache")
class StartingOverSuite(ConformanceSuite):
    """EVICT-412 and POOL-124."""

    @requires("evict")
    @rule("EVICT-412", "EVICT-408")
    @pytest.mark.parametrize("policy", CACHING)
    @pytest.mark.parametrize("k", [1, 3, 5])
    def test_evict_takes_the_blocks_an_allocation_would_and_frees_them(self, impl: Target, policy: str, k: int) -> None:
        evicted, allocated = (self.pool(impl, 10, policy=policy) for _ in "ea")
        for pool in (evicted, allocated):
            two_chains(pool)
        free, evictions = evicted.num_free, evicted.stats.evictions
        assert evicted.evict(k) is True, f"[EVICT-412] evict({k}) with 6 cached blocks must succeed"
        allocated.allocate(allocated.num_free + k, holder="x")
        assert evicted.resident_hashes() == allocated.resident_hashes(), (
            f"[EVICT-412] evict({k}) under {policy} left {sorted(evicted.resident_hashes())}; an allocation "
            f"short by {k} blocks leaves {sorted(allocated.resident_hashes())}"
        )
        assert evicted.num_free == free + k and evicted.stats.evictions == evictions + k, (
            f"[EVICT-412] evict({k}): {evicted.num_free} free (was {free}), "
            f"{evicted.stats.evictions} evictions (was {evictions})"
        )
        got = evicted.allocate(evicted.num_free, holder="y")
        assert len(set(got)) == len(got) == free + k, f"[EVICT-412] the evicted blocks are free to allocate: {got}"
        self.check(evicted)

    @requires("evict")
    @rule("EVICT-412", "POOL-106")
    @pytest.mark.parametrize("policy", [*CACHING, "ref-zero"])
    def test_evict_beyond_what_can_go_evicts_nothing_and_says_so(self, impl: Target, policy: str) -> None:
        pool = self.pool(impl, 10, policy=policy)
        two_chains(pool)
        before = observe(pool)
        assert pool.evict(pool.num_cached + 1) is False, f"[EVICT-412] evict({pool.num_cached + 1}) must say False"
        assert observe(pool) == before, "[EVICT-412] a refused evict changed the pool"
        assert pool.evict(0) is True and observe(pool) == before, "[EVICT-412] evict(0) is True and changes nothing"

    @requires("evict")
    @rule("EVICT-412", "POOL-106", "EVICT-404")
    @pytest.mark.parametrize("policy", LEAF_POLICIES)
    def test_evict_cannot_take_an_ancestor_of_a_held_block(self, impl: Target, policy: str) -> None:
        pool = self.pool(impl, 5, policy=policy)
        ids = pool.allocate(3, holder="a")
        pool.register(ids, [1, 2, 3])
        pool.free([ids[1], ids[0]], holder="a")  # 1 and 2 cached, 3 still held below them
        before = observe(pool)
        assert pool.evict(1) is False, "[EVICT-412] hashes 1 and 2 are ancestors of the held 3: nothing can go"
        assert observe(pool) == before, "[EVICT-412] a refused evict changed the pool"

    @requires("clear")
    @rule("POOL-124")
    def test_clear_drops_every_reference_pause_and_hash_even_of_blocks_in_use(self, impl: Target) -> None:
        pool = self.pool(impl, 10, enable_events=impl.has("events"))
        two_chains(pool)
        held = pool.allocate(2, holder="paused")
        if impl.has("pause"):
            pool.pause("paused")
        generations = {b: pool.generation(b) for b in held}
        resets = pool.stats.resets
        pool.take_events()
        pool.clear()
        assert pool.num_free == pool.num_usable and pool.num_cached == 0 and pool.num_in_use == 0, (
            f"[POOL-124] after clear: {pool.num_free} free of {pool.num_usable}, {pool.num_cached} cached, "
            f"{pool.num_in_use} in use"
        )
        assert pool.resident_hashes() == frozenset(), f"[POOL-124] hashes left: {sorted(pool.resident_hashes())}"
        assert pool.holder_references("paused") == pool.holder_references("held") == 0, "[POOL-124] references left"
        if impl.has("pause"):
            assert not pool.is_paused("paused"), "[POOL-124] a holder is still paused after clear"
        if impl.has("events"):
            assert pool.take_events() == [AllBlocksCleared()], "[POOL-124] clear emits AllBlocksCleared once"
        assert pool.stats.resets == resets + 1, f"[POOL-124] clear counts one reset: {resets} -> {pool.stats.resets}"
        assert {b: pool.generation(b) for b in held} == generations, "[POOL-124] generations must survive clear"
        with pytest.raises(NotHeldError) as info:
            pool.free(held, holder="paused")
        assert info.value.rule == "POOL-108", f"[POOL-124] freeing what was held before clear: {info.value}"
        assert len(pool.allocate(pool.num_usable, holder="new")) == pool.num_usable
        self.check(pool)

    @requires("clear")
    @rule("POOL-124", "POOL-112")
    def test_a_handle_from_before_clear_is_stale_after_it(self, impl: Target) -> None:
        pool = self.pool(impl, 3)  # two usable blocks: the same ids come back
        old = pool.allocate(2, holder="a")
        stale = [pool.generation(b) for b in old]
        pool.clear()
        new = pool.allocate(2, holder="a")
        assert sorted(new) == sorted(old), f"two usable blocks: {old} then {new}"
        with pytest.raises(KVRefError) as info:
            pool.free(old, holder="a", generations=stale)
        assert info.value.rule == "POOL-112", f"[POOL-124] a handle from before clear must be stale: {info.value}"
