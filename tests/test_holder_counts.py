"""The per-holder counts of shared blocks (STATE-002): two pairs of a block inline, more in a table.

Held to a dict over every call the pool makes, batched and (on NumPy) element by element, and to
where the pairs sit: a block's first two pairs never probe the table.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvref_arraypool.holder_counts import HID_BITS, HolderCounts
from kvref_arraypool.ops import ArrayOps

rule = pytest.mark.rule
BLOCKS, HOLDERS = 5, 4


def arr(ops: ArrayOps, values: list[int]) -> Any:
    return ops.asarray(np.array(values, dtype=np.int64))


def host(a: Any) -> list[int]:
    return [int(x) for x in a.tolist()]


def counted(counts: HolderCounts) -> dict[tuple[int, int], int]:
    keys, values = counts.items()
    return {(k >> HID_BITS, k & 0xFFFFFFFF): v for k, v in zip(host(keys), host(values), strict=True)}


def agree(counts: HolderCounts, model: dict[tuple[int, int], int], ops: ArrayOps, after: str) -> None:
    assert counted(counts) == model, f"after {after}: the counts hold {counted(counts)}, a dict {model}"
    grid = [(b, h) for b in range(BLOCKS) for h in range(HOLDERS)]
    got = host(counts.get(arr(ops, [b for b, _ in grid]), arr(ops, [h for _, h in grid])))
    want = [model.get(pair, 0) for pair in grid]
    assert got == want, f"after {after}: get() of every pair gave {got}, the dict {want}"
    for b in range(BLOCKS):
        mine = {h: c for (bb, h), c in model.items() if bb == b}
        held = dict(counts.holders_of(b))
        assert held == mine, f"after {after}: holders_of({b}) is {held}, not {mine}"
        table_keys = host(counts.table.items()[0])
        in_table = sum(1 for k in table_keys if k >> HID_BITS == b)
        assert int(counts.spilled[b]) == in_table, (
            f"after {after}: spilled[{b}] = {int(counts.spilled[b])}, but the table holds {in_table} of its pairs"
        )


pairs = st.tuples(st.integers(0, BLOCKS - 1), st.integers(0, HOLDERS - 1))


@rule("STATE-002")
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_counts_of_shared_blocks_agree_with_a_dict_over_batched_adds_and_subtractions(
    ops: ArrayOps, data: st.DataObject
) -> None:
    counts = HolderCounts(ops, BLOCKS)
    model: dict[tuple[int, int], int] = {}
    for step in range(data.draw(st.integers(1, 14), label="steps")):
        subtracting: bool = data.draw(st.booleans(), label=f"subtract at {step}")
        if model and subtracting:
            chosen = data.draw(st.lists(st.sampled_from(sorted(model)), unique=True, min_size=1), label="pairs")
            taken = [data.draw(st.integers(1, model[p]), label=f"take from {p}") for p in chosen]
            counts.sub(arr(ops, [b for b, _ in chosen]), arr(ops, [h for _, h in chosen]), arr(ops, taken))
            for p, t in zip(chosen, taken, strict=True):
                model[p] -= t
                if not model[p]:
                    del model[p]
            what = f"sub {dict(zip(chosen, taken, strict=True))}"
        else:
            chosen = data.draw(st.lists(pairs, unique=True, min_size=1, max_size=12), label="pairs")
            given_ = [data.draw(st.integers(1, 3), label=f"add to {p}") for p in chosen]
            once = len({b for b, _ in chosen}) == len(chosen)  # each block once: the caller may say so
            distinct = once and data.draw(st.booleans(), label="distinct")
            blocks, hids = arr(ops, [b for b, _ in chosen]), arr(ops, [h for _, h in chosen])
            counts.add(blocks, hids, arr(ops, given_), distinct=distinct)
            for p, c in zip(chosen, given_, strict=True):
                model[p] = model.get(p, 0) + c
            what = f"add {dict(zip(chosen, given_, strict=True))}"
        agree(counts, model, ops, f"step {step}: {what}")


@rule("STATE-002")
def test_a_block_with_two_holders_keeps_both_inline_and_a_third_goes_to_the_table(ops: ArrayOps) -> None:
    counts = HolderCounts(ops, BLOCKS)
    counts.add(arr(ops, [2, 2, 3]), arr(ops, [0, 1, 0]), arr(ops, [4, 1, 1]))  # block 2 twice in one call
    assert counts.table.live == 0, f"two holders of block 2 and one of block 3 spilled {counts.table.live} pairs"
    assert (host(counts.first_holder), host(counts.second_holder)) == ([-1, -1, 0, 0, -1], [-1, -1, 1, -1, -1])
    counts.add(arr(ops, [2]), arr(ops, [3]), 1)
    assert counts.table.live == 1 and host(counts.spilled) == [0, 0, 1, 0, 0], "a third holder goes to the table"
    counts.sub(arr(ops, [2, 2]), arr(ops, [0, 3]), arr(ops, [4, 1]))
    assert counts.table.live == 0 and host(counts.spilled) == [0] * BLOCKS
    assert counted(counts) == {(2, 1): 1, (3, 0): 1}, f"left: {counted(counts)}"
    counts.add(arr(ops, [2]), arr(ops, [3]), 1)
    assert counts.table.live == 0, "a freed inline slot is taken again before the table"
    counts.clear()
    assert counted(counts) == {} and counts.table.live == 0
