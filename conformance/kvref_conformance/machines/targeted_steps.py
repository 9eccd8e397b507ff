"""The machine's targeted steps: situations the random steps reach rarely, made on purpose.

- a paused holder calls every operation, not only ``allocate`` (POOL-113, POOL-114, POOL-121);
- blocks that never got a hash are released in one call among cached ones, and the next
  allocation must evict: free blocks go first and the victims follow the policy's order of the
  cached blocks alone (EVICT-401, EVICT-403, EVICT-406, EVICT-408);
- a batch admission whose middle entry does not fit while a later one would: admission stops
  there, the entry is not served in part, the later one is not tried (POOL-116).

Each step reuses the random steps' own calls, so what they check after a call (fresh blocks,
hits holding the requested prefix, the renaming) is checked here too; the observations run
after every step as usual.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import rule

from kvref_conformance.machines.cache_steps import CacheSteps
from kvref_conformance.machines.core import HOLDERS, chain_hashes, chains_st, holders_st
from kvref_conformance.machines.pool_steps import PoolSteps

__all__ = ["TARGETED_RULES", "TargetedSteps"]

#: The targeted steps' names: only the targeted machine draws them.
TARGETED_RULES = (
    "a_paused_holder_calls_each_operation",
    "release_hashless_among_cached_then_evict",
    "admit_a_batch_whose_middle_entry_does_not_fit",
)


class TargetedSteps(PoolSteps, CacheSteps):
    """Steps that build rarely reached situations on purpose, each followed on the oracle."""

    @rule(holder=holders_st, data=st.data())
    def a_paused_holder_calls_each_operation(self, holder: object, data: st.DataObject) -> None:
        """Pause ``holder`` (if it is not) and make it call one operation, batched forms included:
        it may release, never obtain a reference, and an empty request is no request (POOL-114,
        POOL-121); ``paused_used`` follows its releases (POOL-113)."""
        if holder not in self.paused:
            self.toggle_pause(holder)
        ops = ["allocate", "acquire", "free"]
        if self.caching:
            ops.append("match")
        if self.batching:
            ops += ["allocate_many", "free_many"] + (["match_many"] if self.caching else [])
        op = data.draw(st.sampled_from(ops), label="operation")
        others = [h for h in HOLDERS if h != holder]
        if op == "allocate":
            self.allocate(holder, data.draw(st.integers(0, 2), label="count"))
        elif op == "acquire":
            self.share(holder, data.draw(st.sampled_from(others), label="donor"), data)
        elif op == "free":
            self.free_some(holder, data)
        elif op == "match":
            self.run_request(holder, data.draw(chains_st, label="chain"))
        elif op == "allocate_many":
            self.tick()
            beside = data.draw(st.sampled_from(others), label="beside")
            counts = [data.draw(st.integers(0, 2), label="count") for _ in range(2)]
            holders = [holder, beside] if data.draw(st.booleans(), label="paused first") else [beside, holder]
            self.admit(counts, holders)
        elif op == "free_many":
            self.tick()
            pair = (holder, data.draw(st.sampled_from(others), label="beside"))
            entries = [
                (h, data.draw(st.lists(st.sampled_from(range(len(self.refs[h]))), unique=True), label=repr(h)))
                for h in pair
                if self.refs[h]
            ]
            self.release_together(entries)
        else:
            self.tick()
            chain = data.draw(chains_st, label="chain")
            hashes = chain_hashes(chain)
            beside = data.draw(st.sampled_from(others), label="beside")
            self.match_together(
                [chain, chain], [beside, holder], [hashes, hashes[: data.draw(st.integers(0, len(hashes)))]]
            )

    @rule(holder=holders_st, chain=chains_st, data=st.data())
    def release_hashless_among_cached_then_evict(
        self, holder: object, chain: tuple[int, ...], data: st.DataObject
    ) -> None:
        """Cache ``chain`` for ``holder``, give it blocks that never get a hash, release all of its
        blocks in one call in a drawn order, then allocate more than is free: the hashless blocks
        are free blocks, taken before any cached one (EVICT-408), and the victims are the cached
        blocks the policy names (EVICT-401, EVICT-403, EVICT-406)."""
        if holder in self.paused or not self.caching:
            return
        self.run_request(holder, chain)
        hashless = data.draw(st.integers(1, 2), label="hashless blocks")
        if hashless > self.oracle.num_available:
            return
        self.allocate(holder, hashless)
        refs = self.refs[holder]
        order = data.draw(st.permutations(refs), label="release order")
        self.tick()
        kind, _, _ = self.both(
            f"free({order}, holder={holder!r}) [hashless blocks among cached ones]",
            lambda: self.impl.free(order, holder=holder),
            lambda: self.oracle.free(self.rename(order), holder=holder),
        )
        assert kind == "ok", "the oracle refused a valid free"
        refs.clear()
        need = self.oracle.num_free + data.draw(st.integers(1, 2), label="blocks evicted")
        if need > self.oracle.num_available:
            return
        before = (self.impl.num_cached, self.oracle.num_cached, self.impl.num_free)
        self.allocate(holder, need)
        evicted, spec = before[0] - self.impl.num_cached, before[1] - self.oracle.num_cached
        assert evicted == spec, (
            f"[EVICT-408] allocate({need}) with {before[2]} free blocks, hashless ones among them released in "
            f"one call with cached ones, evicted {evicted} cached block(s); the spec takes free blocks first "
            f"and evicts {spec}"
        )

    @rule(data=st.data())
    def admit_a_batch_whose_middle_entry_does_not_fit(self, data: st.DataObject) -> None:
        """``allocate_many([fits, too_many, small])``: the first is admitted, the second is not served
        in part, and the third is not tried even if it would fit (POOL-116)."""
        if not self.batching:
            return
        self.tick()
        available = self.oracle.num_available
        first = data.draw(st.integers(0, available), label="first")
        counts = [first, available - first + data.draw(st.integers(1, 2), label="over"), data.draw(st.integers(0, 1))]
        self.admit(counts, [data.draw(holders_st, label="holder") for _ in counts])
