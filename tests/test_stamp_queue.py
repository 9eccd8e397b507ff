"""The eviction orders' append-only array (``kvref_arraypool.orders.StampQueue``, EVICT-401, EVICT-406).

An entry is live while the pool's stamp array holds its stamp; leaving the order is one write
there. A full array compacts: while its entries fill at most half of it they all move to the
front in one copy (no look at which are live: no host read on a device), else only the live ones.
Either way the oldest live entries come out in the order they joined.
"""

from __future__ import annotations

import numpy as np
import pytest
from kvref_arraypool.ops import ArrayOps
from kvref_arraypool.orders import StampQueue

rule = pytest.mark.rule


def queue_of(ops: ArrayOps, capacity: int) -> tuple[StampQueue, np.ndarray]:
    stamps = ops.full(64, -1)
    return StampQueue(ops, stamps, capacity), stamps


def push(ops: ArrayOps, queue: StampQueue, stamps: object, blocks: list[int], first_stamp: int) -> None:
    ids = ops.asarray(np.array(blocks, dtype=np.int64))
    new = ops.asarray(np.arange(first_stamp, first_stamp + len(blocks), dtype=np.int64))
    stamps[ids] = new  # type: ignore[index]
    queue.push(ids, new)


@rule("EVICT-401")
def test_a_compaction_moves_every_entry_while_they_fill_half_the_array_and_keeps_the_order(ops: ArrayOps) -> None:
    queue, stamps = queue_of(ops, 32)
    push(ops, queue, stamps, [1, 2, 3, 4, 5, 6], 0)
    stamps[3] = -1  # block 3 leaves the order in the middle
    push(ops, queue, stamps, [7, 8, 9, 10, 11, 12], 6)
    stamps[1] = -1  # the oldest leaves: the head passes it
    queue.trim(1)
    assert (queue.head, queue.tail) == (1, 12)
    push(ops, queue, stamps, list(range(13, 34)), 12)  # 12 + 21 > 32: the 11 entries from the head move first
    assert (queue.head, queue.tail) == (0, 32), (
        f"compacted to head {queue.head}, tail {queue.tail}; expected all 11 entries moved (one dead) and 21 pushed"
    )
    assert ops.tolist(queue.oldest(40)) == [2, 4, 5, 6, *range(7, 34)], (
        "after a compaction the live entries must come out oldest first, block 3 (left) skipped"
    )


@rule("EVICT-401")
def test_a_compaction_of_an_array_more_than_half_full_keeps_only_the_live_entries(ops: ArrayOps) -> None:
    queue, stamps = queue_of(ops, 16)
    push(ops, queue, stamps, list(range(1, 13)), 0)  # 12 entries: more than half of 16
    for block in (2, 4, 6, 8, 10):
        stamps[block] = -1
    push(ops, queue, stamps, [20, 21, 22, 23, 24, 25], 12)  # 12 + 6 > 16: only the 7 live entries move
    assert (queue.head, queue.tail) == (0, 13), f"compacted to head {queue.head}, tail {queue.tail}; expected 0, 13"
    assert ops.tolist(queue.oldest(20)) == [1, 3, 5, 7, 9, 11, 12, *range(20, 26)]
