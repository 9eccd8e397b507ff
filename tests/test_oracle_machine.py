"""Hypothesis state machine over the oracle: random interleavings, every invariant after each step.

A model on the side tracks which references each holder holds and what each block's KV would
contain (a shadow KV store). Every prefix hit must return blocks whose shadow content is exactly
the requested prefix, so a stale or wrong hit fails the step it happens in.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvref.contract.errors import CacheInUseError, OutOfBlocksError, PausedHolderError
from kvref.contract.events import apply_events
from kvref.contract.hashing import ROOT_HASH, hash_block
from kvref.oracle import OracleBlockPool

HOLDERS = st.sampled_from(["a", "b", "c", None])
# Short token chains over a tiny alphabet, so that requests share prefixes often.
CHAINS = st.lists(st.integers(0, 2), min_size=1, max_size=5).map(tuple)


def chain_hashes(chain: tuple[int, ...]) -> list[int]:
    """One hash per position: block i holds token chain[i] (block size 1)."""
    out, parent = [], ROOT_HASH
    for token in chain:
        parent = hash_block(parent, [token], algorithm="xxh3_64")
        out.append(parent)
    return out


class OracleMachine(RuleBasedStateMachine):
    """Drives one OracleBlockPool with allocate, free, acquire, match+register, reset, pause."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = OracleBlockPool(2)
        self.refs: dict[object, list[int]] = {}
        self.shadow: dict[int, tuple[int, ...] | None] = {}
        self.view: set[int] = set()

    @initialize(
        policy=st.sampled_from(["lru", "lru-leaf", "ref-zero", "fifo", "lru-leaf-access"]), size=st.integers(2, 10)
    )
    def create(self, policy: str, size: int) -> None:
        self.pool = OracleBlockPool(size, policy=policy, enable_events=True, paused_limit=2)
        note(f"pool = OracleBlockPool({size}, policy={policy!r})")

    def held(self, holder: object) -> list[int]:
        return self.refs.setdefault(holder, [])

    @rule(holder=HOLDERS, count=st.integers(0, 6))
    def allocate(self, holder: object, count: int) -> None:
        pool = self.pool
        if pool.is_paused(holder) and count:
            with pytest.raises(PausedHolderError):
                pool.allocate(count, holder=holder)
            return
        if count > pool.num_available:
            before = pool.snapshot()
            with pytest.raises(OutOfBlocksError):
                pool.allocate(count, holder=holder)
            assert pool.snapshot() == before, "a refused allocate changed the state (POOL-105)"
            return
        everyone = {b for refs in self.refs.values() for b in refs}
        ids = pool.allocate(count, holder=holder)
        assert not set(ids) & everyone, f"allocate handed out blocks still held: {set(ids) & everyone}"
        for b in ids:
            self.shadow[b] = None  # fresh: content not written yet
        self.held(holder).extend(ids)

    @rule(holder=HOLDERS, data=st.data())
    def free_some(self, holder: object, data: st.DataObject) -> None:
        refs = self.held(holder)
        if not refs:
            return
        picked = data.draw(st.lists(st.sampled_from(range(len(refs))), unique=True, max_size=len(refs)))
        ids = [refs[i] for i in picked]
        self.pool.free(ids, holder=holder)
        for i in sorted(picked, reverse=True):
            del refs[i]

    @rule(holder=HOLDERS, donor=HOLDERS, data=st.data())
    def share(self, holder: object, donor: object, data: st.DataObject) -> None:
        refs = self.held(donor)
        if not refs or self.pool.is_paused(holder):
            return
        b = data.draw(st.sampled_from(refs))
        self.pool.acquire([b], holder=holder)
        self.held(holder).append(b)

    @rule(holder=HOLDERS, chain=CHAINS)
    def run_request(self, holder: object, chain: tuple[int, ...]) -> None:
        """Match, allocate the rest, write the KV, register: what a scheduler step does."""
        pool = self.pool
        if pool.is_paused(holder):
            return
        hashes = chain_hashes(chain)
        hit = pool.match(hashes, holder=holder)
        for i, b in enumerate(hit):
            assert self.shadow.get(b) == chain[: i + 1], (
                f"match returned block {b} for prefix {chain[: i + 1]}, but it holds {self.shadow.get(b)}: "
                "a stale or wrong prefix hit (PFX-307)"
            )
        self.held(holder).extend(hit)
        need = len(hashes) - len(hit)
        if need > pool.num_available:
            return
        fresh = pool.allocate(need, holder=holder)
        for i, b in enumerate(fresh, start=len(hit)):
            self.shadow[b] = chain[: i + 1]
        pool.register(fresh, hashes[len(hit) :], parent_hash=hashes[len(hit) - 1] if hit else None)
        self.held(holder).extend(fresh)

    @rule(holder=HOLDERS)
    def release_all_tail_first(self, holder: object) -> None:
        refs = self.held(holder)
        self.pool.free(refs[::-1], holder=holder)
        refs.clear()

    @rule()
    def reset(self) -> None:
        if self.pool.num_in_use:
            with pytest.raises(CacheInUseError):
                self.pool.reset()
        else:
            self.pool.reset()

    @rule(holder=HOLDERS)
    def toggle_pause(self, holder: object) -> None:
        if self.pool.is_paused(holder):
            self.pool.resume(holder)
        else:
            self.pool.pause(holder)

    @precondition(lambda self: self.pool.num_blocks > 2)
    @rule(chain=CHAINS)
    def lookup_is_pure_and_honest(self, chain: tuple[int, ...]) -> None:
        before = self.pool.snapshot()
        got = self.pool.lookup(chain_hashes(chain))
        assert self.pool.snapshot() == before, "lookup changed the state (PFX-321)"
        for i, b in enumerate(got):
            assert self.shadow.get(b) == chain[: i + 1], f"lookup returned block {b} holding {self.shadow.get(b)}"

    @invariant()
    def invariants_hold(self) -> None:
        self.pool.check_invariants()

    @invariant()
    def reference_counts_equal_the_models_holders(self) -> None:
        model: dict[int, Counter[object]] = {}
        for holder, refs in self.refs.items():
            for b in refs:
                model.setdefault(b, Counter())[holder] += 1
        for b in range(self.pool.num_blocks):
            want = dict(model.get(b, {}))
            assert self.pool.holders(b) == want, f"block {b}: pool holders {self.pool.holders(b)}, model {want}"

    @invariant()
    def events_replay_to_the_resident_hashes(self) -> None:
        self.view = apply_events(self.view, self.pool.take_events())
        assert self.view == self.pool.resident_hashes(), "events disagree with the cache (PFX-316)"

    @invariant()
    def paused_accounting_is_exact(self) -> None:
        used = sum(len(r) for h, r in self.refs.items() if self.pool.is_paused(h))
        assert self.pool.paused_used == used and self.pool.paused_excess == max(0, used - 2)


TestOracleMachine = OracleMachine.TestCase
TestOracleMachine = pytest.mark.rule(
    "STATE-001",
    "STATE-002",
    "STATE-003",
    "STATE-005",
    "POOL-104",
    "POOL-107",
    "POOL-113",
    "PFX-307",
    "PFX-316",
    "PFX-321",
)(TestOracleMachine)
