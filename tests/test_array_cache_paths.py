"""The array core's prefix cache where its paths split, held to the oracle: acquires naming more ids
than the pool has blocks, batched matches under access order and past a quick probe that gives up,
many pins of one block by one holder, per-holder counts in their inline slots and their table, the
stamp queue's compaction, the registration order's head under fifo, the graph arrays once no hash is
left, and the explainers' view of hashes of any integer type. Torch runs on cpu, CuPy on its NumPy
host path: the code a GPU runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from kvref_arraypool.holder_counts import HolderCounts
from kvref_arraypool.ops import ArrayOps
from kvref_arraypool.pool import ArrayBlockPool

from kvref.contract.errors import InvariantViolation, KVRefError
from kvref_conformance.target import Target
from tests.test_error_messages import pool_on
from tests.test_stamp_queue import push, queue_of

rule = pytest.mark.rule
BACKENDS = ["cupy", "torch"]


# ---------------------------------------------------------------- acquire of more ids than blocks


@rule("POOL-110", "POOL-119", "ERR-501")
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_acquire_naming_more_ids_than_the_pool_has_blocks_pins_or_refuses_as_the_oracle_does(backend: str) -> None:
    """More positions than blocks (5 ids on a pool of 4) take the pin's general route: a good call
    pins every occurrence, a call naming a free block is refused and changes nothing."""
    seen = {}
    for name in ("oracle", backend):
        pool = pool_on(name, 4)  # blocks 1..3 usable
        held = pool.allocate(2, holder="a")
        pool.acquire([held[0]] * 5, holder="x")
        pinned = (pool.holders(held[0]), pool.ref_count(held[0]), pool.holder_references("x"))
        with pytest.raises(KVRefError) as refused:
            pool.acquire([held[1]] * 4 + [3], holder="y")  # block 3 is free (POOL-119)
        after = ([pool.holders(b) for b in range(4)], pool.num_free, pool.holder_references("y"))
        seen[name] = (pinned, str(refused.value), after)
    assert seen[backend] == seen["oracle"], f"{backend}: {seen[backend]}; the oracle: {seen['oracle']}"


# ---------------------------------------------------------------- a batched match stamps each entry as its call


@rule("PFX-320", "EVICT-411")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_blocks", [9, 4], ids=["fewer positions than blocks", "more positions than blocks"])
def test_a_batched_match_stamps_each_entry_as_its_own_call_under_access_order(backend: str, num_blocks: int) -> None:
    """Under lru-leaf-access each entry of ``match_many`` is an access after the entry before it: block
    1 (hash 20) is matched by the last entry, block 2 (hash 10) before, so block 2 is evicted first,
    as the oracle's single matches order them (ordering the pins by block id alone would not)."""
    chains = [[20], [10], [20], [10], [20]][: 3 if num_blocks == 9 else 5]
    holders = ["a", "b", "c", "d", "e"][: len(chains)]
    left = {}
    for name in ("oracle", backend):
        pool = pool_on(name, num_blocks, policy="lru-leaf-access")
        two = pool.allocate(2, holder="w")
        pool.register(two[:1], [20])
        pool.register(two[1:], [10])
        pool.free(two, holder="w")
        hits = pool.match_many(chains, holders=holders)
        for got, holder in zip(hits, holders, strict=True):
            pool.free(got, holder=holder)
        assert pool.evict(1)
        left[name] = pool.resident_hashes()
    assert left[backend] == left["oracle"] == {20}, f"resident after one eviction: {left}"


# ---------------------------------------------------------------- a batch naming a block again keeps its sole holder


@rule("STATE-002", "PFX-310")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cached", [False, True], ids=["in use", "cached"])
def test_one_holder_pinning_a_block_five_times_at_once_leaves_the_state_of_five_single_pins(
    backend: str, cached: bool
) -> None:
    """Five positions on a pool of four blocks go the pin's general route; a block pinned by one holder
    only stays that holder's alone (no shared counts), as five single acquires leave it."""
    snapshots = []
    for at_once in (True, False):
        pool = pool_on(backend, 4)
        b = pool.allocate(1, holder="x")
        if cached:
            pool.register(b, [7])
            pool.free(b, holder="x")
        if at_once:
            pool.acquire(b * 5, holder="x")
        else:
            for _ in range(5):
                pool.acquire(b, holder="x")
        pool.check_invariants()
        snapshots.append(pool.snapshot())
    assert snapshots[0] == snapshots[1], f"at once: {snapshots[0]}\none by one: {snapshots[1]}"


# ---------------------------------------------------------------- lru-leaf with a parent copy in use


@rule("EVICT-402", "EVICT-403", "POOL-106")
@pytest.mark.parametrize("backend", BACKENDS)
def test_under_lru_leaf_a_child_of_a_hash_with_a_copy_in_use_is_ranked_as_the_oracle_ranks_it(backend: str) -> None:
    """Hash 10 has two copies, one cached and one in use; its child 11 is cached. Both cached blocks
    can go; the leaf order passes over hash 10's entry (no last copy in the window): what is
    reclaimable and what goes first are the oracle's."""
    seen = {}
    for name in ("oracle", backend):
        pool = pool_on(name, 6, policy="lru-leaf")
        two = pool.allocate(2, holder="a")
        pool.register(two[:1], [10])
        pool.register(two[1:], [10])
        child = pool.allocate(1, holder="c")
        pool.register(child, [11], parent_hash=10)
        pool.free(two[:1], holder="a")
        pool.free(child, holder="c")
        steps = [pool.num_available]
        for _ in range(2):
            assert pool.evict(1)
            steps.append(sorted(pool.resident_hashes()))
        seen[name] = steps
    assert seen[backend] == seen["oracle"], f"{backend}: {seen[backend]}; the oracle: {seen['oracle']}"


# ---------------------------------------------------------------- evictions add up


@rule("PFX-318", "EVICT-412")
@pytest.mark.parametrize("backend", BACKENDS)
def test_evictions_by_evict_add_up_in_the_stats_as_the_oracles_do(backend: str) -> None:
    counted = {}
    for name in ("oracle", backend):
        pool = pool_on(name, 6)
        held = pool.allocate(5, holder="a")
        pool.register(held, [1, 2, 3, 4, 5])
        pool.free(held, holder="a")
        pool.allocate(1, holder="b")  # no block is free: the allocation evicts one
        assert pool.evict(1) and pool.evict(2)
        counted[name] = pool.stats.evictions
    assert counted[backend] == counted["oracle"] == 4, f"evictions counted: {counted}"


# ---------------------------------------------------------------- a third holder's pair in table slot 0


@rule("STATE-002")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_third_holder_pinning_again_is_counted_where_its_pair_sits_even_in_the_tables_first_slot(
    backend: str,
) -> None:
    """Holder "c" (holder id 2) is block 5's third holder: its pair goes to the per-holder table, whose
    64-bit mix homes key ``5 << 32 | 2`` at slot 0 (of 128). A second pin by "c" adds to that pair."""
    seen = {}
    for name in ("oracle", backend):
        pool = pool_on(name, 8)
        held = pool.allocate(5, holder="a")
        assert held[4] == 5
        pool.acquire([5], holder="b")
        pool.acquire([5], holder="c")
        pool.acquire([5], holder="c")
        seen[name] = pool.holders(5)
    assert seen[backend] == seen["oracle"] == {"a": 1, "b": 1, "c": 2}, f"holders of block 5: {seen}"


# ---------------------------------------------------------------- the array self-check's branch


@rule("STATE-002", "ERR-508")
def test_the_self_check_names_a_pair_counted_in_both_inline_slots() -> None:
    pool = Target.from_backend("cupy").create(8)
    held = pool.allocate(2, holder="a")
    pool.acquire(held[:1], holder="b")
    pool.check_invariants()
    shared = pool.references.shared
    b = held[0]
    shared.second_holder[b] = int(shared.first_holder[b])
    with pytest.raises(InvariantViolation) as caught:
        pool.check_invariants()
    assert str(caught.value) == (
        "[STATE-002] check_invariants: per-holder counts of shared blocks: "
        "a pair is counted in both inline slots of its block"
    ), str(caught.value)


# ---------------------------------------------------------------- graph arrays after eviction and clear


def graph(pool: Any, names: tuple[str, ...]) -> dict[str, list[int]]:
    arrays = pool.graph_arrays()
    return {k: np.asarray(pool.ops.to_host(arrays[k])).tolist() for k in names}


@rule("CONF-908", "PFX-312")
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_evicted_block_reads_no_hash_in_the_graph_arrays_or_the_snapshot(backend: str) -> None:
    """spec 09: ``bhash`` is -1 for a block with no hash; an evicted block comes back unhashed."""
    pool = pool_on(backend, 3)
    b = pool.allocate(1, holder="a")
    pool.register(b, [5])
    pool.free(b, holder="a")
    pool.allocate(2, holder="b")  # the free block and the evicted one
    assert graph(pool, ("bhash",))["bhash"] == [-1, -1, -1]
    assert pool.snapshot()["hash"] == [-1, -1, -1]


@rule("CONF-908", "POOL-124", "PFX-313")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["evict", "clear"])
def test_with_no_hash_left_the_entry_arrays_read_as_a_new_pools(backend: str, how: str) -> None:
    """Once no hash is resident (all evicted, or the pool cleared), no entry names a hash or an oldest
    copy: ``ehash`` and ``ehead`` read as a new pool's (and after clear ``eparent`` too)."""
    pool = pool_on(backend, 6)
    held = pool.allocate(3, holder="a")
    pool.register(held, [11, 12, 13])
    pool.free(held, holder="a")
    if how == "evict":
        assert pool.evict(3)
        names: tuple[str, ...] = ("ehash", "ehead")
    else:
        pool.clear()
        names = ("ehash", "ehead", "eparent")
    assert graph(pool, names) == graph(pool_on(backend, 6), names)


# ---------------------------------------------------------------- HolderCounts keeps two pairs inline


def arr(ops: ArrayOps, values: list[int]) -> Any:
    return ops.asarray(np.array(values, dtype=np.int64))


@rule("STATE-002")
@pytest.mark.parametrize("distinct", [True, False])
def test_a_new_pair_takes_a_freed_second_inline_slot_before_the_table(ops: ArrayOps, distinct: bool) -> None:
    """Block 2's second inline slot freed, its first still used: a new pair goes to the second slot,
    whether the caller says the blocks are distinct or not, and alone in its call or beside another
    new pair of the same block (which then goes to the table)."""
    counts = HolderCounts(ops, 5)
    counts.add(arr(ops, [2, 2]), arr(ops, [0, 1]), arr(ops, [1, 1]))
    counts.sub(arr(ops, [2]), arr(ops, [1]), arr(ops, [1]))
    counts.add(arr(ops, [2]), arr(ops, [3]), 1, distinct=distinct)
    assert (int(counts.first_holder[2]), int(counts.second_holder[2]), counts.table.live) == (0, 3, 0)
    if distinct:
        return
    counts.sub(arr(ops, [2]), arr(ops, [3]), arr(ops, [1]))
    counts.add(arr(ops, [2, 2, 4]), arr(ops, [3, 5, 0]), arr(ops, [1, 1, 1]))  # block 2 twice: ranks 0 and 1
    assert (int(counts.second_holder[2]), int(counts.first_holder[4]), counts.table.live) == (3, 0, 1)
    assert counts.holders_of(2) == [(0, 1), (3, 1), (5, 1)], counts.holders_of(2)


# ---------------------------------------------------------------- the batched match's exact probe, deterministically


@rule("PFX-320", "PFX-309")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batched_match_whose_quick_probe_gives_up_on_every_hash_still_hits(backend: str, monkeypatch: Any) -> None:
    """``HashTable.find_near`` answers nothing and flags every hash as lying past its home's window
    (a crowded table): ``match_many`` must probe exactly and hit what the chains hold."""
    from kvref_arraypool.table import HashTable

    pool = pool_on(backend, 6)
    held = pool.allocate(2, holder="w")
    pool.register(held, [1, 2])
    pool.free(held, holder="w")

    def gives_up(table: HashTable, keys: Any, default: int = -1) -> tuple[Any, Any]:
        return table.ops.full(len(keys), default), table.ops.arange(len(keys)) >= 0

    monkeypatch.setattr(HashTable, "find_near", gives_up)
    assert pool.match_many([[1, 2], [1, 3]], holders=["a", "b"]) == [held, held[:1]]


@rule("PFX-304")
@pytest.mark.parametrize("backend", BACKENDS)
def test_hash_entry_reads_a_hash_of_any_integer_type_as_the_oracle_does(backend: str) -> None:
    """The explainers' view of a hash, asked with NumPy's unsigned and signed ints (hashes often come
    as uint64 arrays): the same answers as the oracle's, and the pool stays usable."""
    seen = {}
    for name in ("oracle", backend):
        pool = pool_on(name, 4)
        held = pool.allocate(1, holder="a")
        pool.register(held, [1])
        seen[name] = [pool.hash_entry(h) for h in (1, np.int64(1), np.uint64(1), np.uint64(9))]
        seen[name].append(pool.num_free)
    assert seen[backend] == seen["oracle"], f"{backend}: {seen[backend]}; the oracle: {seen['oracle']}"


@rule("HASH-207")
@pytest.mark.parametrize("backend", BACKENDS)
def test_hash_entry_of_a_negative_hash_is_none_as_the_oracle_says_even_where_the_table_has_used_slots(
    backend: str,
) -> None:
    """No hash is negative (HASH-207), so none has an entry: not on a fresh pool, and not after a
    hash was registered, freed, the pool reset and others registered (the table's empty and deleted
    slots are marked with negative keys; a lookup of one must not find such a slot's leftovers)."""
    seen = {}
    for name in ("oracle", backend):
        pool = pool_on(name, 4)
        answers = [pool.hash_entry(h) for h in (-1, -2, -(1 << 63))]
        held = pool.allocate(1, holder="a")
        pool.register(held, [30])
        pool.free(held, holder="a")
        pool.reset()
        held = pool.allocate(2, holder="a")
        pool.register(held, [7, 8])
        answers += [pool.hash_entry(h) for h in (-1, -2, 7, 8)]
        seen[name] = answers
    assert seen[backend] == seen["oracle"], f"{backend}: {seen[backend]}; the oracle: {seen['oracle']}"


@rule("EVICT-401")
@pytest.mark.parametrize(
    ("pushed", "moved"), [(20, 16), (24, 19)], ids=["exactly half: all move", "past half: the live move"]
)
def test_a_compaction_moves_all_entries_up_to_exactly_half_the_array_and_only_the_live_ones_past_it(
    ops: ArrayOps, pushed: int, moved: int
) -> None:
    """Capacity 32: ``pushed`` entries, the 4 oldest leave (the head passes them) and one more in the
    middle; a push that overflows the tail but fits after compaction. 16 entries from the head (half)
    all move, dead one included; 20 (past half) keep only their 19 live ones."""
    queue, stamps = queue_of(ops, 32)
    push(ops, queue, stamps, list(range(1, pushed + 1)), 0)
    for block in (1, 2, 3, 4, 10):
        stamps[block] = -1
    queue.trim(4)
    assert (queue.head, queue.tail) == (4, pushed)
    room = 33 - pushed  # tail + room > 32, (tail - head) + room <= 32
    push(ops, queue, stamps, list(range(40, 40 + room)), 100)
    assert (queue.head, queue.tail) == (0, moved + room), f"compacted to {queue.head}, {queue.tail}"
    live = [b for b in range(5, pushed + 1) if b != 10]
    assert ops.tolist(queue.oldest(64)) == [*live, *range(40, 40 + room)]


@rule("EVICT-406")
def test_under_fifo_the_registration_orders_head_passes_the_blocks_that_left(ops: ArrayOps) -> None:
    pool = ArrayBlockPool(6, ops=ops, policy="fifo")
    held = pool.allocate(3)
    pool.register(held, [1, 2, 3])
    pool.free(held)
    assert pool.evict(2)
    assert (pool.orders.fifo.head, pool.orders.lru.head) == (2, 2), "the two oldest left: both heads pass them"
