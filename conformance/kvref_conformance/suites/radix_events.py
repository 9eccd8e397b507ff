"""Chapter 06's KV events of the radix tree (RADIX-634..RADIX-637): one per page, chained as chapter 02 chains hashes.

For any target with ``radix-events``. Each test checks the events against the pages the tree holds,
found by ``match`` and hashed here, so that a router that applies them sees exactly the cache.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import pytest

from kvref.contract.errors import ConfigError
from kvref.contract.events import AllBlocksCleared, BlockRemoved, BlockStored, apply_events
from kvref_conformance.suites.base import ConformanceSuite, requires, rule
from kvref_conformance.suites.radix import PAGES, page_hashes
from kvref_conformance.target import Target

__all__ = ["RadixEventsSuite"]


def cached_pages(tree: Any, keys: list[tuple[list[int], Hashable]], page: int) -> set[int]:
    """The hashes of every page of ``keys`` the tree holds now (matching counts as an access only)."""
    held: set[int] = set()
    for key, namespace in keys:
        length = tree.match(key, namespace=namespace).length
        held.update(page_hashes(key, page, namespace)[: length // page])
    return held


@requires("radix-events")
class RadixEventsSuite(ConformanceSuite):
    """RADIX-634..RADIX-637 over the target's ``create_radix(..., enable_events=True)``."""

    @staticmethod
    def tree(impl: Target, page: int) -> tuple[Any, Any]:
        """A new allocator and tree with events, or a skip where the target has none of pages of ``page``."""
        try:
            return impl.create_radix(32 * page, page_size=page, enable_events=True)  # type: ignore[no-any-return]
        except ConfigError as exc:
            pytest.skip(f"{impl.name}: {exc}")

    @rule("RADIX-634", "RADIX-635")
    @pytest.mark.parametrize("page", PAGES)
    def test_an_insert_reports_each_page_it_stores_chained_on_the_one_before(self, impl: Target, page: int) -> None:
        allocator, tree = self.tree(impl, page)
        key = list(range(10, 10 + 3 * page))
        tree.insert(key, allocator.alloc(len(key)))
        want = page_hashes(key, page)
        got = tree.take_events()
        assert got == [BlockStored(h, p) for h, p in zip(want, [None, *want[:-1]], strict=True)], (
            f"[RADIX-635] inserting 3 pages reported {got}; the rule's hashes are {want}"
        )
        assert tree.take_events() == [], "[RADIX-634] events are taken once"

    @rule("RADIX-635")
    @pytest.mark.parametrize("page", PAGES)
    def test_a_page_stored_below_a_cached_key_names_its_last_page_as_parent(self, impl: Target, page: int) -> None:
        allocator, tree = self.tree(impl, page)
        key = list(range(10, 10 + 2 * page))
        tree.insert(key, allocator.alloc(len(key)))
        tree.take_events()
        longer = [*key, *range(50, 50 + page)]
        tree.insert(longer, [*tree.match(key).slots, *allocator.alloc(page)])  # a new node below the cached one
        want = page_hashes(longer, page)
        got = tree.take_events()
        assert got == [BlockStored(want[2], want[1])], (
            f"[RADIX-635] a page stored below the cached {key} reported {got}; the rule's event is "
            f"BlockStored({want[2]}, parent {want[1]}), chained on the cached key's last page"
        )

    @rule("RADIX-634", "RADIX-635")
    @pytest.mark.parametrize("page", PAGES)
    def test_equal_pages_at_two_places_are_stored_and_removed_under_their_own_hashes(
        self, impl: Target, page: int
    ) -> None:
        allocator, tree = self.tree(impl, page)
        key = [5] * page + [6] * page + [5] * page + [6] * page  # pages 0 and 2 equal, 1 and 3 equal
        tree.insert(key, allocator.alloc(len(key)))
        stored = tree.take_events()
        tree.evict(len(key))
        removed = tree.take_events()
        want = page_hashes(key, page)
        assert len(set(want)) == 4, "equal pages at different places must hash apart"
        assert sorted(e.block_hash for e in stored) == sorted(want), (
            f"[RADIX-635] a key whose pages repeat stored {stored}; the rule's hashes are {want}"
        )
        assert sorted(e.block_hash for e in removed) == sorted(want), (
            f"[RADIX-635] evicting a key whose pages repeat removed {removed}; the rule's hashes are {want}"
        )

    @rule("RADIX-637", "RADIX-627")
    def test_a_split_reports_nothing(self, impl: Target) -> None:
        allocator, tree = self.tree(impl, 1)
        tree.insert([1, 2, 3, 4], allocator.alloc(4))
        tree.take_events()
        tree.insert([1, 2, 9], [*tree.match([1, 2]).slots, *allocator.alloc(1)])  # splits [1..4] after 2
        got = tree.take_events()
        assert got == [BlockStored(page_hashes([1, 2, 9], 1)[2], page_hashes([1, 2], 1)[1])], (
            f"[RADIX-637] the split changed no page, so only the new page 9 is reported; got {got}"
        )

    @rule("RADIX-636")
    def test_a_namespace_salts_its_first_page(self, impl: Target) -> None:
        allocator, tree = self.tree(impl, 1)
        tree.insert([1, 2], allocator.alloc(2))
        tree.take_events()
        tree.insert([1, 2], allocator.alloc(2), namespace="adapter-a")
        first = page_hashes([1, 2], 1, "adapter-a")
        assert first[0] != page_hashes([1, 2], 1)[0], "a namespace's first page must hash apart from the default's"
        got = tree.take_events()
        assert got == [BlockStored(first[0], None), BlockStored(first[1], first[0])], (
            f"[RADIX-636] another namespace's first page carries the namespace as its salt; got {got}"
        )

    @rule("RADIX-634", "RADIX-628", "RADIX-630")
    @pytest.mark.parametrize("page", PAGES)
    def test_applying_the_events_gives_exactly_the_cached_pages(self, impl: Target, page: int) -> None:
        allocator, tree = self.tree(impl, page)
        keys: list[tuple[list[int], Hashable]] = []
        seen: set[int] = set()
        for i, namespace in enumerate([None, None, "b", None, "b"]):
            key = [7] * (2 * page) + [100 + i] * (page * (1 + i % 3))
            slots = allocator.alloc(len(key))
            have = tree.insert(key, slots, namespace=namespace)
            allocator.free(slots[:have])  # the part already cached: the caller's duplicates (RADIX-623)
            keys.append((key, namespace))
            seen = apply_events(seen, tree.take_events())
            assert seen == cached_pages(tree, keys, page), f"[RADIX-634] after insert {i}: the events disagree"
        for tokens in (page, 3 * page, 100 * page):
            tree.evict(tokens)
            events = tree.take_events()
            assert all(isinstance(e, BlockRemoved) for e in events), f"[RADIX-634] an eviction reported {events}"
            seen = apply_events(seen, events)
            assert seen == cached_pages(tree, keys, page), f"[RADIX-634] after evicting {tokens}: events disagree"
        tree.insert(keys[0][0], allocator.alloc(len(keys[0][0])))
        tree.reset()
        events = tree.take_events()
        assert events[-1] == AllBlocksCleared() and apply_events(seen, events) == set(), f"[RADIX-634] reset: {events}"
