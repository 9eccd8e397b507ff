"""Chapter 07's mamba groups, rule by rule (REQ-757..REQ-759): full attention beside a mamba group.

For any target with ``request-manager`` and ``manager-mamba``. The manager has two groups, full
attention (0) and mamba (1), blocks of 4 tokens. A mamba group keeps one state block per block
position and reads only the state after the last computed token, so its table keeps one block
behind the next token and shows the null block (0) for the rest; its hit is one cached state.
"""

from __future__ import annotations

from typing import Any

from kvref.contract.manager import FULL_ATTENTION, NULL_BLOCK, CacheGroup, group_key
from kvref_conformance.suites.base import ConformanceSuite, requires, rule
from kvref_conformance.suites.manager_requests import admit, decode, new_manager, prompt
from kvref_conformance.target import Target

__all__ = ["ManagerMambaSuite"]

MAMBA = (FULL_ATTENTION, CacheGroup.mamba())


@requires("manager-mamba")
class ManagerMambaSuite(ConformanceSuite):
    """REQ-757..REQ-759 on the target's manager with a full-attention and a mamba group."""

    @staticmethod
    def mamba(impl: Target, num_blocks: int = 24, **settings: Any) -> Any:
        manager = new_manager(impl, num_blocks, groups=MAMBA, **settings)
        manager.new_step_starts()
        return manager

    @rule("REQ-757")
    def test_a_mamba_group_keeps_only_the_state_of_the_last_computed_token(self, impl: Target) -> None:
        m = self.mamba(impl)
        a = prompt("a", range(14))
        admit(m, a)  # 4 blocks per group
        full, states = m.get_block_ids("a")
        free = m.num_free_blocks
        m.new_step_starts()
        decode(m, a, 99)  # 14 computed: the state after token 13 is in block 3; blocks 0-2 go
        full_after, states_after = m.get_block_ids("a")
        assert states_after == [NULL_BLOCK, NULL_BLOCK, NULL_BLOCK, states[3]], (
            f"[REQ-757] mamba table {states} -> {states_after}: blocks 0-2 must become the null block"
        )
        assert full_after == full, f"[REQ-757] full attention keeps every block: {full} -> {full_after}"
        assert m.num_free_blocks == free + 3, (
            f"[REQ-757] three state blocks released (still cached) and nothing taken: {free} -> {m.num_free_blocks}"
        )
        assert [m.block_hash(b) for b in states[:3]] == [group_key(h, 1) for h in a.block_hashes[:3]], (
            "[REQ-757] every state block that filled is cached under the mamba group's keys"
        )

    @rule("REQ-758", "REQ-732")
    def test_a_mamba_hit_is_its_rightmost_cached_state_alone(self, impl: Target) -> None:
        m = self.mamba(impl)
        a = prompt("a", range(14))
        admit(m, a)
        m.new_step_starts()
        decode(m, a, 99)  # state blocks 0-2 released, still cached
        hits, computed = m.get_computed_blocks(prompt("b", [*range(12), 50, 51]))
        full, states = (list(g) for g in hits.blocks)
        a_full, _ = m.get_block_ids("a")
        assert computed == 12 and full == a_full[:3], f"[REQ-732] 3 blocks hit: {full}, {computed} tokens"
        got = [m.block_hash(b) if b != NULL_BLOCK else None for b in states]
        assert states[:2] == [NULL_BLOCK, NULL_BLOCK] and got[2] == group_key(a.block_hashes[2], 1), (
            f"[REQ-758] the mamba hit must be the null block twice, then a's state block 2; got {states}"
        )

    @rule("REQ-758", "REQ-732")
    def test_the_hit_ends_where_a_cached_state_ends(self, impl: Target) -> None:
        m = self.mamba(impl, num_blocks=13)  # 12 usable
        a = prompt("a", range(16))
        admit(m, a)  # 4 blocks per group, 4 free
        m.new_step_starts()
        decode(m, a, 99)  # state blocks 2, 1, 0 released in that order (cached); a block per group: 2 free
        m.new_step_starts()
        assert admit(m, prompt("x", [70, 71, 72, 73, 74])) is not None  # 4 blocks: 2 free, then states 2 and 1
        hits, computed = m.get_computed_blocks(prompt("b", [*range(12), 5]))
        full, states = (list(g) for g in hits.blocks)
        a_full, _ = m.get_block_ids("a")
        assert computed == 4 and full == a_full[:1], (
            f"[REQ-732] full attention holds tokens 0-11 but the only state left is the one after block 0: "
            f"4 tokens must hit, got {computed} tokens and {hits.blocks}"
        )
        assert len(states) == 1 and m.block_hash(states[0]) == group_key(a.block_hashes[0], 1), (
            f"[REQ-758] the mamba hit is a's state block 0, got {states}"
        )

    @rule("REQ-759")
    def test_a_state_cached_in_this_step_is_a_hit_only_from_the_next_step(self, impl: Target) -> None:
        m = self.mamba(impl)
        admit(m, prompt("a", range(14)))  # caches states 0-2 in this step
        b = prompt("b", [*range(12), 50, 51])
        hits, computed = m.get_computed_blocks(b)
        assert computed == 12, f"[REQ-758] b hits a's 3 blocks, got {computed} tokens"
        before = (m.snapshot(), m.num_free_blocks)
        got = m.allocate_slots(b, b.num_tokens - computed, computed, hits)
        assert got is None, f"[REQ-759] the state b would start from was cached in this step: got {got}"
        assert (m.snapshot(), m.num_free_blocks) == before, "[REQ-759] the refused allocation changed the state"
        m.new_step_starts()
        got = m.allocate_slots(b, b.num_tokens - computed, computed, hits)
        assert got is not None and got.num_blocks == 2, f"[REQ-759] in the next step b is admitted: got {got}"
