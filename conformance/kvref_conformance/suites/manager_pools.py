"""Chapter 07 with one pool per KV cache group (REQ-735): each group its own allocator and budget.

For any target with ``request-manager`` and ``manager-pools``. The manager has full attention (0)
in a small pool and a sliding window of 8 tokens (1) in a large one, blocks of 4 tokens; vLLM
draws both from one pool, a free-stack allocator per group and SGLang's hybrid allocator give each its own.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvref.contract.errors import ConfigError
from kvref.contract.manager import FULL_ATTENTION, NULL_BLOCK, CacheGroup, group_key
from kvref_conformance.suites.base import ConformanceSuite, requires, rule
from kvref_conformance.suites.manager_requests import admit, new_manager, prompt
from kvref_conformance.target import Target

__all__ = ["ManagerPoolsSuite"]

HYBRID = (FULL_ATTENTION, CacheGroup.window(8))


@requires("manager-pools")
class ManagerPoolsSuite(ConformanceSuite):
    """REQ-735 on kvref's manager over two pools of the target."""

    @staticmethod
    def split(impl: Target, full: int = 8, window: int = 24, **settings: Any) -> Any:
        return new_manager(impl, full + window, groups=HYBRID, pool_sizes=(full, window), **settings)

    @rule("REQ-735")
    def test_each_pool_must_fit_its_own_groups(self, impl: Target) -> None:
        m = self.split(impl)  # 7 usable for full attention, 23 for the window
        assert admit(m, prompt("a", range(16))) is not None  # 4 blocks in each pool: 3 left for full attention
        free = m.num_free_blocks
        assert free == 3 + 19, f"[REQ-735] free blocks count over both pools: 3 + 19, got {free}"
        before = (m.snapshot(), m.num_free_blocks)
        got = admit(m, prompt("b", [50 + i for i in range(16)]))
        assert got is None, (
            f"[REQ-735] b needs 4 blocks in each pool; full attention's pool has 3, so it must not fit even though "
            f"{free} blocks are free in all: got {got}"
        )
        assert (m.snapshot(), m.num_free_blocks) == before, "[REQ-735] the refused allocation changed the state"
        assert admit(m, prompt("c", [70 + i for i in range(12)])) is not None, "[REQ-735] 3 blocks per pool fit"

    @rule("REQ-735", "REQ-733")
    def test_each_group_draws_and_caches_in_its_own_pool(self, impl: Target) -> None:
        m = self.split(impl, full=6, window=6)  # 5 usable blocks in each pool
        a = prompt("a", range(16))
        assert admit(m, a) is not None, "[REQ-735] 4 blocks per group fit 5 per pool"
        full, window = m.get_block_ids("a")
        assert m.num_free_blocks == 1 + 1, f"[REQ-735] one block left in each pool, got {m.num_free_blocks}"
        assert [m.block_hash(b, group=0) for b in full] == a.block_hashes[:4], "[REQ-735] group 0's keys, in its pool"
        assert [m.block_hash(b, group=1) for b in window] == [group_key(h, 1) for h in a.block_hashes[:4]], (
            "[REQ-735] group 1's blocks are registered under its keys in its own pool"
        )
        assert NULL_BLOCK not in full + window and m.usage == pytest.approx(8 / 10), f"usage {m.usage}"

    @rule("REQ-735", "REQ-715")
    def test_reset_clears_every_pool_or_none(self, impl: Target) -> None:
        m = self.split(impl)
        a = prompt("a", range(9))
        admit(m, a)
        assert m.reset_prefix_cache() is False, "[REQ-735] a block is in use in both pools: reset must refuse"
        m.free(a)
        assert m.reset_prefix_cache() is True, "[REQ-715] nothing in use: reset succeeds"
        hits, computed = m.get_computed_blocks(prompt("b", range(9)))
        assert computed == 0 and hits.num_blocks == 0, f"[REQ-735] both pools were reset: {computed} tokens hit"

    @rule("REQ-735")
    def test_a_pool_per_group_means_as_many_pools_as_groups(self, impl: Target) -> None:
        with pytest.raises(ConfigError) as info:
            new_manager(impl, 20, groups=HYBRID, pool_sizes=(10,))
        assert info.value.rule == "REQ-735", f"[REQ-735] one pool for two groups: {info.value}"

    @requires("events")
    @rule("REQ-735", "REQ-717")
    def test_events_over_several_pools_come_in_call_order_with_one_clear_per_reset(self, impl: Target) -> None:
        m = self.split(impl)
        a = prompt("a", range(9))
        admit(m, a)
        m.free(a)
        assert m.reset_prefix_cache() is True
        admit(m, prompt("c", range(50, 59)))
        kinds = [type(e).__name__ for e in m.take_events()]
        stored = "RequestBlockStored"
        assert kinds == [stored] * 4 + ["AllBlocksCleared"] + [stored] * 4, (
            f"[REQ-735] a's 2 blocks in each pool, one clear for the one reset, then c's: got {kinds}"
        )
