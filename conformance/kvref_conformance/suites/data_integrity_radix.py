"""Chapter 08 end to end over chapter 06: the token-slot allocator, the radix cache and the data plane.

:class:`RadixIntegrityMachine` runs requests as SGLang's scheduler does: match the prompt in the
radix tree and lock the node it ends at, check that every hit slot holds the KV its token was
written with, allocate slots for the rest (evicting from the tree when the allocator runs short),
write their KV and the request's row of the request-to-token table, then on finish insert the
prompt, free the slots the tree already had (RADIX-623) and unlock. Eviction hands slots back to
the allocator, which hands them out again: a tree that kept a slot it gave back, or an allocator
that handed out a slot the tree still owns, shows as a running request whose KV changed under
it. Slot 0 is the padding slot of the KV buffers and never a token's (RADIX-601).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, run_state_machine_as_test
from hypothesis.stateful import rule as step

from kvref_conformance.suites.base import ConformanceSuite, requires, rule
from kvref_conformance.suites.data_plane import check_tokens as check_all
from kvref_conformance.suites.data_plane import write_tokens
from kvref_conformance.target import Target

__all__ = ["DataIntegrityRadixSuite", "RadixIntegrityMachine"]

SIZE = 40  # token slots 1..SIZE
ROWS, LAYERS = 4, 2
PREFIXES = [[], [100, 101, 102, 103, 104, 105], [200, 201, 202, 203, 204, 205, 206, 207]]


def check_tokens(kv: Any, slots: list[int], tokens: list[int], positions: list[int], rule_id: str) -> None:
    """Every layer's K and V at ``slots`` hold the rows of ``tokens``; nothing to check for no slot."""
    if slots:
        check_all(kv, slots, tokens, positions, rule_id)


class RadixIntegrityMachine(RuleBasedStateMachine):
    """Requests through the target's radix cache and data plane, beside what every value must be."""

    target: Target

    @initialize(dtype=st.sampled_from(["float32", "float16"]), page=st.sampled_from([1, 2]))
    def create(self, dtype: str, page: int) -> None:
        plane = self.target.data_plane()
        self.allocator, self.tree = self.target.create_radix(SIZE, page_size=page)
        self.page = page
        # Page p holds slots p * page .. p * page + page - 1, pages 1 .. SIZE / page: slots up to SIZE + page - 1.
        self.kv = plane.kv_buffers(SIZE + page, LAYERS, 2, 2, v_head_num=1, v_head_dim=3, dtype=dtype)
        self.table = plane.req_to_token(ROWS, 32)
        self.t = plane.tensors
        self.live: dict[int, tuple[int, list[int], list[int], Any]] = {}  # rid -> (row, prompt, slots, receipt)
        self.next_rid = 1

    @precondition(lambda self: len(self.live) < ROWS)
    @step(prefix=st.integers(0, len(PREFIXES) - 1), tail=st.lists(st.integers(0, 5), min_size=1, max_size=10))
    def admit(self, prefix: int, tail: list[int]) -> None:
        prompt = [*PREFIXES[prefix], *(300 + t for t in tail)]
        prompt = prompt[: len(prompt) - len(prompt) % self.page] or prompt[: self.page]
        if len(prompt) % self.page:
            return
        found = self.tree.match(prompt)
        hit = list(found.slots)
        check_tokens(self.kv, hit, prompt[: len(hit)], list(range(len(hit))), "RADIX-622")
        receipt = self.tree.lock(found.node) if found.node else None
        need = len(prompt) - len(hit)
        fresh = self.allocator.alloc(need) if need else []
        if fresh is None:  # short of slots: evict from the tree (never the locked hit, RADIX-628), then again
            self.tree.evict(need)
            fresh = self.allocator.alloc(need)
        rows = self.table.alloc(1)
        if fresh is None or rows is None:
            if fresh:
                self.allocator.free(fresh)
            if rows:
                self.table.free(rows[0])
            if receipt is not None:
                self.tree.unlock(receipt)
            return
        slots = hit + list(fresh)
        if fresh:
            write_tokens(self.kv, list(fresh), prompt[len(hit) :], list(range(len(hit), len(prompt))))
        self.table.write(rows[0], 0, slots)
        self.live[self.next_rid] = (rows[0], prompt, slots, receipt)
        self.next_rid += 1

    @precondition(lambda self: self.live)
    @step(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """Insert the prompt, free the duplicates the tree already had (RADIX-623), unlock, free the row."""
        rid = data.draw(st.sampled_from(sorted(self.live)))
        row, prompt, slots, receipt = self.live.pop(rid)
        have = self.tree.insert(prompt, slots)
        cached = self.tree.match(prompt).slots
        assert len(cached) == len(prompt), (
            f"[RADIX-623] after inserting request {rid}'s {len(prompt)} tokens, {len(cached)} hit"
        )
        owned = set(cached)
        duplicates = [s for s in slots[:have] if s not in owned]  # the caller's to free (RADIX-623)
        if duplicates:
            self.allocator.free(duplicates)
        if receipt is not None:
            self.tree.unlock(receipt)
        self.table.free(row)

    @step(tokens=st.integers(1, 12))
    def evict(self, tokens: int) -> None:
        self.tree.evict(tokens)

    @invariant()
    def running_requests_read_their_own_kv(self) -> None:
        if not hasattr(self, "live"):
            return
        for rid, (row, prompt, slots, _) in self.live.items():
            got = self.t.to_host(self.table.read(row, 0, len(prompt))).tolist()
            assert got == slots, f"[DATA-811] row {row} of request {rid} reads {got}, it was written {slots}"
            check_tokens(self.kv, slots, prompt, list(range(len(prompt))), "RADIX-628")

    @invariant()
    def cached_slots_hold_their_tokens(self) -> None:
        if not hasattr(self, "tree"):
            return
        for prefix in PREFIXES[1:]:
            found = self.tree.match(prefix[: len(prefix) - len(prefix) % self.page])
            check_tokens(self.kv, list(found.slots), prefix[: found.length], list(range(found.length)), "RADIX-622")


@requires("radix-cache", "data-plane")
class DataIntegrityRadixSuite(ConformanceSuite):
    """Chapter 08 over chapter 06's allocator and radix cache, on the target's own."""

    @rule("RADIX-622", "RADIX-623", "RADIX-628", "DATA-801", "DATA-811")
    def test_the_radix_cache_and_the_data_plane_keep_every_value(self, impl: Target) -> None:
        machine = type("RadixIntegrity", (RadixIntegrityMachine,), {"target": impl})
        run_state_machine_as_test(machine)
