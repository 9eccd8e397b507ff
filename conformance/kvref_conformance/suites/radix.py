"""Chapter 06's radix cache over its slot allocator, driven as a scheduler drives it (RADIX-620..RADIX-632).

For any target with ``radix-cache`` (``create_radix``: an allocator and a tree over it). Requests
arrive (match, lock, allocate the rest, evicting under pressure), finish (insert, free the
duplicates ``insert`` reports, unlock; several finishes inside one free group), or abort (free
their own slots, unlock), as SGLang's scheduler does in ``cache_finished_req``. A shadow store
records what each slot holds, ``(namespace, tokens up to it)``, so a match that returns a slot not
holding exactly the requested prefix fails in the step it happens; conservation (free + cached +
request-private = capacity) is checked after every step, and the tree's own invariants where it
has ``invariants``.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvref.contract.errors import ConfigError, KVRefError
from kvref.contract.events import apply_events
from kvref.contract.hashing import ROOT_HASH, BlockExtraKeys, hash_block
from kvref_conformance.suites.base import ConformanceSuite, skip_without
from kvref_conformance.suites.base import rule as rule_ids
from kvref_conformance.target import Target

__all__ = ["PAGES", "RadixCacheSuite", "RadixSchedulerMachine", "page_hashes"]

NAMESPACES = (None, "lora-a")
POLICIES = ("lru", "lfu", "fifo", "mru", "priority")
PAGES = (1, 4)


def page_hashes(key: list[int], page: int, namespace: Hashable = None) -> list[int]:
    """RADIX-635's hash of each page of ``key`` (salted as RADIX-636 says), computed here from the rules' words."""
    out: list[int] = []
    for start in range(0, len(key) - len(key) % page, page):
        salt = BlockExtraKeys(cache_salt=repr(namespace)) if namespace is not None and not out else None
        out.append(hash_block(out[-1] if out else ROOT_HASH, key[start : start + page], salt))
    return out


@dataclass
class Request:
    """A live request: its key, its row of slots, how much of it the tree held at admission, its lock."""

    namespace: object
    tokens: tuple[int, ...]
    row: list[int]
    cached: int
    lock: Any
    priority: int


class RadixSchedulerMachine(RuleBasedStateMachine):
    """An allocator and a radix tree under admissions, finishes, aborts and evictions.

    ``make(page, policy)`` builds the pair under test (``target.create_radix`` by default; the
    planted bugs of ``tests/meta`` override it). ``page``, ``checks_receipts`` and ``checks_events``
    are set per test; with ``checks_events`` the tree reports KV events, and after every step the
    events applied so far must give exactly the pages the tree holds (RADIX-634), found from the
    shadow: every allocated slot no live request holds privately, at the end of a page.
    """

    target: Target
    page: int = 1
    checks_receipts: bool = True
    checks_events: bool = False
    #: The policies the target's tree offers (``priority`` under ``radix-priority``).
    policies: tuple[str, ...] = POLICIES

    def make(self, page: int, policy: str) -> tuple[Any, Any]:
        """The allocator of ``24 * page`` slots and the tree under ``policy`` (with events under ``checks_events``)."""
        pair: tuple[Any, Any] = self.target.create_radix(
            24 * page, page_size=page, policy=policy, sort=page == 1, enable_events=self.checks_events
        )
        return pair

    @initialize(policy=st.sampled_from(POLICIES))
    def create(self, policy: str) -> None:
        if policy not in self.policies:  # a policy the target's tree lacks: lru in its place
            policy = "lru"
        self.alloc, self.tree = self.make(self.page, policy)
        self.size = 24 * self.page
        self.live: list[Request] = []
        self.used: list[Any] = []
        self.shadow: dict[int, tuple[object, tuple[int, ...]]] = {}
        self.seen: set[int] = set()  # the pages the events applied so far say are cached
        self.hashes: dict[tuple[object, tuple[int, ...]], int] = {}  # (namespace, key) -> its last page's hash

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

    @precondition(lambda self: self.checks_receipts and self.used)
    @rule(data=st.data())
    def unlocking_a_used_receipt_is_refused(self, data: st.DataObject) -> None:
        receipt = data.draw(st.sampled_from(self.used))
        refused = second_unlock_refused(self.tree, receipt)
        assert refused is None, refused

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
        free = self.alloc.available_size()
        assert free == self.size, f"[RADIX-630] after reset {free} of {self.size} slots are free; reset frees all"

    @invariant()
    def conserved_and_consistent(self) -> None:
        if not hasattr(self, "tree"):
            return
        private = sum(len(r.row) - r.cached for r in self.live)
        free, cached = self.alloc.available_size(), self.tree.total_size()
        assert free + cached + private == self.size, (
            f"[RADIX-625] free {free} + cached {cached} + private {private} != size {self.size}"
        )
        evictable, protected = self.tree.evictable_size(), self.tree.protected_size()
        assert evictable + protected == cached, (
            f"[RADIX-625] evictable {evictable} + protected {protected} != cached {cached}: a node counted twice "
            "or not at all"
        )
        check = getattr(self.tree, "check_invariants", None)
        if check is not None:
            check()
        if self.checks_events:
            self.seen = apply_events(self.seen, self.tree.take_events())
            want = self.cached_pages()
            assert self.seen == want, (
                f"[RADIX-634] the events applied so far give {len(self.seen)} cached pages, the tree holds "
                f"{len(want)}: {len(self.seen - want)} reported but not cached, {len(want - self.seen)} cached "
                "but not reported"
            )

    def cached_pages(self) -> set[int]:
        """RADIX-635's hashes of the pages the tree holds: allocated slots outside live rows, at a page's end."""
        private = {s for r in self.live for s in r.row[r.cached :]}
        return {
            self.page_hash(namespace, prefix)
            for slot, (namespace, prefix) in self.shadow.items()
            if len(prefix) % self.page == 0 and slot not in private and self.alloc.is_allocated(slot)
        }

    def page_hash(self, namespace: object, key: tuple[int, ...]) -> int:
        """The hash of ``key``'s last page, chained as RADIX-635 chains it (remembered per prefix)."""
        known = self.hashes.get((namespace, key))
        if known is None:
            parent = key[: -self.page]
            if parent:
                known = hash_block(self.page_hash(namespace, parent), list(key[-self.page :]), None)
            else:
                known = page_hashes(list(key), self.page, namespace)[0]
            self.hashes[(namespace, key)] = known
        return known


def second_unlock_refused(tree: Any, receipt: Any) -> str | None:
    """None when a second ``unlock(receipt)`` raises RADIX-624 and changes nothing; else what went wrong."""
    before = (tree.total_size(), tree.evictable_size(), tree.protected_size())
    try:
        tree.unlock(receipt)
    except KVRefError as exc:
        if exc.rule != "RADIX-624":
            return f"a second unlock of {receipt} raised {exc!r}, citing {exc.rule}, not RADIX-624"
        after = (tree.total_size(), tree.evictable_size(), tree.protected_size())
        return (
            None
            if after == before
            else f"[RADIX-624] a refused unlock changed (total, evictable, protected) {before} -> {after}"
        )
    after = (tree.total_size(), tree.evictable_size(), tree.protected_size())
    return f"[RADIX-624] a second unlock of {receipt} was accepted: (total, evictable, protected) {before} -> {after}"


def radix(impl: Target, page: int, policy: str = "lru") -> tuple[Any, Any]:
    """A new allocator and tree of ``impl``, or a skip saying why it has none of that shape."""
    skip_without(impl, "radix-cache")
    try:
        pair: tuple[Any, Any] = impl.create_radix(24 * page, page_size=page, policy=policy, sort=page == 1)
        return pair
    except ConfigError as exc:
        pytest.skip(f"{impl.name}: {exc}")


class RadixCacheSuite(ConformanceSuite):
    """RADIX-620..RADIX-632 over the target's ``create_radix``."""

    @rule_ids("RADIX-622", "RADIX-623", "RADIX-625", "RADIX-627", "RADIX-628", "RADIX-630")
    @pytest.mark.parametrize("page", PAGES)
    def test_scheduler_traffic_keeps_slots_honest_and_conserved(self, impl: Target, page: int) -> None:
        radix(impl, page)  # skips a shape the target lacks
        machine = type(
            "RadixTraffic",
            (RadixSchedulerMachine,),
            {
                "target": impl,
                "page": page,
                "checks_receipts": impl.has("radix-receipts"),
                "checks_events": impl.has("radix-events"),
                "policies": tuple(p for p in POLICIES if p != "priority" or impl.has("radix-priority")),
            },
        )
        run_state_machine_as_test(machine)

    @rule_ids("RADIX-624")
    @pytest.mark.parametrize("page", PAGES)
    def test_a_second_unlock_of_one_receipt_is_refused(self, impl: Target, page: int) -> None:
        alloc, tree = radix(impl, page)
        tokens = tuple(range(2 * page))
        row = alloc.alloc(len(tokens)) or []
        tree.insert(tokens, row)
        hit = tree.match(tokens)
        receipt = tree.lock(hit.node)
        tree.unlock(receipt)
        problem = second_unlock_refused(tree, receipt)
        assert problem is None, problem

    @rule_ids("RADIX-633", "RADIX-628", "RADIX-625")
    @pytest.mark.parametrize("page", PAGES)
    def test_an_insert_over_the_capacity_evicts_back_to_it_and_spares_locked_paths(
        self, impl: Target, page: int
    ) -> None:
        skip_without(impl, "radix-capacity")
        size, cap = 24 * page, 4 * page
        alloc, tree = impl.create_radix(size, page_size=page, policy="lru", sort=page == 1, max_tokens=cap)

        def put(first: int, pages: int = 2) -> tuple[int, ...]:
            tokens = tuple(range(first, first + pages * page))
            row = alloc.alloc(len(tokens)) or []
            assert tree.insert(tokens, row) == 0, "each key here is new"
            return tokens

        def cached(tokens: tuple[int, ...]) -> int:
            return int(tree.match(tokens).length)

        a, b = put(1000), put(2000)
        assert tree.total_size() == cap, (
            f"[RADIX-633] two keys of 2 pages at a capacity of 4 pages: {tree.total_size()}"
        )
        receipt = tree.lock(tree.match(a).node)  # a is locked, and the most recent
        c = put(3000)  # 6 pages: the least recent unlocked leaf, b, goes
        assert (cached(a), cached(b), cached(c)) == (2 * page, 0, 2 * page), (
            f"[RADIX-633] after a third key over the capacity: a {cached(a)}, b {cached(b)}, c {cached(c)} tokens"
        )
        assert tree.total_size() == cap and alloc.available_size() == size - cap, (
            f"[RADIX-625] {tree.total_size()} cached, {alloc.available_size()} free of {size}: b's slots went back"
        )
        longer = tuple(range(1000, 1000 + 3 * page))  # a and one page more: 1 page over, c the least recent
        row = alloc.alloc(len(longer)) or []
        have = tree.insert(longer, row)
        assert have == 2 * page, f"[RADIX-623] a was cached: insert returned {have}"
        alloc.free(row[:have])  # the caller's duplicates of a's pages
        assert (cached(longer), cached(c)) == (3 * page, 0), (
            f"[RADIX-633] over by a page under a locked a: the longer key {cached(longer)}, c {cached(c)} tokens"
        )
        assert tree.total_size() == 3 * page and alloc.available_size() == size - 3 * page, "[RADIX-625]"
        tree.unlock(receipt)
        assert tree.protected_size() == 0 and tree.total_size() <= cap

    @rule_ids("RADIX-629", "RADIX-628")
    @pytest.mark.parametrize("walk", ["match", "insert"])
    @pytest.mark.parametrize("page", PAGES)
    def test_a_walk_ending_inside_a_node_leaves_the_part_it_did_not_walk_as_recent_as_before(
        self, impl: Target, page: int, walk: str
    ) -> None:
        """Key ``a`` of 4 pages, then ``b`` of 2; a match (or insert) of ``a``'s first 2 pages and one
        page more splits ``a`` and walks only its first half. Its other half was last used when ``a``
        was inserted, before ``b``: evicting 2 pages under lru frees it, and ``b`` stays."""
        alloc, tree = radix(impl, page)
        a = tuple(range(1000, 1000 + 4 * page))
        b = tuple(range(2000, 2000 + 2 * page))
        for key in (a, b):
            tree.insert(key, alloc.alloc(len(key)) or [])
        probe = a[: 2 * page] + tuple(range(3000, 3000 + page))
        if walk == "match":
            tree.match(probe)
        else:
            row = alloc.alloc(len(probe)) or []
            have = tree.insert(probe, row)
            alloc.free(row[:have])  # the caller's duplicates of the cached half
        freed = tree.evict(2 * page)
        kept_a, kept_b = int(tree.match(a).length), int(tree.match(b).length)
        assert (kept_a, kept_b) == (2 * page, 2 * page), (
            f"[RADIX-629] after {'a match' if walk == 'match' else 'an insert'} of {len(probe)} tokens ending "
            f"inside a's node and evict({2 * page}) "
            f"(freed {freed}): a keeps {kept_a} tokens and b {kept_b}; expected a's unwalked half evicted "
            f"(a keeps {2 * page}) and b kept ({2 * page}): the half the {walk} did not walk counted as accessed"
        )

    @rule_ids("RADIX-628", "RADIX-629")
    @pytest.mark.parametrize(("policy", "victim"), [("lru", "b"), ("mru", "a"), ("fifo", "a")])
    @pytest.mark.parametrize("page", PAGES)
    def test_eviction_takes_the_leaf_its_policy_names(self, impl: Target, page: int, policy: str, victim: str) -> None:
        """Keys ``a`` then ``b``, 2 pages each, then a match of ``a``: ``evict`` of 2 pages frees ``b``
        under lru (least recent access), ``a`` under mru (most recent) and ``a`` under fifo (oldest)."""
        alloc, tree = radix(impl, page, policy)
        keys = {"a": tuple(range(1000, 1000 + 2 * page)), "b": tuple(range(2000, 2000 + 2 * page))}
        for key in keys.values():
            tree.insert(key, alloc.alloc(len(key)) or [])
        tree.match(keys["a"])
        freed = tree.evict(2 * page)
        kept = {name: int(tree.match(key).length) for name, key in keys.items()}
        expected = {name: 0 if name == victim else 2 * page for name in keys}
        assert kept == expected, (
            f"[RADIX-628] under {policy}, after inserting a then b and matching a, evict({2 * page}) freed {freed} "
            f"and left {kept} tokens cached; expected {victim} evicted: {expected}"
        )

    @rule_ids("RADIX-628")
    @pytest.mark.parametrize("page", PAGES)
    def test_priority_evicts_the_lowest_priority_first_and_the_least_recent_among_equals(
        self, impl: Target, page: int
    ) -> None:
        """Keys a, b, c inserted with priorities 2, 0, 2, then a match of b: under ``priority`` the first
        ``evict`` of 2 pages frees b, lowest though used last, and the second frees a, the less recent
        of the two left at priority 2."""
        skip_without(impl, "radix-priority")
        alloc, tree = radix(impl, page, "priority")
        keys = {name: tuple(range(start, start + 2 * page)) for name, start in (("a", 1000), ("b", 2000), ("c", 3000))}
        for name, priority in (("a", 2), ("b", 0), ("c", 2)):
            tree.insert(keys[name], alloc.alloc(2 * page) or [], priority=priority)
        tree.match(keys["b"])
        first = tree.evict(2 * page)
        after_first = {name: int(tree.match(key).length) for name, key in keys.items()}
        tree.evict(2 * page)
        after_second = {name: int(tree.match(key).length) for name, key in keys.items()}
        assert after_first == {"a": 2 * page, "b": 0, "c": 2 * page}, (
            f"[RADIX-628] under priority, evict({2 * page}) freed {first} and left {after_first} tokens cached; "
            "expected b (priority 0) evicted though it was matched last"
        )
        assert after_second == {"a": 0, "b": 0, "c": 2 * page}, (
            f"[RADIX-628] under priority, a second evict({2 * page}) left {after_second}; expected a evicted: of a "
            "and c, both priority 2, a was accessed longer ago"
        )

    @rule_ids("RADIX-628", "RADIX-629")
    @pytest.mark.parametrize("page", PAGES)
    def test_lfu_evicts_the_leaf_of_fewer_requests_though_it_was_used_last(self, impl: Target, page: int) -> None:
        """Requests for keys a, b, a, a, b (each a match, an insert of the whole key and a free of the
        caller's duplicate slots, as a scheduler makes them): under lfu ``evict`` of 2 pages frees
        ``b``, hit by fewer requests, though ``b`` was used last (lru would free ``a``)."""
        alloc, tree = radix(impl, page, "lfu")
        keys = {"a": tuple(range(1000, 1000 + 2 * page)), "b": tuple(range(2000, 2000 + 2 * page))}
        for name in ("a", "b", "a", "a", "b"):
            key = keys[name]
            hit = tree.match(key)
            row = list(hit.slots) + (alloc.alloc(len(key) - int(hit.length)) or [])
            have = tree.insert(key, row)
            alloc.free(row[int(hit.length) : have])  # the caller's duplicates of what was cached
        freed = tree.evict(2 * page)
        kept = {name: int(tree.match(key).length) for name, key in keys.items()}
        assert kept == {"a": 2 * page, "b": 0}, (
            f"[RADIX-628] under lfu, after requests a, b, a, a, b, evict({2 * page}) freed {freed} and left {kept} "
            "tokens cached; expected b (two requests) evicted before a (three), though b was used last"
        )
