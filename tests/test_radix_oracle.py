"""Chapter 06 on the oracle: the token-slot allocator and the radix tree, rule by rule."""

from __future__ import annotations

import pytest

from kvref.contract.errors import (
    BlockIdError,
    CacheInUseError,
    HashConflictError,
    InvalidTypeError,
    InvalidValueError,
    KVRefError,
    NotHeldError,
    ReservedBlockError,
)
from kvref.oracle.radix import FreeGroupError, OracleRadixCache, OracleSlotAllocator

rule = pytest.mark.rule


def unchanged(obj: OracleSlotAllocator | OracleRadixCache, call: object, error: type[KVRefError], rule_id: str) -> None:
    """``call()`` raises ``error`` citing ``rule_id`` and leaves ``obj`` exactly as it was (ERR-501)."""
    before = obj.snapshot()
    with pytest.raises(error) as raised:
        call()  # type: ignore[operator]
    assert raised.value.rule == rule_id, f"raised {raised.value!r}, expected rule {rule_id}"
    assert obj.snapshot() == before, f"[ERR-501] the refused call {raised.value} changed the state"


# ------------------------------------------------------------------ allocator


@rule("RADIX-601")
@pytest.mark.parametrize(("size", "page"), [(0, 1), (10, 4), (3, 4), (8, 0)])
def test_an_allocator_is_made_of_whole_pages(size: int, page: int) -> None:
    with pytest.raises(InvalidValueError, match="RADIX-601"):
        OracleSlotAllocator(size, page_size=page)


@rule("RADIX-602", "RADIX-603")
@pytest.mark.parametrize("page", [1, 4])
def test_alloc_hands_out_whole_pages_never_page_zero_and_all_or_nothing(page: int) -> None:
    a = OracleSlotAllocator(8 * page, page_size=page)
    got = a.alloc(8 * page)
    assert got is not None and len(got) == 8 * page, f"alloc({8 * page}) of a fresh allocator gave {got}"
    assert min(got) == page, f"slots {got} include page 0 (slots < {page}), the padding page"
    pages = [got[i : i + page] for i in range(0, len(got), page)]
    assert all(p == list(range(p[0], p[0] + page)) and p[0] % page == 0 for p in pages), f"pages broken: {pages}"
    before = a.snapshot()
    assert a.alloc(page) is None, "alloc beyond the available slots must return None"
    assert a.snapshot() == before, "[RADIX-603] a refused alloc changed the allocator"
    unchanged(a, lambda: a.free([0]), ReservedBlockError, "RADIX-602")


@rule("RADIX-604")
def test_a_misaligned_alloc_is_an_error_never_a_short_result() -> None:
    a = OracleSlotAllocator(16, page_size=4)
    unchanged(a, lambda: a.alloc(6), InvalidValueError, "RADIX-604")
    assert a.alloc(0) == [], "alloc(0) gives no slots"


@rule("RADIX-605", "RADIX-607")
def test_a_free_group_releases_at_its_end_and_available_size_waits_for_it() -> None:
    a = OracleSlotAllocator(8)
    got = a.alloc(6)
    assert got is not None
    a.free_group_begin()
    a.free(got[:2])
    a.free(got[2:3])
    assert a.available_size() == 2, f"available_size {a.available_size()} counted frees of an open group"
    unchanged(a, lambda: a.free(got[1:2]), NotHeldError, "RADIX-606")  # freed earlier in the group
    unchanged(a, a.free_group_begin, FreeGroupError, "RADIX-607")
    a.free_group_end()
    assert a.available_size() == 5, f"after the group ends, available_size is {a.available_size()}, not 5"
    unchanged(a, a.free_group_end, FreeGroupError, "RADIX-607")


@rule("RADIX-606")
def test_free_releases_whole_pages_once_and_refuses_what_is_not_allocated() -> None:
    a = OracleSlotAllocator(16, page_size=4)
    got = a.alloc(8)
    assert got is not None
    a.free([got[1], got[2]])  # two slots of one page: the page, once
    assert a.available_size() == 12, f"freeing part of a page released {a.available_size() - 8} slots, not 4"
    unchanged(a, lambda: a.free([got[0]]), NotHeldError, "RADIX-606")  # the page is free already
    unchanged(a, lambda: a.free([got[4], 40]), BlockIdError, "RADIX-606")
    unchanged(a, lambda: a.free([got[4], got[0]]), NotHeldError, "RADIX-606")


@rule("RADIX-608", "RADIX-609")
def test_versions_detect_a_stale_slot_across_frees_and_clears() -> None:
    a = OracleSlotAllocator(4)
    (slot,) = a.alloc(1) or [0]
    version = a.version(slot)
    assert a.is_current(slot, version), "a slot just handed out must be current at its version"
    a.free([slot])
    assert not a.is_current(slot, version), "a freed slot's old version must be stale"
    a.clear()
    again = a.alloc(4) or []
    assert slot in again and a.version(slot) == version + 1, f"re-allocation must bump the version of {slot}"
    a.clear()
    assert not a.is_current(slot, version + 1), "[RADIX-609] clear must free every slot, leaving old pairs stale"
    assert a.free_order() == [1, 2, 3, 4], f"after clear the free pages are {a.free_order()}, not ascending"


@rule("RADIX-610", "RADIX-611")
@pytest.mark.parametrize("sort", [True, False])
def test_freed_pages_come_back_in_the_order_of_the_profile(sort: bool) -> None:
    a = OracleSlotAllocator(6, sort=sort)
    got = a.alloc(6) or []
    a.free([got[4]])
    a.free([got[1]])
    a.check_invariants()
    assert a.alloc(2) == ([2, 5] if sort else [5, 2]), f"sort={sort}: freed pages 5 then 2 came back wrongly"
    a.check_invariants()


# ------------------------------------------------------------------------ tree


def tree(size: int = 32, page: int = 1, policy: str = "lru") -> OracleRadixCache:
    return OracleRadixCache(OracleSlotAllocator(size, page_size=page), policy=policy)


def cache(t: OracleRadixCache, tokens: list[int], namespace: object = None, priority: int = 0) -> list[int]:
    """Allocate for ``tokens``, insert, and free the duplicates the insert did not take."""
    slots = t.allocator.alloc(len(tokens)) or []
    have = t.insert(tokens, slots, namespace=namespace, priority=priority)
    if have:
        t.allocator.free(slots[:have])
    return slots


@rule("RADIX-620", "RADIX-622")
def test_a_match_returns_the_slots_inserted_for_its_tokens_in_its_namespace_only() -> None:
    t = tree()
    slots = cache(t, [1, 2, 3, 4], namespace="lora-a")
    m = t.match([1, 2, 3, 9], namespace="lora-a")
    assert (m.length, m.slots) == (3, slots[:3]), f"match gave {m}; the first 3 tokens are cached at {slots[:3]}"
    other = t.match([1, 2, 3, 4], namespace="lora-b")
    assert other.length == 0 and other.slots == [], f"another namespace matched {other}"
    assert t.total_size() == 4 and t.protected_size() == 0, "[RADIX-622] a match must pin nothing"


@rule("RADIX-621")
def test_keys_count_in_whole_pages_and_inserts_cover_whole_pages() -> None:
    t = tree(32, page=4)
    cache(t, [1, 2, 3, 4, 5, 6, 7, 8])
    assert t.match([1, 2, 3, 4, 5, 6, 7]).length == 4, "a key is matched up to its last whole page"
    slots = t.allocator.alloc(4) or []
    unchanged(t, lambda: t.insert([9, 9, 9], slots[:3]), InvalidValueError, "RADIX-621")
    unchanged(t, lambda: t.insert([9, 9, 9, 9], slots[:3]), InvalidValueError, "ERR-506")


@rule("RADIX-623", "RADIX-627")
def test_insert_keeps_what_is_cached_and_says_how_much_was() -> None:
    t = tree()
    first = cache(t, [1, 2, 3])
    second = t.allocator.alloc(5) or []
    have = t.insert([1, 2, 7, 8, 9], second)
    assert have == 2, f"insert returned {have}; tokens 1, 2 were cached already"
    assert t.match([1, 2, 3]).slots == first, "[RADIX-623] the slots already cached must be kept"
    assert t.match([1, 2, 7, 8, 9]).slots == first[:2] + second[2:], "the new part must be stored with its slots"
    assert t.total_size() == 6, f"after a split the tree holds {t.total_size()} tokens, not 6"
    t.allocator.free(second[:2])  # the caller's duplicates
    t.check_invariants()


@rule("RADIX-626")
def test_a_slot_is_never_stored_twice_nor_unallocated() -> None:
    t = tree()
    slots = cache(t, [1, 2])
    unchanged(t, lambda: t.insert([5, 6], slots), HashConflictError, "RADIX-626")
    unchanged(t, lambda: t.insert([5, 6], [20, 21]), NotHeldError, "RADIX-626")


@rule("RADIX-624", "RADIX-625")
def test_locks_protect_a_path_and_an_unlock_without_its_lock_is_refused() -> None:
    t = tree()
    cache(t, [1, 2, 3, 4])
    cache(t, [1, 2, 9])
    m = t.match([1, 2, 3, 4])
    receipt = t.lock(m.node)
    assert (t.protected_size(), t.evictable_size()) == (4, 1), "the locked path is protected, the other leaf not"
    assert t.evict(10) == 1 and t.total_size() == 4, "eviction must skip the locked path"
    t.unlock(receipt)
    unchanged(t, lambda: t.unlock(receipt), NotHeldError, "RADIX-624")
    a = t.allocator
    assert a.available_size() + t.total_size() == a.size, "[RADIX-625] free + cached must be the allocator's size"
    t.check_invariants()


@rule("RADIX-628", "RADIX-629")
@pytest.mark.parametrize(("policy", "evicted"), [("lru", 3), ("mru", 1), ("fifo", 1), ("lfu", 3), ("priority", 3)])
def test_eviction_takes_the_first_leaf_in_the_policys_order(policy: str, evicted: int) -> None:
    t = tree(policy=policy)
    for token, priority in ((1, 2), (2, 1), (3, 0)):  # created in this order, priorities 2, 1, 0
        cache(t, [token], priority=priority)
    for token in (1, 2, 2, 1):  # accessed last: 1, then 2, then 3; hits: 1 twice, 2 twice, 3 never
        t.match([token])
    assert t.evict(1) == 1, "evict(1) must free one token"
    gone = [token for token in (1, 2, 3) if t.match([token]).length == 0]
    assert gone == [evicted], f"{policy} evicted {gone}; the policy's first leaf holds token {evicted}"


@rule("RADIX-628")
def test_evict_frees_whole_nodes_at_least_what_was_asked() -> None:
    t = tree(64, page=2)
    cache(t, [1, 2, 3, 4, 5, 6])
    cache(t, [7, 8])
    freed = t.evict(3)
    assert 3 <= freed <= 3 + 6 - 1, f"evict(3) freed {freed}: at least 3, at most one node past"
    assert t.evict(100) == 8 - freed, "evict of more than there is frees all that is evictable"
    assert t.allocator.available_size() == 64, "every slot must be back in the allocator"


@rule("RADIX-630", "RADIX-632")
def test_reset_frees_everything_and_is_refused_while_locked() -> None:
    t = tree()
    cache(t, [1, 2, 3])
    receipt = t.lock(t.match([1, 2]).node)
    unchanged(t, t.reset, CacheInUseError, "RADIX-630")
    t.unlock(receipt)
    t.reset()
    assert t.total_size() == 0 and t.allocator.available_size() == 32, "reset must free every cached slot"
    s = t.stats
    assert (s.matches, s.queried_tokens, s.hit_tokens, s.resets) == (1, 2, 2, 1), f"stats {s}"


@pytest.mark.rule("RADIX-612")
def test_a_steps_allocation_refuses_a_set_and_checks_every_count_first() -> None:
    a = OracleSlotAllocator(8, page_size=2)
    with pytest.raises(InvalidTypeError, match="ERR-503"):
        a.alloc_many({2, 4})  # type: ignore[arg-type]  # a set, on purpose
    with pytest.raises(InvalidValueError, match="RADIX-604"):
        a.alloc_many([2, 3, 100])
    assert a.available_size() == 8, "refused steps must take nothing"
    assert a.alloc_many([2, 4]) == [[2, 3], [4, 5, 6, 7]], "a step is one alloc of the sum, split in order"


@pytest.mark.rule("RADIX-633")
def test_a_capacity_is_a_positive_token_count_or_none() -> None:
    slots = OracleSlotAllocator(16)
    assert OracleRadixCache(slots).max_tokens is None
    assert OracleRadixCache(slots, max_tokens=8).max_tokens == 8
    with pytest.raises(
        InvalidValueError, match=r"^\[RADIX-633\] OracleRadixCache: max_tokens must be None or at least 1"
    ):
        OracleRadixCache(slots, max_tokens=0)
    with pytest.raises(InvalidTypeError, match=r"^\[RADIX-633\] OracleRadixCache: max_tokens must be an integer"):
        OracleRadixCache(slots, max_tokens="8")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match=r"^\[RADIX-633\] OracleRadixCache: max_tokens must be >= 0, got -1"):
        OracleRadixCache(slots, max_tokens=-1)


@pytest.mark.rule("RADIX-633", "ERR-501")
def test_an_eviction_the_allocator_refuses_leaves_its_node_cached() -> None:
    slots = OracleSlotAllocator(16)
    tree = OracleRadixCache(slots, max_tokens=4)
    row = slots.alloc(4) or []
    tree.insert((1, 2, 3, 4), row)
    slots.free(row[3:])  # behind the tree's back: its eviction of this node must fail
    with pytest.raises(NotHeldError):
        tree.insert((9, 9), slots.alloc(2) or [])
    assert tree.match((1, 2, 3, 4)).length == 4 and tree.total_size() == 6, "the refused node stays cached"
    assert slots.available_size() == 16 - 2 - 3, "nothing was freed by the refused eviction"


@pytest.mark.rule("RADIX-633", "RADIX-628", "RADIX-632")
@pytest.mark.parametrize(("policy", "kept"), [("lru", [(3, 4)]), ("mru", [(1, 2)])])
def test_the_capacity_evicts_by_the_policy_even_what_the_insert_just_stored(
    policy: str, kept: list[tuple[int, int]]
) -> None:
    slots = OracleSlotAllocator(16)
    tree = OracleRadixCache(slots, policy=policy, max_tokens=2)
    tree.insert((1, 2), slots.alloc(2) or [])
    tree.insert((3, 4), slots.alloc(2) or [])  # 4 tokens: 2 over
    left = [k for k in [(1, 2), (3, 4)] if tree.match(k).length == 2]
    assert left == kept, f"[RADIX-633] under {policy} the tree kept {left}, expected {kept}"
    assert tree.total_size() == 2 and slots.available_size() == 14 and tree.stats.evicted_tokens == 2
    tree.check_invariants()
