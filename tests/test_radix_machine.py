"""Chapter 06 driven as a scheduler drives it: the oracle allocator and tree, with a shadow KV store.

Requests arrive (match, lock, allocate the rest, evicting under pressure), finish (insert, free
the duplicates, unlock; several finishes inside one free group), or abort (free their own slots,
unlock). A shadow store records what each slot holds, ``(namespace, tokens up to it)``, so a
match that returns a slot not holding exactly the requested prefix fails in the step it happens;
conservation and the tree's invariants are checked after every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvref.contract.errors import NotHeldError
from kvref.oracle.radix import LockReceipt, OracleRadixCache, OracleSlotAllocator

NAMESPACES = (None, "lora-a")


@dataclass
class Request:
    """A live request: its key, its row of slots, how much of it the tree held at admission, its lock."""

    namespace: object
    tokens: tuple[int, ...]
    row: list[int]
    cached: int
    lock: LockReceipt
    priority: int


class SchedulerMachine(RuleBasedStateMachine):
    """Allocator + radix tree under admissions, finishes, aborts and evictions (RADIX-6xx).

    ``tree_class`` is the tree under test: the oracle here, a planted bug in ``tests/meta``.
    """

    tree_class: type[OracleRadixCache] = OracleRadixCache

    def __init__(self) -> None:
        super().__init__()
        self.alloc = OracleSlotAllocator(8)
        self.tree = OracleRadixCache(self.alloc)
        self.live: list[Request] = []
        self.used: list[LockReceipt] = []
        self.shadow: dict[int, tuple[object, tuple[int, ...]]] = {}

    @initialize(page=st.sampled_from([1, 2]), policy=st.sampled_from(["lru", "lfu", "fifo", "mru", "priority"]))
    def create(self, page: int, policy: str) -> None:
        self.page = page
        self.alloc = OracleSlotAllocator(24 * page, page_size=page, sort=page == 1)
        self.tree = self.tree_class(self.alloc, policy=policy)

    def honest(self, namespace: object, tokens: tuple[int, ...], slots: list[int], what: str) -> None:
        for i, slot in enumerate(slots):
            want = (namespace, tokens[: i + 1])
            assert self.shadow.get(slot) == want, (
                f"[RADIX-622] {what}: slot {slot} at position {i} holds {self.shadow.get(slot)}, expected {want}"
            )
            assert self.alloc.is_allocated(slot), f"[RADIX-626] {what} returned slot {slot}, which is free"

    @rule(data=st.data(), namespace=st.sampled_from(NAMESPACES), priority=st.integers(0, 2))
    def admit(self, data: st.DataObject, namespace: object, priority: int) -> None:
        pages = data.draw(st.lists(st.integers(0, 2), min_size=self.page, max_size=6 * self.page))
        self.admit_tokens(namespace, tuple(pages[: len(pages) // self.page * self.page]), priority)

    @precondition(lambda self: any(len(r.tokens) > r.cached or r.cached > 1 for r in self.live))
    @rule(data=st.data())
    def admit_a_branch_of_a_live_request(self, data: st.DataObject) -> None:
        """A request sharing a live one's first pages and turning off inside them: the split lands
        inside a locked node (where SGLang once lost lock counts)."""
        req = data.draw(st.sampled_from(self.live))
        cut = data.draw(st.integers(1, max(1, len(req.tokens) // self.page - 1))) * self.page
        turn = tuple((t + 1) % 3 for t in req.tokens[cut : cut + self.page]) or (0,) * self.page
        self.admit_tokens(req.namespace, req.tokens[:cut] + turn, req.priority)

    def admit_tokens(self, namespace: object, tokens: tuple[int, ...], priority: int) -> None:
        """Match, lock, allocate the rest (evicting when short) and keep the request live."""
        m = self.tree.match(tokens, namespace=namespace)
        self.honest(namespace, tokens, m.slots, f"match({tokens})")
        lock = self.tree.lock(m.node)
        need = len(tokens) - m.length
        fresh = self.alloc.alloc(need)
        if fresh is None:
            self.tree.evict(need - self.alloc.available_size())
            fresh = self.alloc.alloc(need)
        if fresh is None:
            self.tree.unlock(lock)
            return
        for i, slot in enumerate(fresh):
            self.shadow[slot] = (namespace, tokens[: m.length + i + 1])
        self.live.append(Request(namespace, tokens, m.slots + fresh, m.length, lock, priority))

    def finish(self, req: Request) -> None:
        have = self.tree.insert(req.tokens, req.row, namespace=req.namespace, priority=req.priority)
        duplicates = req.row[req.cached : have]
        if duplicates:
            self.alloc.free(duplicates)
        self.tree.unlock(req.lock)
        self.used.append(req.lock)

    @precondition(lambda self: self.used)
    @rule(data=st.data())
    def unlocking_a_used_receipt_is_refused(self, data: st.DataObject) -> None:
        receipt = data.draw(st.sampled_from(self.used))
        before = self.tree.snapshot()
        refused: NotHeldError | None = None
        try:
            self.tree.unlock(receipt)
        except NotHeldError as exc:
            refused = exc
        if refused is None:
            raise AssertionError(f"[RADIX-624] a second unlock of {receipt} was accepted: lock counts can go negative")
        assert refused.rule == "RADIX-624", f"a second unlock of {receipt} raised {refused!r}, citing the wrong rule"
        assert self.tree.snapshot() == before, f"[RADIX-624] a refused unlock of {receipt} changed the tree"

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish_one(self, data: st.DataObject) -> None:
        self.finish(self.live.pop(data.draw(st.integers(0, len(self.live) - 1))))

    @precondition(lambda self: len(self.live) >= 2)
    @rule()
    def finish_all_in_one_free_group(self) -> None:
        self.alloc.free_group_begin()
        while self.live:
            self.finish(self.live.pop())
        self.alloc.free_group_end()

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort_one(self, data: st.DataObject) -> None:
        req = self.live.pop(data.draw(st.integers(0, len(self.live) - 1)))
        own = req.row[req.cached :]
        if own:
            self.alloc.free(own)
        self.tree.unlock(req.lock)
        self.used.append(req.lock)

    @rule(tokens=st.integers(0, 20))
    def evict(self, tokens: int) -> None:
        evictable = self.tree.evictable_size()
        freed = self.tree.evict(tokens)
        assert freed >= min(tokens, evictable), f"[RADIX-628] evict({tokens}) freed {freed} of {evictable} evictable"

    @precondition(lambda self: not self.live)
    @rule()
    def reset(self) -> None:
        self.tree.reset()
        self.used.clear()  # receipts of a reset tree name nodes that are gone
        assert self.alloc.available_size() == self.alloc.size, "[RADIX-630] reset must free every cached slot"

    @invariant()
    def conserved_and_consistent(self) -> None:
        private = sum(len(r.row) - r.cached for r in self.live)
        total = self.alloc.available_size() + self.tree.total_size() + private
        assert total == self.alloc.size, (
            f"[RADIX-625] free {self.alloc.available_size()} + cached {self.tree.total_size()} + private {private} "
            f"!= size {self.alloc.size}"
        )
        self.tree.check_invariants()


TestScheduler = pytest.mark.rule("RADIX-622", "RADIX-623", "RADIX-625", "RADIX-628")(SchedulerMachine.TestCase)
