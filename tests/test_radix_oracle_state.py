"""Chapter 06 on the oracle: its self-checks catch every corruption, its snapshot sees every change,
and the keys a node carries (time, hits, priority, locks) survive a split and order eviction.

The corruption tests break one invariant at a time through the oracle's private state, as a bug
in it would, and expect ``check_invariants`` to name the rule: a self-check that cannot fail
checks nothing.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from kvref.contract.errors import InvariantViolation
from kvref.oracle.radix import OracleRadixCache, OracleSlotAllocator
from kvref.oracle.radix.nodes import page_key

rule = pytest.mark.rule


def tree(size: int = 32, page: int = 1, policy: str = "lru") -> OracleRadixCache:
    return OracleRadixCache(OracleSlotAllocator(size, page_size=page), policy=policy)


def cache(t: OracleRadixCache, tokens: list[int], priority: int = 0) -> list[int]:
    """Allocate for ``tokens``, insert, and free the duplicates the insert did not take."""
    slots = t.allocator.alloc(len(tokens)) or []
    have = t.insert(tokens, slots, priority=priority)
    if have:
        t.allocator.free(slots[:have])
    return slots


def violation(check: Callable[[], None], rule_id: str, says: str) -> None:
    """``check()`` raises InvariantViolation citing ``rule_id``, its message a report of ``says``."""
    with pytest.raises(InvariantViolation) as raised:
        check()
    message = str(raised.value)
    assert raised.value.rule == rule_id, f"the corruption was reported as {message!r}; it breaks {rule_id}"
    assert message.startswith(f"[{rule_id}] check_invariants: "), f"{message!r} does not name its check"
    assert says in message, f"{message!r} does not say {says!r}"


# ------------------------------------------------------------- the allocator's self-check

ALLOCATOR_CORRUPTIONS: list[tuple[str, Callable[[Any], object], str, str]] = [
    ("a free page listed twice", lambda a: a._free.extend([*a._free][:1]), "RADIX-611", "a page is listed twice"),
    ("page 0 among the free", lambda a: a._free.extend([0]), "RADIX-602", "page 0 or an unknown page"),
    ("an unknown page among the free", lambda a: a._free.extend([99]), "RADIX-602", "page 0 or an unknown page"),
    ("an allocated page also free", lambda a: a._free.extend([1]), "RADIX-611", "an allocated page is also free"),
    ("a page lost", lambda a: a._free.take(1), "RADIX-611", "2 allocated + 1 free != 4 pages"),
    ("page 0 allocated", lambda a: a._allocated.add(0), "RADIX-602", "page 0, the padding page, is marked"),
    (
        "a free page in the open group",
        lambda a: (a.free_group_begin(), a._group.update({4: None})),
        "RADIX-607",
        "a page in the open group is not allocated",
    ),
]


@rule("RADIX-602", "RADIX-607", "RADIX-611")
@pytest.mark.parametrize(
    ("case", "corrupt", "rule_id", "says"), ALLOCATOR_CORRUPTIONS, ids=[c[0] for c in ALLOCATOR_CORRUPTIONS]
)
def test_the_allocators_self_check_names_each_corruption(
    case: str, corrupt: Callable[[Any], object], rule_id: str, says: str
) -> None:
    a = OracleSlotAllocator(4, sort=True)
    a.alloc(2)  # pages 1 and 2 allocated, 3 and 4 free
    a.check_invariants()
    corrupt(a)
    violation(a.check_invariants, rule_id, says)


@rule("RADIX-610")
def test_the_allocators_self_check_finds_a_release_list_without_sort() -> None:
    a = OracleSlotAllocator(4, sort=False)
    a._released.extend(a._free.take(1))
    violation(a.check_invariants, "RADIX-610", "pages wait in the release list without sort")


# ------------------------------------------------------------------ the tree's self-check


def branched() -> OracleRadixCache:
    """Page 2: ``[1, 2]`` with children ``[3, 4]`` (locked) and ``[5, 6]``, and ``[7, 8]`` in namespace "b"."""
    t = tree(32, page=2)
    cache(t, [1, 2, 3, 4])
    cache(t, [1, 2, 5, 6])
    slots = t.allocator.alloc(2) or []
    t.insert([7, 8], slots, namespace="b")
    t.lock(t.match([1, 2, 3, 4]).node)
    t.check_invariants()
    return t


def node(t: OracleRadixCache, tokens: list[int], namespace: object = None) -> Any:
    """The node a match of ``tokens`` ends at (read through the tree's private index, as a corruption would)."""
    return t._nodes[t.match(tokens, namespace=namespace).node]


def recut(n: Any, keep: int) -> None:
    """Cut node ``n`` to its first ``keep`` tokens and slots, whole pages or not."""
    n.tokens, n.slots = n.tokens[:keep], n.slots[:keep]


def root(t: OracleRadixCache) -> Any:
    return t._roots[None]


TREE_CORRUPTIONS: list[tuple[str, Callable[[Any], object], str, str]] = [
    (
        "a removed node still listed",
        lambda t: setattr(node(t, [1, 2, 5, 6]), "alive", False),
        "RADIX-620",
        "is listed but was removed",
    ),
    ("a root with tokens", lambda t: setattr(root(t), "tokens", (9, 9)), "RADIX-620", "holds tokens, slots or locks"),
    ("a root with slots", lambda t: setattr(root(t), "slots", [30]), "RADIX-620", "holds tokens, slots or locks"),
    ("a root with a lock", lambda t: setattr(root(t), "locks", 1), "RADIX-620", "holds tokens, slots or locks"),
    (
        "a node without tokens",
        lambda t: setattr(node(t, [1, 2, 5, 6]), "tokens", ()),
        "RADIX-621",
        "holds 0 tokens and 2 slots",
    ),
    (
        "a node with part of a page",
        lambda t: setattr(node(t, [1, 2, 5, 6]), "tokens", (5,)),
        "RADIX-621",
        "holds 1 tokens and 2 slots; both must be the same positive multiple of the page (2)",
    ),
    (
        "a node with part of a page and its slot",
        lambda t: recut(node(t, [1, 2, 5, 6]), 1),
        "RADIX-621",
        "holds 1 tokens and 1 slots",
    ),
    (
        "a node with no tokens and no slots",
        lambda t: recut(node(t, [1, 2, 5, 6]), 0),
        "RADIX-621",
        "holds 0 tokens and 0 slots",
    ),
    (
        "a node with a slot too few",
        lambda t: node(t, [1, 2, 5, 6]).slots.pop(),
        "RADIX-621",
        "holds 2 tokens and 1 slots",
    ),
    (
        "a child under a removed parent",
        lambda t: setattr(node(t, [1, 2]), "alive", False),
        "RADIX-627",
        "is not its parent's child under its first page",
    ),
    (
        "a child its parent does not list",
        lambda t: node(t, [1, 2]).children.pop(page_key(array("Q", [5, 6]), 0, 2)),
        "RADIX-627",
        "is not its parent's child under its first page",
    ),
    (
        "a child in another namespace",
        lambda t: setattr(node(t, [1, 2, 5, 6]), "namespace", "b"),
        "RADIX-620",
        "shares a parent across namespaces",
    ),
    (
        "a slot recorded under another node",
        lambda t: t._owner.__setitem__(node(t, [1, 2, 5, 6]).slots[0], node(t, [1, 2])),
        "RADIX-626",
        "is recorded as held by another node",
    ),
    (
        "a slot recorded that no node holds",
        lambda t: t._owner.__setitem__(30, node(t, [1, 2])),
        "RADIX-626",
        "9 slots recorded as held, the nodes hold 8",
    ),
    (
        "a held slot free in the allocator",
        lambda t: t.allocator._allocated.discard(node(t, [1, 2, 5, 6]).slots[0] // 2),
        "RADIX-626",
        "which the allocator counts as free",
    ),
    (
        "a lock count off by one",
        lambda t: setattr(node(t, [1, 2, 5, 6]), "locks", 1),
        "RADIX-624",
        "counts 1 locks; the receipts held give 0",
    ),
    (
        "a protected size off",
        lambda t: setattr(t, "_protected", 5),
        "RADIX-625",
        "protected size 5, the locked nodes hold 4 tokens",
    ),
    (
        "the allocator's own state broken",
        lambda t: t.allocator._free.extend([0]),
        "RADIX-602",
        "page 0 or an unknown page",
    ),
]


@rule("RADIX-620", "RADIX-621", "RADIX-624", "RADIX-625", "RADIX-626", "RADIX-627", "RADIX-611")
@pytest.mark.parametrize(("case", "corrupt", "rule_id", "says"), TREE_CORRUPTIONS, ids=[c[0] for c in TREE_CORRUPTIONS])
def test_the_trees_self_check_names_each_corruption(
    case: str, corrupt: Callable[[Any], object], rule_id: str, says: str
) -> None:
    t = branched()
    corrupt(t)
    violation(t.check_invariants, rule_id, says)


# ------------------------------------------------------------------------- snapshots


@rule("ERR-501")
def test_the_allocators_snapshot_has_its_documented_fields_and_sees_every_change() -> None:
    a = OracleSlotAllocator(4, sort=True)
    seen = [a.snapshot()]
    assert set(seen[0]) == {"free", "released", "allocated", "version", "group"}, f"fields {sorted(seen[0])}"
    steps: list[Callable[[], object]] = [
        lambda: a.alloc(2),
        lambda: a.free([1]),
        a.free_group_begin,
        lambda: a.free([2]),
        a.free_group_end,
    ]
    for step in steps:
        step()
        seen.append(a.snapshot())
        assert seen[-1] != seen[-2], f"[ERR-501] the snapshot missed a change; it is {seen[-1]}"
    assert seen[3]["group"] == [] and seen[4]["group"] == [2], "an open group and its pages are state"


@rule("ERR-501")
def test_the_trees_snapshot_has_its_documented_fields_and_sees_every_change() -> None:
    t = tree(16, page=1)
    seen = [t.snapshot()]
    assert set(seen[0]) == {"nodes", "receipts", "protected", "stats"}, f"fields {sorted(seen[0])}"
    cache(t, [1, 2, 3])
    seen.append(t.snapshot())
    t.match([1, 2])  # splits [1, 2, 3]: the new parent is state
    seen.append(t.snapshot())
    receipt = t.lock(t.match([1, 2]).node)
    seen.append(t.snapshot())
    assert seen[1]["nodes"] != seen[0]["nodes"] != seen[2]["nodes"] != seen[1]["nodes"], "inserts and splits are state"
    parents = {v[3] for v in seen[2]["nodes"].values()}
    assert len(parents - {None}) == 2, f"a split node's parent is the new node, and the root is another: {parents}"
    assert seen[3]["receipts"] == [receipt.ident] and seen[3]["protected"] == 2, f"locks are state: {seen[3]}"


# ---------------------------------------------------------------- statistics and misses


@rule("RADIX-622", "RADIX-632")
def test_a_miss_names_no_node_and_a_match_in_an_unknown_namespace_makes_no_root() -> None:
    t = tree()
    cache(t, [1, 2])
    assert t.match([7]).node == 0, "a miss ends at no node: 0, which a lock locks nothing with"
    nodes = t.snapshot()["nodes"]
    assert t.match([1, 2], namespace="nobody").length == 0 and t.snapshot()["nodes"] == nodes, "a match made a root"
    s = t.stats
    assert (s.matches, s.queried_tokens, s.hit_tokens) == (2, 3, 0), f"two matches of 3 tokens, no hit: {s}"
    assert t.evict(5) == 2 and t.stats.evicted_tokens == 2, f"evicted tokens are counted: {t.stats}"


# ------------------------------------------------------------------ eviction keys


@rule("RADIX-628", "RADIX-629")
@pytest.mark.parametrize("policy", ["lru", "fifo", "lfu", "priority"])
def test_a_split_node_keeps_the_keys_of_the_node_it_was_cut_from(policy: str) -> None:
    """``[9]`` is older, hit less and of lower priority than ``[1, 2, 3, 4]``; after a match splits
    the latter and its tail is evicted, its head ``[1, 2]`` must still outrank ``[9]``."""
    t = tree(32, page=1, policy=policy)
    cache(t, [9], priority=1)
    nine = t.match([9]).node
    t.match([9])
    cache(t, [1, 2, 3, 4], priority=2)
    for _ in range(2):
        t.match([1, 2, 3, 4])
    t.match([1, 2])  # the split: [1, 2] over [3, 4]
    receipt = t.lock(nine)
    assert t.evict(1) == 2, "with [9] locked, the tail [3, 4] is the one leaf to evict"
    t.unlock(receipt)
    assert t.evict(1) == 1, "evict(1) frees one leaf of one token"
    kept = [key for key in ([9], [1, 2]) if t.match(key).length]
    assert kept == [[1, 2]], (
        f"{policy} evicted the split head [1, 2] before [9]: the head lost the keys it was cut with"
    )


@rule("RADIX-624", "RADIX-627")
def test_a_split_of_a_locked_node_keeps_its_lock_on_both_parts() -> None:
    t = tree()
    cache(t, [1, 2, 3, 4])
    receipt = t.lock(t.match([1, 2, 3, 4]).node)
    t.match([1, 2])  # split inside the locked node
    t.check_invariants()
    assert (t.protected_size(), t.evict(10)) == (4, 0), "both parts of a locked node stay locked"
    t.unlock(receipt)
    t.check_invariants()
    assert (t.protected_size(), t.evict(10)) == (0, 4), "the unlock frees both parts for eviction"


@rule("RADIX-628", "RADIX-629")
def test_lru_ignores_priority_lfu_counts_hits_and_priority_defaults_to_zero() -> None:
    t = tree(policy="lru")
    cache(t, [1], priority=5)
    cache(t, [2])
    assert t.evict(1) == 1 and t.match([1]).length == 0, "lru evicts the least recent leaf, whatever its priority"
    t = tree(policy="lfu")
    cache(t, [1])
    cache(t, [2])
    for _ in range(3):
        t.match([1])
    t.match([2])  # [2] is the most recent, with fewer hits
    assert t.evict(1) == 1 and t.match([2]).length == 0, "lfu evicts the leaf with the fewest hits first"
    t = tree(policy="priority")
    cache(t, [1], priority=1)
    t.insert([2], t.allocator.alloc(1) or [])  # newer, no priority given
    assert t.evict(1) == 1 and t.match([2]).length == 0, "an insert without a priority has priority 0"
    t = tree(policy="lru")
    cache(t, [1])
    t.match([1])
    cache(t, [2])  # inserted last: the most recent access
    assert t.evict(1) == 1 and t.match([1]).length == 0, "an insert is an access of the leaf it makes"


@rule("RADIX-628")
def test_eviction_order_survives_the_compaction_of_stale_entries() -> None:
    t = tree(policy="lru")
    cache(t, [1])
    cache(t, [2])
    for _ in range(60):  # each match re-enters its leaf: stale entries pile up past the live nodes
        t.match([2])
        t.match([1])
    t.match([2])
    cache(t, [3])  # an insert compacts
    order = []
    for _ in range(3):
        assert t.evict(1) == 1, "every leaf is still evictable after the compaction"
        order.append(next(k for k in (1, 2, 3) if k not in order and t.match([k]).length == 0))
    assert order == [1, 2, 3], f"after compaction lru evicted in the order {order}, not least recent first"


# ------------------------------------------------------------------------- the allocator


@rule("RADIX-610")
def test_released_pages_merge_only_when_the_free_list_runs_short() -> None:
    a = OracleSlotAllocator(8, sort=True)
    a.alloc(6)
    a.free([1])  # page 1 waits in the release list; pages 7 and 8 are free
    assert a.free_order() == [1, 7, 8], "free_order merges as an alloc that runs short would"
    assert a.alloc(2) == [7, 8], "an alloc the free list covers takes it without merging the released page"
    assert a.alloc(1) == [1], "the released page comes back when the free list runs short"
    a = OracleSlotAllocator(4, sort=False)
    a.alloc(4)
    a.free([3])
    a.free([1])
    assert a.free_order() == [3, 1], "without sort pages come back in release order"


class WithoutSelfCheck:
    """An allocator of chapter 06's shape with no ``check_invariants`` of its own (a device one's may lack it)."""

    def __init__(self, inner: OracleSlotAllocator) -> None:
        self.inner = inner
        self.page_size, self.num_pages, self.size = inner.page_size, inner.num_pages, inner.size

    def is_allocated(self, slot: int) -> bool:
        return self.inner.is_allocated(slot)

    def alloc(self, need_size: int) -> list[int] | None:
        return self.inner.alloc(need_size)

    def free(self, indices: Sequence[int]) -> None:
        self.inner.free(indices)

    def available_size(self) -> int:
        return self.inner.available_size()


@rule("RADIX-620")
def test_the_trees_self_check_runs_over_an_allocator_without_one() -> None:
    t = OracleRadixCache(WithoutSelfCheck(OracleSlotAllocator(8)))
    cache(t, [1, 2, 3])
    t.check_invariants()  # the tree's own checks, and none of the allocator's


@rule("RADIX-622", "RADIX-624")
def test_a_lock_receipt_names_its_node_and_a_node_its_whole_key() -> None:
    t = tree(16, page=2)
    slots = cache(t, [1, 2, 3, 4])
    cache(t, [1, 2, 5, 6])
    m = t.match([1, 2, 3, 4])
    receipt, nothing = t.lock(m.node), t.lock(0)
    assert (receipt.node, nothing.node) == (m.node, 0), f"receipts {receipt}, {nothing} must name the node locked"
    assert t.node_tokens(m.node) == (1, 2, 3, 4) and t.node_tokens(0) == (), "a node's tokens run from the root"
    assert t.cached_slots() == frozenset(slots) | set(t.match([1, 2, 5, 6]).slots), "cached_slots is every slot held"
