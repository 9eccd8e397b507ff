"""The list pool's batched forms over arrays: ``allocate_many_ids`` and ``free_many_ids`` (POOL-116, POOL-117).

An engine that keeps block tables as arrays admits a step's requests with ``allocate_many_ids``
(every admitted entry's ids end to end, and offsets into them) and releases them with
``free_many_ids`` (the same layout). They must answer exactly as ``allocate_many`` and
``free_many`` do: here a pool whose batched calls go through the array forms runs the targeted
differential machine beside the oracle on each array path, and the offsets' own refusals are read.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from itertools import chain, pairwise
from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from kvref_arraypool.pool import ArrayBlockPool
from kvref_arraypool.table import HashTable

from kvref.contract.errors import InvalidTypeError, InvalidValueError, KVRefError, NotHeldError
from kvref_conformance.machines import make_machine
from kvref_conformance.target import Target
from tests.test_pool_paths import PATHS

rule = pytest.mark.rule


class FlatBatchPool(ArrayBlockPool):
    """A pool whose ``allocate_many`` and ``free_many`` go through their array forms, as an engine calls them."""

    def allocate_many(self, counts: Any, *, holders: Sequence[Hashable]) -> list[list[int]]:
        ids, offsets = self.allocate_many_ids(counts, holders=holders)
        flat = np.asarray(ids).tolist()
        return [flat[start:end] for start, end in pairwise(offsets)]

    def free_many(self, block_lists: Any, *, holders: Sequence[Hashable]) -> None:
        entries = list(block_lists) if isinstance(block_lists, (list, tuple)) else None
        if entries is None or not all(type(e) is list and all(type(b) is int for b in e) for e in entries):
            super().free_many(block_lists, holders=holders)  # what is wrong is named per entry there
            return
        offsets = [0, *np.cumsum([len(e) for e in entries], dtype=np.int64).tolist()]
        flat = np.array(list(chain.from_iterable(entries)), dtype=np.int64)
        self.free_many_ids(flat, offsets, holders=holders)


def flat_target(path: str) -> Target:
    make_ops = PATHS[path]
    make_ops()  # skips here when the library is missing

    def factory(num_blocks: int, **kwargs: Any) -> ArrayBlockPool:
        return FlatBatchPool(num_blocks, ops=make_ops(), name=f"{path}-flat", **kwargs)

    return Target.from_factory(f"{path}-flat", factory, capabilities=factory(2).capabilities(), profile="exact-order")


@rule("POOL-116", "POOL-117")
@pytest.mark.parametrize("policy", ["lru", "fifo"])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_array_forms_of_the_batched_calls_answer_as_the_oracle_does(path: str, policy: str) -> None:
    """The targeted machine (its batched steps included) beside the oracle, batches through the array forms."""
    machine = make_machine(flat_target(path), policy, targeted=True)
    run_state_machine_as_test(machine, settings=settings(max_examples=20, stateful_step_count=40, deadline=None))


@rule("PFX-320", "PFX-309")
@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_batched_match_probes_exactly_for_every_hash_the_quick_probe_gave_up_on(path: str, monkeypatch: Any) -> None:
    """``match_many`` takes ``HashTable.find_near``'s answers, read with its lengths, unless a hash is
    flagged as lying past its home's window: then it probes exactly. A quick probe that answers
    nothing and flags every hash (a crowded table): the hits are still the oracle's."""

    def gives_up(table: HashTable, keys: Any, default: int = -1) -> tuple[Any, Any]:
        ops = table.ops
        return ops.full(len(keys), default), ops.arange(len(keys)) >= 0

    monkeypatch.setattr(HashTable, "find_near", gives_up)
    machine = make_machine(flat_target(path), "lru", targeted=True)
    run_state_machine_as_test(machine, settings=settings(max_examples=20, stateful_step_count=40, deadline=None))


def admitted_pool() -> tuple[ArrayBlockPool, Any, list[int]]:
    """A pool of 10 after ``allocate_many_ids([2, 3], holders=["a", "b"])``."""
    pool = ArrayBlockPool(10, ops=PATHS["numpy-arrays"]())
    ids, offsets = pool.allocate_many_ids([2, 3], holders=["a", "b"])
    return pool, ids, offsets


@rule("POOL-116")
def test_allocate_many_ids_returns_the_admitted_prefix_end_to_end_with_its_offsets() -> None:
    pool = ArrayBlockPool(6, ops=PATHS["numpy-arrays"]())
    ids, offsets = pool.allocate_many_ids([2, 3, 4], holders=["a", "b", "c"])
    assert offsets == [0, 2, 5], (
        f"allocate_many_ids([2, 3, 4]) on 5 usable blocks gave offsets {offsets}; expected [0, 2, 5]"
    )
    assert len(ids) == 5 and pool.num_free == 0, f"{len(ids)} ids handed out, {pool.num_free} left free; expected 5, 0"
    ids[:] = 0  # the caller's own array: writing it leaves the pool alone
    pool.check_invariants()


@rule("ERR-506", "ERR-504", "ERR-503", "ERR-501")
@pytest.mark.parametrize(
    ("offsets", "holders", "error", "rule_id"),
    [
        ([0, 2], ["a", "b"], InvalidValueError, "ERR-506"),  # ends at 2 of 5
        ([1, 2, 5], ["a", "b"], InvalidValueError, "ERR-506"),  # starts past 0
        ([0, 2, 5], ["a"], InvalidValueError, "ERR-506"),  # one holder for two entries
        ([], [], InvalidValueError, "ERR-506"),  # no offsets at all
        ([0, 4, 3, 5], ["a", "b", "b"], InvalidValueError, "ERR-504"),  # an entry of -1 ids
        ([0, 2.0, 5], ["a", "b"], InvalidTypeError, "ERR-503"),  # a float offset
        ([0, True, 5], ["a", "b"], InvalidTypeError, "ERR-503"),  # a bool offset
        ([0, 3, 5], ["a", "b"], NotHeldError, "POOL-108"),  # b's first block given as a's
    ],
)
def test_free_many_ids_refuses_offsets_that_do_not_cut_the_ids_and_drops_nothing(
    offsets: list[Any], holders: list[str], error: type[KVRefError], rule_id: str
) -> None:
    pool, ids, _ = admitted_pool()
    before = pool.snapshot()
    with pytest.raises(error) as caught:
        pool.free_many_ids(ids, offsets, holders=holders)
    assert caught.value.rule == rule_id, f"free_many_ids(offsets={offsets}) raised {caught.value!r}; expected {rule_id}"
    assert str(caught.value).startswith(f"[{rule_id}] free_many_ids: "), (
        f"free_many_ids(offsets={offsets}) said {caught.value}; a refusal leads with its rule and call (ERR-501)"
    )
    assert pool.snapshot() == before, f"free_many_ids(offsets={offsets}) was refused but changed the pool"


@rule("ERR-501", "ERR-503", "ERR-504", "ERR-506")
@pytest.mark.parametrize(
    ("call", "error", "says"),
    [
        (lambda p: p.free_many_ids(["x"], [0, 1], holders=["a"]), InvalidTypeError, "[ERR-503] free_many_ids: "),
        (lambda p: p.free_many_ids([1], "01", holders=["a"]), InvalidTypeError, "[ERR-503] free_many_ids: offsets"),
        (lambda p: p.allocate_many_ids("3", holders=["a"]), InvalidTypeError, "[ERR-503] allocate_many_ids: counts"),
        (lambda p: p.allocate_many_ids([-1], holders=["a"]), InvalidValueError, "[ERR-504] allocate_many_ids: "),
        (lambda p: p.allocate_many_ids([1, 1], holders=["a"]), InvalidValueError, "[ERR-506] allocate_many_ids: "),
    ],
    ids=["bad id", "offsets a string", "counts a string", "a negative count", "holders short"],
)
def test_the_array_forms_name_themselves_in_a_refusal_and_change_nothing(
    call: Any, error: type[KVRefError], says: str
) -> None:
    pool, _, _ = admitted_pool()
    before = pool.snapshot()
    with pytest.raises(error) as caught:
        call(pool)
    assert str(caught.value).startswith(says), f"the refusal said {caught.value}; expected it to start {says!r}"
    assert pool.snapshot() == before, f"a refused call changed the pool: {caught.value}"


@rule("POOL-117")
def test_free_many_ids_releases_each_entry_for_its_holder() -> None:
    pool, ids, offsets = admitted_pool()
    pool.free_many_ids(ids, offsets, holders=["a", "b"])
    assert pool.num_free == 9, f"after freeing both entries {pool.num_free} blocks are free; expected all 9"
    pool.check_invariants()


@rule("ERR-504")
def test_an_offset_beyond_int64_is_named_as_given() -> None:
    pool, ids, _ = admitted_pool()
    with pytest.raises(InvalidValueError) as caught:
        pool.free_many_ids(ids, [np.int64(0), 2**70, 5], holders=["a", "b"])
    assert f"offsets[2] = 5 is below offsets[1] = {2**70}" in str(caught.value), (
        f"free_many_ids with offset 2**70 said {caught.value}; the message must quote the offset as given"
    )


@rule("ERR-504", "ERR-506")
@pytest.mark.parametrize(
    ("offsets", "holders", "says"),
    [
        ([1, 2, 5], ["a", "b"], "offsets must run from 0 to 5, got 1 to 5"),
        ([0, 2], ["a"], "offsets must run from 0 to 5, got 0 to 2"),
        ([], [], "offsets must run from 0 to 5, got none"),
        ([0, 2, 2, 1, 5], ["a", "a", "b", "b"], "offsets[3] = 1 is below offsets[2] = 2: a negative count"),
    ],
    ids=["starting past 0", "ending short", "none", "an empty entry before a negative one"],
)
def test_a_refusal_of_offsets_quotes_where_they_run_or_the_first_that_goes_back(
    offsets: list[int], holders: list[str], says: str
) -> None:
    pool, ids, _ = admitted_pool()
    with pytest.raises(InvalidValueError) as caught:
        pool.free_many_ids(ids, offsets, holders=holders)
    assert says in str(caught.value), f"free_many_ids(offsets={offsets}) said {caught.value}; expected {says!r}"


@rule("ERR-502", "ERR-501")
def test_an_id_beyond_int64_is_named_as_given_by_both_forms_of_free_many() -> None:
    pool, ids, offsets = admitted_pool()
    before = pool.snapshot()
    calls: list[Callable[[], None]] = [
        lambda: pool.free_many_ids([2**70, *np.asarray(ids).tolist()[1:]], offsets, holders=["a", "b"]),
        lambda: pool.free_many([[2**70], np.asarray(ids)[2:]], holders=["a", "b"]),
    ]
    for call in calls:
        with pytest.raises(KVRefError) as caught:
            call()
        assert str(2**70) in str(caught.value), f"the refusal said {caught.value}; it must quote the id as given"
    assert pool.snapshot() == before


@rule("POOL-116")
def test_allocate_many_ids_of_nothing_returns_no_ids_and_an_offset_per_entry() -> None:
    pool = ArrayBlockPool(4, ops=PATHS["numpy-arrays"]())
    ids, offsets = pool.allocate_many_ids([0, 0], holders=["a", "b"])
    assert len(ids) == 0 and offsets == [0, 0, 0], f"allocate_many_ids([0, 0]) gave {np.asarray(ids)}, {offsets}"


@rule("POOL-116", "EVICT-411")
@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_batched_allocation_stamps_each_entry_as_its_own_call_under_access_order(path: str) -> None:
    """Under lru-leaf-access each entry of ``allocate_many`` is an access after the entry before it,
    as single calls are, even where the free stack hands a later entry lower ids: the blocks are
    evicted in the oracle's order."""
    from kvref.oracle import OracleBlockPool

    orders = []
    for pool in (
        ArrayBlockPool(9, ops=PATHS[path](), policy="lru-leaf-access"),
        OracleBlockPool(9, policy="lru-leaf-access"),
    ):
        held = pool.allocate(8, holder="x")
        pool.free([held[i] for i in (6, 1, 3, 5, 0, 7, 2, 4)], holder="x")  # the free stack scrambled
        entries = pool.allocate_many([3, 2, 3], holders=["a", "b", "c"])
        for ids, holder in zip(entries, ["a", "b", "c"], strict=True):
            for b in ids:
                pool.register([b], [100 + b])  # every block a root, so every one a leaf
            pool.free(ids, holder=holder)
        orders.append([pool.allocate(1)[0] for _ in range(8)])  # each evicts the next victim
    assert orders[0] == orders[1], f"evicted in the order {orders[0]}; the oracle's single calls give {orders[1]}"


@rule("POOL-117")
def test_free_many_ids_takes_its_offsets_as_an_array_too() -> None:
    pool, ids, offsets = admitted_pool()
    pool.free_many_ids(ids, np.array(offsets, dtype=np.int64), holders=["a", "b"])
    assert pool.num_free == 9, f"offsets given as an array freed {9 - pool.num_free} too few blocks"


@rule("ERR-503")
@pytest.mark.parametrize("bad", [2.0, True], ids=["a float", "a bool"])
def test_free_many_refuses_a_value_that_is_no_int_among_plain_lists(bad: Any) -> None:
    pool, ids, _ = admitted_pool()
    first = np.asarray(ids).tolist()
    before = pool.snapshot()
    with pytest.raises(InvalidTypeError) as caught:
        pool.free_many([first[:2], [first[2], bad]], holders=["a", "b"])
    assert caught.value.rule == "ERR-503" and "block_lists[1]" in str(caught.value), f"said {caught.value}"
    assert pool.snapshot() == before


@rule("PFX-320")
@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_batched_match_of_empty_hash_lists_holds_nothing_and_counts_no_hit(path: str) -> None:
    """``match_many`` of two empty lists is two empty matches: no block held, no hit counted, as the oracle says."""
    from kvref.oracle import OracleBlockPool

    seen = []
    for pool in (ArrayBlockPool(4, ops=PATHS[path]()), OracleBlockPool(4)):
        held = pool.allocate(1, holder="x")
        pool.register(held, [5])
        pool.free(held, holder="x")
        got = pool.match_many([[], []], holders=["a", "b"])
        seen.append((got, pool.stats.hits, pool.snapshot()["held"]))
    assert seen[0] == seen[1], f"match_many([[], []]) gave {seen[0]}; the oracle's {seen[1]}"
