"""Chapter 03's event index (PFX-328..PFX-330): a router's rebuild of caches from their KV events.

For any target with ``event-index`` (``create_event_index``). A machine plays the caches: it keeps
what each cache holds (copies per block) and sends the index the events such a cache sends, a
store of a chain under a held parent, a removal of held blocks, a clear, a cache gone, then asks
the index, after every event, about every chain of blocks stored so far and one block past each
(never stored): each cache's answer must be the number of the chain's leading blocks the cache
holds. The expectation is the machine's own count, not another index's, so kvref's index is
tested as any other.

Three runs, each about one rule: one cache, whose stream keeps PFX-322 and removes any block, a
parent before its children included, as vLLM's sliding-window groups and kvref's ``lru`` do
(PFX-328); three caches sharing chains, with clears and caches removed (PFX-330); one cache whose
stream reports every copy of a block, as vLLM's do for its hybrid models (PFX-324), so a block is
stored again while held and its copies leave one at a time (PFX-329). The last two remove leaves
only (blocks none of whose children the cache holds), as SGLang's radix caches and kvref's leaf
policies do, so that each judges its own rule.
"""

from __future__ import annotations

import hashlib
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, run_state_machine_as_test
from hypothesis.stateful import rule as step

from kvref.contract.event_index import IndexedBlock
from kvref_conformance.suites.base import ConformanceSuite, requires, rule
from kvref_conformance.target import Target

__all__ = ["EventIndexMachine", "EventIndexSuite", "block_under"]

#: Tokens per block, and the token ids drawn: few, so that chains share blocks across caches.
BLOCK_SIZE = 2
TOKEN_MAX = 2
TOKENS = st.tuples(*[st.integers(0, TOKEN_MAX)] * BLOCK_SIZE)


def block_under(parent: int | None, tokens: tuple[int, ...]) -> IndexedBlock:
    """The block of ``tokens`` under ``parent``: its hash chains the parent's, as an engine's does."""
    digest = hashlib.blake2b(repr((parent, tokens)).encode(), digest_size=8).digest()
    return IndexedBlock(int.from_bytes(digest, "big") >> 1, tokens)


class EventIndexMachine(RuleBasedStateMachine):
    """Caches sending the target's index their events; its answers checked against what they hold."""

    #: Set by the subclass per run (EventIndexSuite): the target, how many caches, whether a cache
    #: reports every copy of a block, whether caches are removed, whether removals take leaves only,
    #: and the rule the run checks.
    impl: Target
    caches = 1
    copies = False
    removes_caches = False
    leaf_removals = False
    rule_id = "PFX-328"

    def __init__(self) -> None:
        super().__init__()
        self.index = self.impl.create_event_index()
        self.held: list[dict[int, int]] = [{} for _ in range(self.caches)]  # cache -> hash -> copies
        self.blocks: dict[int, tuple[int | None, IndexedBlock]] = {}  # every block stored: hash -> (parent, block)
        self.log: list[str] = []

    def sent(self, what: str) -> None:
        """Note an event sent to the index, for the failure's message."""
        self.log.append(what)

    @step(cache=st.integers(0, 2), start=st.integers(0, 10**6), tokens=st.lists(TOKENS, min_size=1, max_size=3))
    def store(self, cache: int, start: int, tokens: list[tuple[int, ...]]) -> None:
        """A chain stored under a held parent (or as a root); a held block is stored again only where
        copies are reported."""
        cache %= self.caches
        held = self.held[cache]
        roots: list[int | None] = [None, *sorted(held)]
        parent = roots[start % len(roots)]
        chain: list[IndexedBlock] = []
        top = parent
        for t in tokens:
            block = block_under(top, t)
            if block.hash in held and not self.copies and not chain:
                parent = top = block.hash  # the cache holds it already: it stores only what follows
                continue
            if block.hash in held and not self.copies:
                break
            chain.append(block)
            top = block.hash
        if not chain:
            return
        self.sent(f"cache {cache}: store {[b.hash for b in chain]} under {parent}")
        self.index.store(cache, chain, parent)
        below = parent
        for block in chain:
            held[block.hash] = held.get(block.hash, 0) + 1
            self.blocks[block.hash] = (below, block)
            below = block.hash

    @step(cache=st.integers(0, 2), pick=st.integers(0, 10**6))
    def store_again(self, cache: int, pick: int) -> None:
        """A block stored before, whose parent the cache holds, stored again: the engine computed it anew
        (after losing it, or as a second copy where copies are reported)."""
        cache %= self.caches
        held = self.held[cache]
        ready = [
            h
            for h, (parent, _) in sorted(self.blocks.items())
            if (parent is None or parent in held) and (self.copies or h not in held)
        ]
        if not ready:
            return
        parent, block = self.blocks[ready[pick % len(ready)]]
        self.sent(f"cache {cache}: store {[block.hash]} under {parent}")
        self.index.store(cache, [block], parent)
        held[block.hash] = held.get(block.hash, 0) + 1

    @step(cache=st.integers(0, 2), pick=st.lists(st.integers(0, 10**6), min_size=1, max_size=2))
    def remove(self, cache: int, pick: list[int]) -> None:
        """One copy of one or two held blocks leaves the cache: any block (an engine may evict a parent
        before its children), or with ``leaf_removals`` only blocks none of whose children it holds."""
        cache %= self.caches
        held = self.held[cache]
        names = sorted(held)
        if self.leaf_removals:
            parents = {self.blocks[h][0] for h in held}
            names = [h for h in names if h not in parents]
        if not names:
            return
        gone = sorted({names[p % len(names)] for p in pick})
        self.sent(f"cache {cache}: remove {gone}")
        self.index.remove(cache, gone)
        for h in gone:
            held[h] -= 1
            if not held[h]:
                del held[h]

    @step(cache=st.integers(0, 2))
    def clear(self, cache: int) -> None:
        """The cache is emptied (AllBlocksCleared)."""
        cache %= self.caches
        self.sent(f"cache {cache}: clear")
        self.index.clear(cache)
        self.held[cache] = {}

    @precondition(lambda self: self.removes_caches)
    @step(cache=st.integers(0, 2))
    def remove_cache(self, cache: int) -> None:
        """The cache is gone (a worker that left); it may come back empty."""
        cache %= self.caches
        self.sent(f"cache {cache}: removed")
        self.index.remove_cache(cache)
        self.held[cache] = {}

    def chain_to(self, h: int) -> list[IndexedBlock]:
        """The chain of stored blocks from a root to ``h``."""
        chain = []
        at: int | None = h
        while at is not None:
            parent, block = self.blocks[at]
            chain.append(block)
            at = parent
        chain.reverse()
        return chain

    @invariant()
    def every_chain_answers_what_each_cache_holds(self) -> None:
        for h in sorted(self.blocks):
            chain = self.chain_to(h)
            for query in (chain, [*chain, block_under(h, (TOKEN_MAX + 1,) * BLOCK_SIZE)]):
                expected = {}
                for cache, held in enumerate(self.held):
                    count = next((i for i, block in enumerate(query) if block.hash not in held), len(query))
                    if count:
                        expected[cache] = count
                answer = dict(self.index.match(query))
                assert answer == expected, (
                    f"[{self.rule_id}] a chain of {len(query)} blocks {[b.hash for b in query]}: the index answered "
                    f"{answer} leading blocks per cache, the caches hold {expected}; the last events, oldest first:\n  "
                    + "\n  ".join(self.log[-12:])
                )


class EventIndexSuite(ConformanceSuite):
    """PFX-328..PFX-330 on the target's event index."""

    @staticmethod
    def run_machine(impl: Target, rule_id: str, **settings_of_run: Any) -> None:
        """Run :class:`EventIndexMachine` on ``impl`` for ``rule_id`` with the class settings given."""
        name = f"EventIndexMachine_{rule_id.replace('-', '_')}"
        machine = type(name, (EventIndexMachine,), {"impl": impl, "rule_id": rule_id, **settings_of_run})
        run_state_machine_as_test(machine, settings=settings())

    @requires("event-index")
    @rule("PFX-328")
    def test_an_index_answers_each_chain_with_the_leading_blocks_the_cache_holds(self, impl: Target) -> None:
        self.run_machine(impl, "PFX-328")

    @requires("event-index")
    @rule("PFX-330", "PFX-328")
    def test_an_index_keeps_its_caches_apart(self, impl: Target) -> None:
        self.run_machine(impl, "PFX-330", caches=3, removes_caches=True, leaf_removals=True)

    @requires("event-index")
    @rule("PFX-329", "PFX-328")
    def test_an_index_keeps_a_block_while_a_reported_copy_is_left(self, impl: Target) -> None:
        self.run_machine(impl, "PFX-329", copies=True, leaf_removals=True)

    @requires("event-index")
    @rule("PFX-328")
    def test_an_empty_index_answers_no_cache(self, impl: Target) -> None:
        index = impl.create_event_index()
        assert dict(index.match([block_under(None, (0, 1))])) == {}, "[PFX-328] an index fed nothing holds nothing"
        index.store(0, [block_under(None, (0, 1))], None)
        assert dict(index.match([])) == {}, "[PFX-328] an empty chain has no leading block in any cache"
