"""The array core's self-check, branch by branch: each corruption of its arrays is reported under its
rule with a message that says what was seen (ERR-508), as ``tests/test_state_reports.py`` does for
the oracle.

The pool is the CuPy backend's, on its NumPy host path where there is no CUDA device, so its arrays
can be written here directly. Each case breaks one thing and leaves every check before it passing,
so the branch it names is the one that reports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvref.contract.errors import InvariantViolation
from kvref_conformance.suites.base import cache_chain
from kvref_conformance.target import Target
from tests.refusals import refused

rule = pytest.mark.rule


def lived_in(policy: str = "lru") -> Any:
    """An array pool of 12 blocks in every state: the cached chain 1 -> 2 -> 3, blocks held by "a"
    (two hashed 4 -> 5 under 3), the first also by "b"; five free."""
    pool = Target.from_backend("cupy").create(12, policy=policy)
    cache_chain(pool, [1, 2, 3])
    held = pool.allocate(3, holder="a")
    pool.register(held[:2], [4, 5], parent_hash=3 if policy != "ref-zero" else None)
    pool.acquire(held[:1], holder="b")
    return pool


def entry_of(p: Any, block_hash: int) -> int:
    """The index entry of ``block_hash``, found through the block that holds it."""
    return int(p.blocks.entry[int(np.flatnonzero(p.blocks.hash == block_hash)[0])])


def set_to(array_of: Callable[[Any], Any], at: Callable[[Any], int] | int, value: int) -> Callable[[Any], None]:
    """A corruption: ``array_of(pool)[at] = value``, ``at`` a position or a function of the pool."""

    def corrupt(p: Any) -> None:
        array_of(p)[at(p) if callable(at) else at] = value

    return corrupt


def a_shared_count_of_zero(p: Any) -> None:
    p.references.shared.first_count[int(np.flatnonzero(p.references.shared.first_holder >= 0)[0])] = 0


def a_holder_counted_zero_times_another_twice(p: Any) -> None:
    """Block 4's two holders (both counted inline): counts 0 and 2, which still add up to its reference count."""
    b = int(np.flatnonzero((p.references.shared.first_holder >= 0) & (p.references.shared.second_holder >= 0))[0])
    p.references.shared.first_count[b], p.references.shared.second_count[b] = 0, 2


def a_pair_counted_inline_and_in_the_table(p: Any) -> None:
    """Block 4's first holder also counted in the table (the counts no longer add up either: the layout is named)."""
    b = int(np.flatnonzero(p.references.shared.first_holder >= 0)[0])
    p.references.shared.add(p.ops.asarray(np.array([b])), 7, 1)  # a third holder: to the table
    p.references.shared.table.values[np.flatnonzero(p.references.shared.table.keys >= 0)[0]] = 1
    p.references.shared.table.keys[np.flatnonzero(p.references.shared.table.keys >= 0)[0]] = b << 32 | int(
        p.references.shared.first_holder[b]
    )


def one_count_off(part: str, name: str, by: int) -> Callable[[Any], None]:
    """A corruption: the host counter ``name`` of the pool's ``part`` off by ``by``."""

    def corrupt(p: Any) -> None:
        counter = getattr(p, part)
        setattr(counter, name, getattr(counter, name) + by)

    return corrupt


def an_orphan_under_lru_leaf(p: Any) -> None:
    """Hash 1 (the chain's root, cached in block 1) leaves by hand while 2 stays: block 1 free again."""
    p.index.copies[entry_of(p, 1)] = 0
    p.blocks.entry[1], p.blocks.hash[1], p.blocks.released[1] = -1, -1, -1
    p.blocks.stack[p.blocks.num_free] = 1
    p.blocks.num_free += 1
    p.orders.num_cached -= 1


def cached_under_ref_zero(p: Any) -> None:
    """A hashed block "a" holds alone is let go by hand, and stays cached (ref-zero never caches)."""
    b = int(np.flatnonzero((p.blocks.owner >= 0) & (p.blocks.hash >= 0))[0])
    p.blocks.ref[b], p.blocks.owner[b], p.blocks.released[b] = 0, -1, 10
    p.holder_ids.held["a"] -= 1
    p.orders.num_cached += 1


def a_dead_entry(p: Any) -> None:
    """Block 5 loses hash 5, but the index keeps 5's entry, with no copy and no child."""
    p.index.copies[entry_of(p, 5)] = 0
    p.blocks.hash[5], p.blocks.entry[5] = -1, -1


ref, owner, bhash, gen = (
    (lambda p: p.blocks.ref),
    (lambda p: p.blocks.owner),
    (lambda p: p.blocks.hash),
    (lambda p: p.blocks.gen),
)
stack, bentry, evstamp = (lambda p: p.blocks.stack), (lambda p: p.blocks.entry), (lambda p: p.blocks.released)


def top_of_stack(p: Any) -> int:
    return int(p.blocks.stack[0])


REPORTS: list[tuple[str, str, Callable[[Any], object], str, str]] = [
    (
        "a block twice on the free stack",
        "lru",
        lambda p: p.blocks.stack.__setitem__(1, p.blocks.stack[0]),
        "STATE-005",
        "a block is on the free stack more than once: [11, 11, 9, 8, 7]",
    ),
    (
        "the reserved block on the free stack",
        "lru",
        set_to(stack, 0, 0),
        "POOL-102",
        "reserved or out-of-range block on the free stack: [0, 10, 9, 8, 7]",
    ),
    (
        "block 12 of 12 on the free stack",
        "lru",
        set_to(stack, 0, 12),
        "POOL-102",
        "reserved or out-of-range block on the free stack: [12, 10, 9, 8, 7]",
    ),
    (
        "block -1 on the free stack",
        "lru",
        set_to(stack, 0, -1),
        "POOL-102",
        "reserved or out-of-range block on the free stack: [-1, 10, 9, 8, 7]",
    ),
    (
        "a reference on a free block",
        "lru",
        set_to(ref, top_of_stack, 1),
        "STATE-005",
        "free block 11 has 1 reference(s) and hash -1",
    ),
    (
        "a hash on a free block",
        "lru",
        set_to(bhash, top_of_stack, 9),
        "STATE-005",
        "free block 11 has 0 reference(s) and hash 9",
    ),
    (
        "hash 0 on a free block",
        "lru",
        set_to(bhash, top_of_stack, 0),
        "STATE-005",
        "free block 11 has 0 reference(s) and hash 0",
    ),
    ("a reference on the reserved block", "lru", set_to(ref, 0, 1), "POOL-102", "a reserved block is held or hashed"),
    ("hash 0 on the reserved block", "lru", set_to(bhash, 0, 0), "POOL-102", "a reserved block is held or hashed"),
    ("a hash on the reserved block", "lru", set_to(bhash, 0, 9), "POOL-102", "a reserved block is held or hashed"),
    ("an owner of the reserved block", "lru", set_to(owner, 0, 0), "POOL-102", "a reserved block is held or hashed"),
    ("a negative generation", "lru", set_to(gen, 3, -1), "POOL-111", "negative generation on block(s) [3]"),
    ("a negative reference count", "lru", set_to(ref, 2, -1), "STATE-002", "negative reference count on block(s) [2]"),
    (
        "a held block without owner",
        "lru",
        set_to(owner, 5, -1),
        "STATE-002",
        "block 5 has reference count 1 but owner code -1",
    ),
    (
        "an owner of a cached block",
        "lru",
        set_to(owner, 2, 0),
        "STATE-002",
        "block 2 has reference count 0 but owner code 0",
    ),
    (
        "a solely held block marked shared",
        "lru",
        set_to(owner, 5, -2),
        "STATE-002",
        "per-holder counts of shared blocks do not add up to their reference counts",
    ),
    (
        "a shared count of zero",
        "lru",
        a_shared_count_of_zero,
        "STATE-002",
        "per-holder counts of shared blocks do not add up to their reference counts",
    ),
    (
        "a holder counted zero times, another twice",
        "lru",
        a_holder_counted_zero_times_another_twice,
        "STATE-002",
        "per-holder counts of shared blocks do not add up to their reference counts",
    ),
    (
        "a pair counted inline and in the table",
        "lru",
        a_pair_counted_inline_and_in_the_table,
        "STATE-002",
        "per-holder counts of shared blocks: a pair is counted inline and in the table",
    ),
    (
        "an unused inline slot with a count",
        "lru",
        lambda p: p.references.shared.second_count.__setitem__(3, 1),
        "STATE-002",
        "per-holder counts of shared blocks: an unused inline slot holds a count",
    ),
    (
        "a block's spilled count off by one",
        "lru",
        lambda p: p.references.shared.spilled.__setitem__(3, 1),
        "STATE-002",
        "per-holder counts of shared blocks: spilled counts disagree with the pairs in the table",
    ),
    (
        "a shared block counted more than its holders",
        "lru",
        set_to(ref, 4, 3),
        "STATE-002",
        "per-holder counts of shared blocks do not add up to their reference counts",
    ),
    (
        "a holder's total off by one",
        "lru",
        lambda p: p.holder_ids.held.__setitem__("a", 4),
        "STATE-002",
        "per-holder totals {'a': 4, 'b': 1} != per-block holders {'a': 3, 'b': 1}",
    ),
    (
        "the free count off by one",
        "lru",
        one_count_off("blocks", "num_free", -1),
        "STATE-003",
        "free 4 + in use 3 + cached 3 != usable 11",
    ),
    (
        "the cached count off by one",
        "lru",
        one_count_off("orders", "num_cached", 1),
        "STATE-004",
        "3 cached blocks but the counter says 4",
    ),
    (
        "a cached block under ref-zero",
        "ref-zero",
        cached_under_ref_zero,
        "EVICT-405",
        "1 unreferenced hashed block(s) stayed cached under ref-zero",
    ),
    (
        "a cached block out of the release order",
        "lru",
        set_to(evstamp, 1, -1),
        "STATE-004",
        "eviction order [3, 2] != cached blocks [1, 2, 3]",
    ),
    (
        "a release stamp on a block in use",
        "lru",
        set_to(evstamp, 5, 9),
        "PFX-310",
        "a block in use (or unhashed) has a release stamp, or a cached one lacks it",
    ),
    (
        "release stamp 0 on a block in use",
        "lru",
        set_to(evstamp, 5, 0),
        "PFX-310",
        "a block in use (or unhashed) has a release stamp, or a cached one lacks it",
    ),
    (
        "an index entry holding another hash",
        "lru",
        lambda p: p.index.hash_of.__setitem__(entry_of(p, 5), 77),
        "STATE-006",
        "the hash index points at entries holding other hashes",
    ),
    (
        "a block pointing at another hash's entry",
        "lru",
        lambda p: p.blocks.entry.__setitem__(5, entry_of(p, 4)),
        "STATE-006",
        "a hashed block's entry holds another hash",
    ),
    (
        "a hashed block without entry",
        "lru",
        set_to(bentry, 5, -1),
        "STATE-006",
        "a hashed block's entry holds another hash",
    ),
    (
        "a copy count off by one",
        "lru",
        lambda p: p.index.copies.__setitem__(entry_of(p, 5), 2),
        "STATE-006",
        "5 hashed blocks disagree with the copy counts of the hash index",
    ),
    (
        "an oldest copy that is another hash's block",
        "lru",
        lambda p: p.index.head.__setitem__(entry_of(p, 5), 4),
        "STATE-006",
        "a resident hash's oldest copy is not one of its copies",
    ),
    (
        "an entry with no copy and no child",
        "lru",
        a_dead_entry,
        "STATE-007",
        "the hash index keeps an entry with no copy and no resident child",
    ),
    (
        "a child count off by one",
        "lru",
        lambda p: p.index.children.__setitem__(entry_of(p, 5), 1),
        "STATE-007",
        "child counts disagree with the parent links of resident hashes",
    ),
    (
        "a parent hash other than the parent entry's",
        "lru",
        lambda p: p.index.parent_hash.__setitem__(entry_of(p, 5), 1),
        "STATE-007",
        "a resident hash's parent entry holds another hash than its parent",
    ),
    (
        "a parent entry lost",
        "lru",
        lambda p: p.index.parent_entry.__setitem__(entry_of(p, 5), -1),
        "STATE-007",
        "child counts disagree with the parent links of resident hashes",
    ),
    (
        "a root given a parent hash",
        "lru",
        lambda p: p.index.parent_hash.__setitem__(entry_of(p, 1), 3),
        "STATE-007",
        "a resident hash has a parent hash but no parent entry, or the reverse",
    ),
    (
        "a parent evicted before its child",
        "lru-leaf",
        an_orphan_under_lru_leaf,
        "EVICT-404",
        "a resident hash has a parent that is not resident (lru-leaf keeps the set prefix-closed)",
    ),
    (
        "a hashed block missing from the fifo order",
        "fifo",
        lambda p: p.blocks.registered.__setitem__(4, -5),
        "EVICT-406",
        "5 hashed blocks but 4 in the fifo order",
    ),
]


@rule(
    "ERR-508",
    "POOL-102",
    "POOL-111",
    "PFX-310",
    "STATE-002",
    "STATE-003",
    "STATE-004",
    "STATE-005",
    "STATE-006",
    "STATE-007",
    "EVICT-404",
    "EVICT-405",
    "EVICT-406",
)
@pytest.mark.parametrize(("case", "policy", "corrupt", "rule_id", "says"), REPORTS, ids=[r[0] for r in REPORTS])
def test_each_branch_of_the_array_self_check_reports_what_it_saw(
    case: str, policy: str, corrupt: Callable[[Any], object], rule_id: str, says: str
) -> None:
    pool = lived_in(policy)
    pool.check_invariants()
    corrupt(pool)
    message = str(refused(case, pool.check_invariants, InvariantViolation, rule_id, f"check_invariants: {says}"))
    assert message == f"[{rule_id}] check_invariants: {says}", f"{case}: {message!r} says more than {says!r}"


@rule("ERR-508", "STATE-003", "POOL-102")
@pytest.mark.parametrize("policy", ["lru", "lru-leaf", "fifo", "ref-zero"])
def test_a_pool_in_every_state_checks_clean_and_so_do_block_0_and_hash_0_in_use(policy: str) -> None:
    lived_in(policy).check_invariants()
    pool = Target.from_backend("cupy").create(4, policy=policy, reserved_ids=())
    pool.check_invariants()  # block 0 on the free stack, a block like any other
    held = pool.allocate(4, holder="a")
    pool.register(held, [0, 1, 2, 3])  # hash 0 is a hash like any other
    pool.check_invariants()
    pool.free(held, holder="a")  # cached (or dropped under ref-zero), hash 0 among them
    pool.check_invariants()
    pool.reset()  # hash 0's block too goes back to the free stack unhashed
    pool.check_invariants()
    assert pool.hash_entry(0) is None and pool.num_free == 4, f"after reset: {pool!r}, hash 0 {pool.hash_entry(0)}"
