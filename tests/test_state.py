"""Chapter 00, state model: the invariants hold, and check_invariants catches each broken one."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvref.contract.errors import InvalidTypeError, InvariantViolation
from kvref.contract.protocol import BlockState
from kvref.oracle import OracleBlockPool
from kvref_conformance.suites.base import cache_chain

rule = pytest.mark.rule


def lived_in(policy: str = "lru") -> OracleBlockPool:
    """A pool with blocks in every state."""
    pool = OracleBlockPool(12, policy=policy)
    cache_chain(pool, [1, 2, 3])
    held = pool.allocate(3, holder="a")
    pool.register(held[:2], [4, 5], parent_hash=3 if policy != "ref-zero" else None)
    pool.acquire(held[:1], holder="b")
    return pool


@rule("STATE-001")
def test_every_block_is_in_exactly_one_state() -> None:
    pool = lived_in()
    states = [pool.block_state(b) for b in range(pool.num_blocks)]
    assert states.count(BlockState.RESERVED) == 1
    assert states.count(BlockState.IN_USE) == pool.num_in_use == 3
    assert states.count(BlockState.CACHED) == pool.num_cached == 3
    assert states.count(BlockState.FREE) == pool.num_free == 5


@rule("STATE-003")
@pytest.mark.parametrize("policy", ["lru", "lru-leaf", "ref-zero", "fifo"])
def test_free_in_use_and_cached_add_up_to_usable(policy: str) -> None:
    pool = lived_in(policy)
    assert pool.num_free + pool.num_in_use + pool.num_cached == pool.num_usable == 11
    assert pool.num_cached == (0 if policy == "ref-zero" else 3)
    pool.check_invariants()


@rule("ERR-508")
def test_check_invariants_returns_none_on_a_sound_state() -> None:
    assert lived_in().check_invariants() is None  # type: ignore[func-returns-value]


def _dup_free(p: OracleBlockPool) -> None:
    p.blocks.free.append(p.blocks.free[-1])


def _ref_without_holder(p: OracleBlockPool) -> None:
    b = next(b for b in range(1, 12) if p.block_state(b) is BlockState.IN_USE)
    p.blocks.ref[b] += 1


def _lost_block(p: OracleBlockPool) -> None:
    p.blocks.free.pop()


def _cached_not_evictable(p: OracleBlockPool) -> None:
    p.orders.evictable.popitem()


def _hash_index_disagrees(p: OracleBlockPool) -> None:
    b = p.lookup([1])[0]
    p.blocks.hash[b] = 99


def _child_count_off(p: OracleBlockPool) -> None:
    p.index.children[1] += 1


def _holder_total_off(p: OracleBlockPool) -> None:
    p.blocks.held["a"] += 1


def _reserved_handed_out(p: OracleBlockPool) -> None:
    p.blocks.free.append(0)


def _orphan_under_lru_leaf(p: OracleBlockPool) -> None:
    # Evict hash 1 behind the policy's back: its child 2 stays resident.
    b = p.lookup([1])[0]
    p.index.unregister([b])
    p.blocks.free.append(b)


def _out_of_range_free(p: OracleBlockPool) -> None:
    p.blocks.free.append(p.num_blocks)


def _free_block_with_a_hash(p: OracleBlockPool) -> None:
    p.blocks.hash[p.blocks.free[-1]] = 77


def _free_block_with_a_reference(p: OracleBlockPool) -> None:
    p.blocks.ref[p.blocks.free[-1]] = 1


def _negative_generation(p: OracleBlockPool) -> None:
    p.blocks.gen[p.blocks.free[-1]] = -1


def _hashed_in_use_untracked(p: OracleBlockPool) -> None:
    p.orders.hashed_in_use.clear()


def _in_use_in_eviction_order(p: OracleBlockPool) -> None:
    b = next(b for b in range(1, 12) if p.block_state(b) is BlockState.IN_USE)
    p.orders.evictable[b] = None


def _a_copy_listed_twice(p: OracleBlockPool) -> None:
    p.index.copies[1].append(p.index.copies[1][0])


def _a_parent_link_of_no_resident_hash(p: OracleBlockPool) -> None:
    p.index.parent[999] = None


def _a_resident_hash_without_parent(p: OracleBlockPool) -> None:
    del p.index.parent[1]


CORRUPTIONS: list[tuple[str, Callable[[OracleBlockPool], None], str]] = [
    ("a block twice on the free list", _dup_free, "STATE-005"),
    ("a reference with no holder", _ref_without_holder, "STATE-002"),
    ("a block lost from every state", _lost_block, "STATE-003"),
    ("a cached block outside the eviction order", _cached_not_evictable, "STATE-004"),
    ("a block hash the index does not list", _hash_index_disagrees, "STATE-006"),
    ("a wrong child count", _child_count_off, "STATE-007"),
    ("a holder total that disagrees", _holder_total_off, "STATE-002"),
    ("the reserved block on the free list", _reserved_handed_out, "POOL-102"),
    ("a block id past the pool on the free list", _out_of_range_free, "POOL-102"),
    ("a free block with a hash", _free_block_with_a_hash, "STATE-005"),
    ("a free block with a reference", _free_block_with_a_reference, "STATE-005"),
    ("a negative generation", _negative_generation, "POOL-111"),
    ("an in-use hashed block left untracked", _hashed_in_use_untracked, "STATE-004"),
    ("an in-use block in the eviction order", _in_use_in_eviction_order, "PFX-310"),
    ("a copy listed twice under its hash", _a_copy_listed_twice, "STATE-006"),
    ("a parent link of a hash not resident", _a_parent_link_of_no_resident_hash, "STATE-006"),
    ("a resident hash without a parent link", _a_resident_hash_without_parent, "STATE-006"),
]


@rule("ERR-508", "STATE-002", "STATE-003", "STATE-004", "STATE-005", "STATE-006", "STATE-007", "POOL-102", "PFX-310")
@pytest.mark.parametrize(("what", "corrupt", "rule_id"), CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_check_invariants_names_the_rule_each_corruption_breaks(
    what: str, corrupt: Callable[[OracleBlockPool], None], rule_id: str
) -> None:
    pool = lived_in()
    corrupt(pool)
    with pytest.raises(InvariantViolation) as info:
        pool.check_invariants()
    assert info.value.rule == rule_id, f"{what}: check_invariants cited {info.value.rule}, expected {rule_id}"
    said = str(info.value).removeprefix(f"[{rule_id}] check_invariants: ")
    assert said != str(info.value) and len(said) > 10, f"{what}: {str(info.value)!r} does not say what broke"


@rule("EVICT-404", "ERR-508")
def test_check_invariants_catches_a_parent_evicted_before_its_child() -> None:
    pool = OracleBlockPool(8, policy="lru-leaf")
    cache_chain(pool, [1, 2, 3])
    _orphan_under_lru_leaf(pool)
    with pytest.raises(InvariantViolation) as info:
        pool.check_invariants()
    assert info.value.rule == "EVICT-404"


@rule("POOL-107", "POOL-110")
def test_holder_references_counts_what_a_holder_holds_and_zero_for_a_stranger() -> None:
    pool = lived_in()
    assert pool.holder_references("a") == 3, "holder a allocated 3 blocks and freed none"
    assert pool.holder_references("b") == 1, "holder b acquired 1 block"
    assert pool.holder_references("nobody") == 0, "a holder that never held anything holds 0 references"
    with pytest.raises(InvalidTypeError, match="holder_references"):
        pool.holder_references([])  # type: ignore[arg-type]
