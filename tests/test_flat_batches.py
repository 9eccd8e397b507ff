"""The list pool's batched forms over arrays: ``allocate_many_ids`` and ``free_many_ids`` (POOL-116, POOL-117).

An engine that keeps block tables as arrays admits a step's requests with ``allocate_many_ids``
(every admitted entry's ids end to end, and offsets into them) and releases them with
``free_many_ids`` (the same layout). They must answer exactly as ``allocate_many`` and
``free_many`` do: here a pool whose batched calls go through the array forms runs the targeted
differential machine beside the oracle on each array path, and the offsets' own refusals are read.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import chain, pairwise
from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from kvref_arraypool.pool import ArrayBlockPool

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
