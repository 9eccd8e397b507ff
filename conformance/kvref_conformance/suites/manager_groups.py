"""Chapter 07's KV cache groups, rule by rule (REQ-730..REQ-734): full attention beside a sliding window.

For any target with ``request-manager`` and ``manager-sliding-window``. The manager has two
groups, full attention (0) and a sliding window of 8 tokens (1), blocks of 4 tokens: a window
hit needs a run of 2 cached blocks. Block 0 is the null block, which a window's table shows for
the blocks it no longer needs.
"""

from __future__ import annotations

from typing import Any

from kvref.contract.manager import FULL_ATTENTION, NULL_BLOCK, CacheGroup, group_key
from kvref_conformance.suites.base import ConformanceSuite, requires, rule
from kvref_conformance.suites.manager_requests import admit, decode, new_manager, prompt
from kvref_conformance.target import Target

__all__ = ["ManagerGroupsSuite"]

WINDOW = 8
HYBRID = (FULL_ATTENTION, CacheGroup.window(WINDOW))


class ManagerGroupsSuite(ConformanceSuite):
    """REQ-730..REQ-734 on the target's manager with a full-attention and a sliding-window group."""

    @staticmethod
    def hybrid(impl: Target, num_blocks: int = 24, **settings: Any) -> Any:
        return new_manager(impl, num_blocks, groups=HYBRID, **settings)

    @rule("REQ-730")
    @requires("manager-sliding-window")
    def test_blocks_behind_the_window_become_null_and_are_released(self, impl: Target) -> None:
        m = self.hybrid(impl)
        a = prompt("a", range(16))
        admit(m, a)
        full, window = m.get_block_ids("a")
        free = m.num_free_blocks
        decode(m, a, 99)  # 16 computed: the window needs tokens 9.., so blocks 0 and 1 go
        full_after, window_after = m.get_block_ids("a")
        assert window_after[:2] == [NULL_BLOCK, NULL_BLOCK] and window_after[2:4] == window[2:4], (
            f"[REQ-730] window table {window} -> {window_after}: blocks 0 and 1 must become the null block"
        )
        assert full_after[:4] == full, f"[REQ-730] full attention keeps every block: {full} -> {full_after}"
        assert m.num_free_blocks == free + 2 - 2, (
            f"[REQ-730] two window blocks released and one block taken per group: {free} -> {m.num_free_blocks}"
        )

    @rule("REQ-731")
    @requires("manager-sliding-window")
    def test_a_window_hit_is_the_rightmost_run_that_covers_the_window(self, impl: Target) -> None:
        m = self.hybrid(impl)
        a = prompt("a", range(16))
        admit(m, a)
        decode(m, a, 99)  # the window's blocks 0 and 1 are released (still cached)
        hits, computed = m.get_computed_blocks(prompt("b", [*list(range(16)), 7]))
        full, window = (list(g) for g in hits.blocks)
        a_full, a_window = m.get_block_ids("a")
        assert computed == 16 and full == a_full[:4], f"[REQ-732] full attention hits 4 blocks: {full}, {computed}"
        assert window == [NULL_BLOCK, NULL_BLOCK, *a_window[2:4]], (
            f"[REQ-731] the window's hit must be the run of blocks 2-3 with null blocks before it, got {window}"
        )

    @rule("REQ-732")
    @requires("manager-sliding-window")
    def test_the_hit_is_the_longest_prefix_every_group_serves(self, impl: Target) -> None:
        m = self.hybrid(impl, num_blocks=11)  # 10 usable
        a = prompt("a", range(16))
        admit(m, a)  # 8 blocks, 2 free
        decode(m, a, 99)  # window blocks 0, 1 released; one new block per group: 2 free -> 0, 2 cached
        assert admit(m, prompt("x", [70, 71, 72])) is not None  # 2 blocks: the cached window blocks 0, 1 go
        hits, computed = m.get_computed_blocks(prompt("b", [*list(range(8)), 5]))
        assert computed == 0 and hits.num_blocks == 0, (
            f"[REQ-732] full attention holds tokens 0-7, the window lost them: nothing may hit, got {computed} "
            f"tokens and {hits.blocks}"
        )

    @rule("REQ-733")
    @requires("manager-sliding-window")
    def test_each_group_caches_under_its_own_keys(self, impl: Target) -> None:
        m = self.hybrid(impl)
        a = prompt("a", range(9))
        admit(m, a)
        full, window = m.get_block_ids("a")
        got = [m.block_hash(b) for b in window[:2]]
        want = [group_key(h, 1) for h in a.block_hashes[:2]]
        assert got == want, f"[REQ-733] the window group's blocks are cached under {got}, its keys are {want}"
        assert [m.block_hash(b) for b in full[:2]] == a.block_hashes[:2], "[REQ-733] group 0 caches under the hashes"

    @rule("REQ-734")
    @requires("manager-sliding-window")
    def test_the_fit_check_adds_up_every_group(self, impl: Target) -> None:
        m = self.hybrid(impl, num_blocks=6)  # 5 usable
        admit(m, prompt("a", [60, 61, 62]))  # one block per group: 3 left
        before = (m.snapshot(), m.num_free_blocks)
        got = m.allocate_slots(prompt("b", range(8)), 8)
        assert got is None, f"[REQ-734] 8 tokens need 2 blocks in each group, 4 in all, 3 are free: got {got}"
        assert (m.snapshot(), m.num_free_blocks) == before, "[REQ-709] the refused allocation changed the state"
