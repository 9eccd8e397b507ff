"""The block pool oracle's self-check, branch by branch: each corruption is reported under its rule
with a message that says what was seen (ERR-508).

``tests/test_state.py`` checks that each kind of corruption is caught under the right rule; here
every branch of ``check_invariants`` is reached on its own, including those that another branch
would otherwise report first, and the report is read word for word from its start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvref.contract.errors import InvariantViolation
from kvref.contract.protocol import BlockState
from kvref.oracle import OracleBlockPool
from tests.refusals import refused
from tests.test_state import _a_parent_link_of_no_resident_hash, _orphan_under_lru_leaf, lived_in

rule = pytest.mark.rule


def block_in(p: Any, state: BlockState, *, hashed: bool | None = None) -> int:
    """The first usable block in ``state`` (with or without a hash, when ``hashed`` says)."""
    return next(
        b
        for b in range(1, p.num_blocks)
        if p.block_state(b) is state and (hashed is None or (p.blocks.hash[b] is not None) == hashed)
    )


def cached_behind_the_policys_back(p: Any, *, in_order: bool) -> None:
    """Under ref-zero: a free block becomes a cached block of its own hash, in the eviction order or not."""
    b = p.blocks.free.pop()
    p.blocks.hash[b], p.index.copies[77], p.index.parent[77] = 77, [b], None
    if in_order:
        p.orders.evictable[b] = None


def unindexed_hash_on_a_block_in_use(p: Any) -> None:
    b = block_in(p, BlockState.IN_USE, hashed=False)
    p.blocks.hash[b] = 31337
    p.orders.hashed_in_use.add(b)


REPORTS: list[tuple[str, str, Callable[[Any], object], str, str]] = [
    (
        "a reference on the reserved block",
        "lru",
        lambda p: p.blocks.ref.__setitem__(0, 1),
        "POOL-102",
        "reserved block 0 is held or hashed",
    ),
    (
        "a holder on the reserved block",
        "lru",
        lambda p: p.blocks.holders.__setitem__(0, {"x": 1}),
        "POOL-102",
        "reserved block 0 is held or hashed",
    ),
    (
        "a hash on the reserved block",
        "lru",
        lambda p: p.blocks.hash.__setitem__(0, 5),
        "POOL-102",
        "reserved block 0 is held or hashed",
    ),
    (
        "a negative count on a cached block",
        "lru",
        lambda p: p.blocks.ref.__setitem__(block_in(p, BlockState.CACHED), -1),
        "STATE-002",
        "block 1 has negative reference count -1",
    ),
    (
        "a holder on a cached block",
        "lru",
        lambda p: p.blocks.holders.__setitem__(block_in(p, BlockState.CACHED), {"x": 1}),
        "STATE-002",
        "block 1 has no reference but holders {'x': 1}",
    ),
    (
        "a holder counted zero times",
        "lru",
        lambda p: p.blocks.holders[block_in(p, BlockState.IN_USE)].__setitem__("z", 0),
        "STATE-002",
        "block 4 has reference count 2 but holders {'a': 1, 'b': 1, 'z': 0}; the count must equal the "
        "references the holders hold",
    ),
    (
        "a free block in the eviction order",
        "lru",
        lambda p: p.orders.evictable.__setitem__(p.blocks.free[-1], None),
        "STATE-004",
        "3 cached blocks but 4 in the eviction order",
    ),
    (
        "a cached block under ref-zero, outside the order",
        "ref-zero",
        lambda p: cached_behind_the_policys_back(p, in_order=False),
        "STATE-004",
        "1 cached blocks but 0 in the eviction order",
    ),
    (
        "a cached block under ref-zero",
        "ref-zero",
        lambda p: cached_behind_the_policys_back(p, in_order=True),
        "EVICT-405",
        "1 unreferenced hashed block(s) stayed cached under ref-zero",
    ),
    (
        "a hash with no copies",
        "lru",
        lambda p: p.index.copies.__setitem__(4242, []),
        "STATE-006",
        "hash 0x1092 lists copies []",
    ),
    (
        "a hash on a block in use that the index lacks",
        "lru",
        unindexed_hash_on_a_block_in_use,
        "STATE-006",
        "6 hashed blocks but 5 listed in the hash index",
    ),
    (
        "a parent link of a hash not resident",
        "lru",
        _a_parent_link_of_no_resident_hash,
        "STATE-006",
        "parent links exist for hashes that are not resident",
    ),
    (
        "a parent evicted before its child",
        "lru-leaf",
        _orphan_under_lru_leaf,
        "EVICT-404",
        "resident hash 0x2 has parent 0x1 that is not resident (lru-leaf keeps the cached set prefix-closed)",
    ),
    (
        "a hashed block missing from the fifo order",
        "fifo",
        lambda p: p.orders.registered.popitem(),
        "EVICT-406",
        "5 hashed blocks but 4 in the fifo order",
    ),
]


@rule("ERR-508", "POOL-102", "STATE-002", "STATE-004", "STATE-006", "EVICT-404", "EVICT-405", "EVICT-406")
@pytest.mark.parametrize(("case", "policy", "corrupt", "rule_id", "says"), REPORTS, ids=[r[0] for r in REPORTS])
def test_each_branch_of_the_self_check_reports_what_it_saw(
    case: str, policy: str, corrupt: Callable[[Any], object], rule_id: str, says: str
) -> None:
    pool = lived_in(policy)
    pool.check_invariants()
    corrupt(pool)
    refused(case, pool.check_invariants, InvariantViolation, rule_id, f"check_invariants: {says}")


@rule("POOL-102", "ERR-508")
def test_a_pool_whose_block_0_is_usable_checks_clean_with_block_0_free() -> None:
    pool = OracleBlockPool(4, reserved_ids=())
    assert 0 in pool.blocks.free, "with nothing reserved, block 0 is a free block like any other"
    pool.check_invariants()
