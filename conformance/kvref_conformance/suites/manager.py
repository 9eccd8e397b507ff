"""Chapter 07's request-level manager, rule by rule (REQ-701..REQ-723).

For any target with ``request-manager``: its own manager (a peer's), or kvref's oracle manager
over its prefix cache. Every test goes through the manager's surface only (``get_computed_blocks``,
``allocate_slots``, ``free``, ... and ``num_free_blocks``, ``get_block_ids``, ``block_hash``), as a
scheduler sees it. Blocks hold 4 tokens; block 0 is the null block, so a manager of ``n`` blocks
has ``n - 1`` usable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis.stateful import run_state_machine_as_test

from kvref.contract.errors import InvalidTypeError, InvalidValueError
from kvref.contract.events import AllBlocksCleared
from kvref.contract.manager import KVCacheBlocks, RequestBlockStored
from kvref.contract.requests import Request, RequestStatus
from kvref_conformance.suites.base import ConformanceSuite, requires, rule
from kvref_conformance.suites.manager_machine import RequestSchedulerMachine
from kvref_conformance.suites.manager_requests import B, admit, decode, new_manager, prompt, refused_unchanged
from kvref_conformance.target import Target

__all__ = ["ManagerSuite"]


class ManagerSuite(ConformanceSuite):
    """REQ-7xx on the target's request-level manager."""

    @staticmethod
    def manager(impl: Target, num_blocks: int = 12, **settings: Any) -> Any:
        return new_manager(impl, num_blocks, **settings)

    # ------------------------------------------------------------------ computed blocks

    @rule("REQ-701", "REQ-704")
    def test_a_prompt_of_whole_blocks_leaves_its_last_block_to_compute(self, impl: Target) -> None:
        m = self.manager(impl)
        assert admit(m, prompt("a", range(8))) is not None
        hits, computed = m.get_computed_blocks(prompt("b", range(8)))
        assert (len(hits.blocks[0]), computed) == (1, 4), (
            f"[REQ-701] 8 tokens in blocks of 4, both cached: got {len(hits.blocks[0])} blocks / {computed} "
            "tokens, the last token's block must be computed again (1 block, 4 tokens)"
        )
        hits, computed = m.get_computed_blocks(prompt("c", range(9)))
        assert computed == 8, f"[REQ-704] 9 tokens with 8 cached: {computed} computed tokens, expected 8"
        assert list(hits.blocks[0]) == m.get_block_ids("a")[0][:2], "[REQ-704] the hit must be a's two blocks"

    @rule("REQ-705")
    @requires("manager-share-last-block")
    def test_share_mode_shares_the_last_whole_block_and_recomputes_one_token(self, impl: Target) -> None:
        m = self.manager(impl, last_block="share")
        admit(m, prompt("a", range(8)))
        hits, computed = m.get_computed_blocks(prompt("b", range(8)))
        assert (len(hits.blocks[0]), computed) == (2, 7), (
            f"[REQ-705] share mode: got {len(hits.blocks[0])} blocks / {computed} tokens, expected 2 / 7"
        )
        b = prompt("b", range(8))
        hits, computed = m.get_computed_blocks(b)
        free = m.num_free_blocks
        new = m.allocate_slots(b, 1, computed, hits)
        assert new is not None and new.num_blocks == 0 and m.num_free_blocks == free, (
            "[REQ-705] the last token goes into the shared block: no new block may be taken"
        )

    @rule("REQ-704")
    def test_a_request_that_skips_the_cache_finds_nothing_and_is_not_counted(self, impl: Target) -> None:
        m = self.manager(impl)
        admit(m, prompt("a", range(9)))
        m.make_prefix_cache_stats()
        b = prompt("b", range(9), skip_reading_prefix_cache=True)
        hits, computed = m.get_computed_blocks(b)
        assert (hits.num_blocks, computed) == (0, 0), f"[REQ-704] skip_reading_prefix_cache: got {computed} tokens"
        admit(m, b)
        stats = m.make_prefix_cache_stats()
        assert stats is None or stats.requests == 0, f"[REQ-716] a request that skips the cache was counted: {stats}"

    @rule("REQ-706")
    def test_finding_the_computed_blocks_pins_nothing_and_keeps_the_eviction_order(self, impl: Target) -> None:
        m = self.manager(impl, num_blocks=5)  # 4 usable
        a = prompt("a", range(9))
        admit(m, a)
        m.free(a)  # 2 cached blocks (the third is partial), released tail first
        free = m.num_free_blocks
        m.get_computed_blocks(prompt("b", range(9)))
        assert m.num_free_blocks == free, f"[REQ-706] get_computed_blocks pinned blocks: {free} -> {m.num_free_blocks}"
        # Three fresh blocks: one more than the never-cached ones, so the LRU cached block goes,
        # which is a's tail (released first); the head must survive.
        admit(m, prompt("x", [50 + i for i in range(12)]))
        _, computed = m.get_computed_blocks(prompt("c", range(9)))
        assert computed == 4, f"[REQ-706][REQ-713] after evicting one block, a's head should hit: got {computed}"

    @rule("REQ-707")
    def test_eagle_drops_the_last_block_of_a_hit(self, impl: Target) -> None:
        m = self.manager(impl, use_eagle=True)
        admit(m, prompt("a", range(13)))
        _, computed = m.get_computed_blocks(prompt("b", range(13)))
        assert computed == 8, f"[REQ-707] 3 cached blocks with EAGLE: {computed} tokens hit, expected 8"

    # ------------------------------------------------------------------ allocation

    @rule("REQ-708")
    def test_the_table_is_the_hits_then_new_blocks_and_only_new_ones_are_returned(self, impl: Target) -> None:
        m = self.manager(impl)
        admit(m, prompt("a", range(9)))
        b = prompt("b", list(range(8)) + [99] * 6)
        hits, computed = m.get_computed_blocks(b)
        new = m.allocate_slots(b, b.num_tokens - computed, computed, hits, num_lookahead_tokens=3)
        assert new is not None
        table = m.get_block_ids("b")[0]
        # 14 tokens + 3 lookahead = 17 slots = 5 blocks, 2 of them hits.
        assert len(table) == 5 and table[:2] == list(hits.blocks[0]) and table[2:] == list(new.blocks[0]), (
            f"[REQ-708] table {table}, hits {hits.blocks[0]}, new {new.blocks[0]}: expected hits then 3 new blocks"
        )
        b.num_computed_tokens = b.num_tokens
        again = decode(m, b, 7)
        assert again is not None and again.num_blocks == 0, "[REQ-708] a decode inside the held blocks takes none"

    @rule("REQ-709")
    def test_an_allocation_that_does_not_fit_changes_nothing(self, impl: Target) -> None:
        m = self.manager(impl, num_blocks=6)  # 5 usable
        admit(m, prompt("a", range(9)))  # 3 blocks held, 2 free
        big = prompt("big", range(100, 113))  # 4 blocks
        before = (m.snapshot(), m.num_free_blocks)
        assert m.allocate_slots(big, 13) is None, "[REQ-709] 4 blocks asked, 2 free: must return None"
        assert (m.snapshot(), m.num_free_blocks) == before, "[REQ-709] a refused allocation changed the state"
        assert m.get_block_ids("big") == ([],), f"[REQ-709] the refused request holds {m.get_block_ids('big')}"

    @rule("REQ-709")
    def test_a_cached_hit_takes_an_available_block_when_pinned(self, impl: Target) -> None:
        m = self.manager(impl, num_blocks=5)  # 4 usable
        a = prompt("a", range(9))
        admit(m, a)
        m.free(a)  # blocks 0..1 cached, all 4 available
        admit(m, prompt("x", [70, 71, 72]))  # one block: 3 available, both cached hits among them
        b = prompt("b", list(range(8)) + [90] * 5)  # 13 tokens: 2 hits + 2 new
        hits, computed = m.get_computed_blocks(b)
        assert computed == 8
        before = (m.snapshot(), m.num_free_blocks)
        got = m.allocate_slots(b, b.num_tokens - computed, computed, hits)
        assert got is None, (
            "[REQ-709] 2 new blocks plus 2 cached hits need 4 available blocks, 3 are: allocate_slots must "
            f"return None, it returned {got}"
        )
        assert (m.snapshot(), m.num_free_blocks) == before, "[REQ-709] the refusal pinned or changed something"

    @rule("REQ-724")
    def test_a_whole_prompt_that_cannot_fit_is_not_admitted_chunk_by_chunk(self, impl: Target) -> None:
        m = self.manager(impl, num_blocks=6)  # 5 usable
        big = prompt("big", range(24))  # 6 blocks
        before = (m.snapshot(), m.num_free_blocks)
        got = m.allocate_slots(big, 8, full_sequence_must_fit=True)
        assert got is None, f"[REQ-724] a first chunk of 2 blocks fits, the 6-block prompt does not: got {got}"
        assert (m.snapshot(), m.num_free_blocks) == before, "[REQ-724] the refusal changed the state"
        assert m.allocate_slots(big, 8) is not None, "[REQ-708] without the gate the first chunk fits"

    @rule("REQ-710")
    def test_lookahead_slots_and_partial_blocks_are_never_cached(self, impl: Target) -> None:
        m = self.manager(impl)
        a = prompt("a", range(6))
        admit(m, a, lookahead=6)  # 12 slots, 3 blocks; 6 real tokens: 1 full block
        table = m.get_block_ids("a")[0]
        hashed = [m.block_hash(b) is not None for b in table]
        assert hashed == [True, False, False], f"[REQ-710] cached flags {hashed}: only the first block is full"
        for t in (6, 7):
            decode(m, a, t)
        assert m.block_hash(table[1]) == a.block_hashes[1], "[REQ-710] the second block filled and must be cached"
        assert m.get_unhashed_block_ids(m.get_blocks("a")) == table[2:], "[REQ-719] the unhashed blocks"

    @rule("REQ-710")
    def test_draft_tokens_are_never_cached(self, impl: Target) -> None:
        m = self.manager(impl)
        a = prompt("a", range(4))
        admit(m, a)
        a.append_output_token_ids([4])
        # one verified token and three drafts (the drafts are not the request's tokens yet)
        new = m.allocate_slots(a, 4, num_draft_tokens=3)
        assert new is not None
        assert m.block_hash(m.get_block_ids("a")[0][1]) is None, "[REQ-710] a block filled by drafts was cached"

    @rule("REQ-711")
    def test_delayed_caching_caches_only_when_asked(self, impl: Target) -> None:
        m = self.manager(impl)
        a = prompt("a", range(9))
        m.allocate_slots(a, 9, delay_cache_blocks=True)
        table = m.get_block_ids("a")[0]
        assert all(m.block_hash(b) is None for b in table), "[REQ-711] delay_cache_blocks cached blocks"
        m.cache_blocks(a, 8)
        assert [m.block_hash(b) for b in table[:2]] == a.block_hashes[:2], "[REQ-711] cache_blocks(8) caches 2 blocks"

    @rule("REQ-712")
    def test_bad_allocations_are_refused_and_change_nothing(self, impl: Target) -> None:
        m = self.manager(impl)
        a = prompt("a", range(9))
        admit(m, a)
        b = prompt("b", range(9))
        hits, computed = m.get_computed_blocks(b)
        refused_unchanged(m, lambda: m.allocate_slots(b, 0), "REQ-712")
        refused_unchanged(m, lambda: m.allocate_slots(b, -1), "REQ-712")
        refused_unchanged(m, lambda: m.allocate_slots(b, 1, computed - 1, hits), "REQ-712")
        wrong = KVCacheBlocks((tuple(reversed(hits.blocks[0])),))
        refused_unchanged(m, lambda: m.allocate_slots(b, 1, computed, wrong), "REQ-712")
        refused_unchanged(m, lambda: m.allocate_slots(a, 1, computed, hits), "REQ-712")

    @rule("REQ-703")
    def test_a_request_of_another_block_size_or_type_is_refused(self, impl: Target) -> None:
        m = self.manager(impl)
        admit(m, prompt("a", range(9)))
        other = Request("b", list(range(9)), block_size=2 * B, algorithm="xxh3_64")
        calls: list[Callable[[], Any]] = [lambda: m.get_computed_blocks(other), lambda: m.allocate_slots(other, 9)]
        for call in calls:
            before = (m.snapshot(), m.num_free_blocks)
            with pytest.raises(InvalidValueError) as info:
                call()
            assert info.value.rule == "REQ-703", f"[REQ-703] raised citing {info.value.rule}: {info.value}"
            assert (m.snapshot(), m.num_free_blocks) == before, "[ERR-501] a refused call changed the state"
        with pytest.raises(InvalidTypeError):
            m.allocate_slots("a", 1)

    @rule("REQ-720")
    def test_slots_never_go_beyond_max_model_len(self, impl: Target) -> None:
        m = self.manager(impl, max_model_len=10)
        a = prompt("a", range(9))
        admit(m, a, lookahead=8)
        assert len(m.get_block_ids("a")[0]) == 3, f"[REQ-720] 10 tokens at most: {m.get_block_ids('a')[0]}"

    # ------------------------------------------------------------------ free, preempt, reset

    @rule("REQ-713")
    def test_free_releases_tail_first_and_forgets_the_table(self, impl: Target) -> None:
        m = self.manager(impl, num_blocks=5)
        a = prompt("a", range(13))
        admit(m, a)
        m.free(a)
        m.free(a)  # a request holding nothing: a no-op
        assert m.get_block_ids("a") == ([],) and m.num_free_blocks == 4, "[REQ-713] free must release every block"
        admit(m, prompt("x", [60, 61]))  # the never-cached block first
        admit(m, prompt("y", [62, 63]))  # now the LRU cached block: a's tail
        _, computed = m.get_computed_blocks(prompt("c", range(13)))
        assert computed == 8, f"[REQ-713] a's tail must be evicted first; {computed} tokens hit, expected 8"

    @rule("REQ-714", "REQ-716")
    def test_preemption_frees_everything_and_is_counted(self, impl: Target) -> None:
        m = self.manager(impl)
        a = prompt("a", range(9))
        admit(m, a)
        m.make_prefix_cache_stats()
        m.preempt(a)
        assert (a.num_computed_tokens, a.status, a.num_preemptions) == (0, RequestStatus.PREEMPTED, 1), (
            f"[REQ-714] after preemption: {a!r}"
        )
        assert m.get_block_ids("a") == ([],) and m.num_free_blocks == 11, "[REQ-714] preemption must free all"
        admit(m, a)
        stats = m.make_prefix_cache_stats()
        if stats is not None:
            assert (stats.requests, stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (
                0,
                1,
                9,
                8,
            ), f"[REQ-716] a resumed request counts as preempted, in tokens: {stats}"

    @rule("REQ-715")
    def test_reset_prefix_cache_is_refused_while_blocks_are_in_use(self, impl: Target) -> None:
        m = self.manager(impl)
        a = prompt("a", range(9))
        admit(m, a)
        before = m.snapshot()
        assert m.reset_prefix_cache() is False, "[REQ-715] a reset with blocks in use must return False"
        assert m.snapshot() == before, "[REQ-715] a refused reset changed the state"
        m.free(a)
        m.take_events()
        assert m.reset_prefix_cache() is True, "[REQ-715] a reset with nothing in use must succeed"
        _, computed = m.get_computed_blocks(prompt("b", range(9)))
        assert computed == 0, f"[REQ-715] after a reset nothing may hit, {computed} tokens did"
        events = m.take_events()
        if "events" in m.capabilities():
            assert events == [AllBlocksCleared()], f"[REQ-717] a reset emits one AllBlocksCleared: {events}"
        stats = m.make_prefix_cache_stats()
        assert stats is None or stats.reset, f"[REQ-715] the statistics must say a reset happened: {stats}"

    # ------------------------------------------------------------------ statistics and events

    @rule("REQ-716")
    def test_statistics_are_counted_in_tokens_and_start_again_when_taken(self, impl: Target) -> None:
        m = self.manager(impl)
        admit(m, prompt("a", range(9)))
        admit(m, prompt("b", range(10)))
        stats = m.make_prefix_cache_stats()
        if stats is None:
            pytest.skip("statistics are off")
        assert (stats.requests, stats.queries, stats.hits) == (2, 19, 8), f"[REQ-716] got {stats}"
        again = m.make_prefix_cache_stats()
        assert again is not None and (again.requests, again.queries) == (0, 0), f"[REQ-716] not reset: {again}"

    @rule("REQ-717")
    @requires("events")
    def test_stored_events_carry_the_tokens_to_rebuild_each_chain(self, impl: Target) -> None:
        m = self.manager(impl)
        a = prompt("a", range(9), cache_salt="tenant")
        admit(m, a)
        stored = [e for e in m.take_events() if isinstance(e, RequestBlockStored)]
        assert [(e.block_hash, e.parent_hash, e.token_ids) for e in stored] == [
            (a.block_hashes[0], None, (0, 1, 2, 3)),
            (a.block_hashes[1], a.block_hashes[0], (4, 5, 6, 7)),
        ], f"[REQ-717] stored events {stored}"
        assert stored[0].extra_keys.cache_salt == "tenant" and stored[0].block_size == B, f"[REQ-717] {stored[0]}"

    # ------------------------------------------------------------------ tables

    @rule("REQ-718")
    def test_common_prefix_counts_blocks_every_scheduled_request_shares(self, impl: Target) -> None:
        m = self.manager(impl, num_blocks=16)
        admit(m, prompt("a", range(13)))
        admit(m, prompt("b", list(range(8)) + [40] * 5))
        admit(m, prompt("c", [41] * 5))
        got = m.get_num_common_prefix_blocks(["a", "b"])
        assert got == [2], f"[REQ-718] a and b share 2 blocks, got {got}"
        assert m.get_num_common_prefix_blocks(["a", "b", "c"]) == [0], "[REQ-718] c shares nothing"

    @rule("REQ-719")
    def test_block_lists_add_per_group_and_unknown_requests_hold_nothing(self, impl: Target) -> None:
        m = self.manager(impl)
        assert m.get_block_ids("nobody") == ([],), "[REQ-719] an unknown request holds nothing"
        x, y = KVCacheBlocks(((1, 2),)), KVCacheBlocks(((3,),))
        assert (x + y).blocks == ((1, 2, 3),) and x.new_empty().blocks == ((),), "[REQ-719] + and new_empty"

    @rule("REQ-721")
    @requires("invariants")
    def test_the_manager_checks_its_own_tables(self, impl: Target) -> None:
        m = self.manager(impl)
        a = prompt("a", range(9))
        admit(m, a)
        decode(m, a, 3)
        check = getattr(m, "check_invariants", None)
        if check is None:
            pytest.skip("the manager has no check_invariants")
        check()

    @rule("REQ-723")
    def test_usage_is_the_share_of_blocks_in_use(self, impl: Target) -> None:
        m = self.manager(impl, num_blocks=11)
        admit(m, prompt("a", range(9)))
        assert m.usage == pytest.approx(0.3), f"[REQ-723] 3 of 10 blocks in use: usage {m.usage}"

    # ------------------------------------------------------------------ the scheduler machine

    @rule(
        "REQ-704",
        "REQ-708",
        "REQ-709",
        "REQ-710",
        "REQ-713",
        "REQ-714",
        "REQ-715",
        "REQ-716",
        "REQ-717",
        "REQ-718",
        "REQ-721",
        "REQ-724",
        "REQ-730",
        "REQ-731",
        "REQ-732",
        "REQ-734",
        "REQ-757",
        "REQ-758",
        "REQ-735",
        "REQ-759",
    )
    @pytest.mark.parametrize("mode", ["recompute", "share", "eagle", "hybrid", "mamba", "pools"])
    def test_scheduler_traffic_matches_the_oracle(self, impl: Target, mode: str) -> None:
        self.manager(impl)  # skips a target without a manager
        if mode == "share" and not impl.has("manager-share-last-block"):
            pytest.skip(f"{impl.name} lacks 'manager-share-last-block'")
        if mode == "hybrid" and not impl.has("manager-sliding-window"):
            pytest.skip(f"{impl.name} lacks 'manager-sliding-window'")
        if mode == "mamba" and not impl.has("manager-mamba"):
            pytest.skip(f"{impl.name} lacks 'manager-mamba'")
        if mode == "pools" and not impl.has("manager-pools"):
            pytest.skip(f"{impl.name} lacks 'manager-pools'")
        machine = type(
            "SchedulerTraffic",
            (RequestSchedulerMachine,),
            {
                "target": impl,
                "last_block": "share" if mode == "share" else "recompute",
                "use_eagle": mode == "eagle",
                "hybrid": mode in ("hybrid", "pools"),
                "mamba": mode == "mamba",
                "pools": mode == "pools",
            },
        )
        run_state_machine_as_test(machine)
