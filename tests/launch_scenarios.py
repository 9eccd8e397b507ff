"""The calls the launch budget counts (``tests/launch_budget.toml``), each set up on a fresh target.

A scenario takes a target (a pool, an allocator, a block pool or its tables) and a batch size and
returns the one call :func:`tests.launch_counting.measure` counts; whatever the call needs is made
first, outside the count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "ARRAY_SCENARIOS",
    "BATCHES",
    "BLOCK_SCENARIOS",
    "CUDA_SCENARIOS",
    "SCENARIOS",
    "SLOT_SCENARIOS",
    "TABLE_SCENARIOS",
    "Scenario",
]

Scenario = Callable[[Any, int], Callable[[], object]]


def _allocate(pool: Any, n: int) -> Callable[[], object]:
    return lambda: pool.allocate_ids(n, holder="a")


def _free(pool: Any, n: int) -> Callable[[], object]:
    ids = pool.allocate_ids(n, holder="a")
    return lambda: pool.free(ids, holder="a")


def _chain(pool: Any, n: int) -> list[int]:
    hashes = list(range(1, n + 1))
    ids = pool.allocate(n, holder="c")
    pool.register(ids, hashes)
    pool.free(ids[::-1], holder="c")
    return hashes


def _match(pool: Any, n: int) -> Callable[[], object]:
    hashes = _chain(pool, n)
    return lambda: pool.match_ids(hashes, holder="m")


def _register(pool: Any, n: int) -> Callable[[], object]:
    ids = pool.allocate(n, holder="r")
    return lambda: pool.register(ids, list(range(1, n + 1)))


def _acquire(pool: Any, n: int) -> Callable[[], object]:
    ids = pool.allocate_ids(n, holder="a")
    return lambda: pool.acquire(ids, holder="b")


def _evicting_allocate(pool: Any, n: int) -> Callable[[], object]:
    _chain(pool, pool.num_free)  # every usable block cached: the allocation evicts all it takes
    return lambda: pool.allocate_ids(n, holder="a")


def _admission(pool: Any, n: int) -> Callable[[], object]:
    """A scheduler step admitting ``n`` requests of 4 blocks, half of them hits: match_many + allocate_many."""
    hashes = _chain(pool, 2)
    lists = [[*hashes, 10_000 + 2 * i, 10_001 + 2 * i] for i in range(n)]
    holders = [f"req-{i}" for i in range(n)]

    def step() -> object:
        hits = pool.match_many(lists, holders=holders)
        return pool.allocate_many([4 - len(h) for h in hits], holders=holders)

    return step


def _slots_alloc(slots: Any, n: int) -> Callable[[], object]:
    return lambda: slots.alloc_ids(n)


def _slots_free(slots: Any, n: int) -> Callable[[], object]:
    ids = slots.alloc_ids(n)
    return lambda: slots.free(ids)


def _slots_alloc_arrays(slots: Any, n: int) -> Callable[[], object]:
    return lambda: slots.alloc(n)


def _arrays_free(slots: Any, n: int) -> Callable[[], object]:
    ids = slots.alloc(n)
    return lambda: slots.free(ids)


def _arrays_pair(slots: Any, n: int) -> Callable[[], object]:
    """What the issue's table times: allocate ``n`` slots and free them, on the array surface."""
    return lambda: slots.free(slots.alloc(n))


def _blocks_allocate(pool: Any, n: int) -> Callable[[], object]:
    return lambda: pool.allocate([n], [3])


def _blocks_step(pool: Any, n: int) -> Callable[[], object]:
    """A scheduler step's allocation: ``n`` blocks over up to 16 request slots, in one call."""
    requests = min(n, 16)
    counts = [n // requests + (i < n % requests) for i in range(requests)]
    return lambda: pool.allocate(counts, list(range(requests)))


def _blocks_free(pool: Any, n: int) -> Callable[[], object]:
    ids, _ = pool.allocate([n], [3])
    return lambda: pool.free(ids, 3)


def _blocks_acquire(pool: Any, n: int) -> Callable[[], object]:
    ids, _ = pool.allocate([n], [3])
    slots = pool.ops.full(n, 4)
    return lambda: pool.acquire(ids, slots)


def _arrays_step(slots: Any, n: int) -> Callable[[], object]:
    """A scheduler step: free ``n`` slots and allocate ``n`` in one call (RADIX-616)."""
    ids = slots.alloc(n)
    return lambda: slots.free_then_alloc(ids, n)


def _blocks_acquire_one(pool: Any, n: int) -> Callable[[], object]:
    """``n`` blocks shared with one other request slot, given as one host int."""
    ids, _ = pool.allocate([n], [3])
    return lambda: pool.acquire(ids, 4)


def _blocks_pair(pool: Any, n: int) -> Callable[[], object]:
    """The issue's pair on the block pool: allocate ``n`` blocks for a request slot and free them."""
    return lambda: pool.free(pool.allocate([n], [3])[0], 3)


def _tables_rows(n: int) -> tuple[list[int], list[int]]:
    """A decode step of ``min(n, 256)`` requests that needs ``n`` new blocks in all (blocks of one token)."""
    requests = min(n, 256)
    return list(range(requests)), [-(-n // requests)] * requests


def _tables_step(tables: Any, n: int) -> Callable[[], object]:
    """Chapter 07's batched step (REQ-750): every row grown in one call."""
    slots, tokens = _tables_rows(n)
    return lambda: tables.step(slots, tokens)


def _tables_release(tables: Any, n: int) -> Callable[[], object]:
    """The release of a step's requests, every row in one ``free`` (REQ-752)."""
    slots, tokens = _tables_rows(n)
    tables.step(slots, tokens)
    return lambda: tables.release(slots)


#: Chapter 07's batched step over the block array surface (REQ-750..REQ-756).
TABLE_SCENARIOS: dict[str, Scenario] = {"block_tables_step": _tables_step, "block_tables_release": _tables_release}

#: Chapter 01's block pool with the array surface (ERR-517..ERR-520): request slots, int32 ids.
BLOCK_SCENARIOS: dict[str, Scenario] = {
    "block_arrays_allocate": _blocks_allocate,
    "block_arrays_step": _blocks_step,
    "block_arrays_free": _blocks_free,
    "block_arrays_acquire": _blocks_acquire,
    "block_arrays_pair": _blocks_pair,
}

#: Chapter 06's token-slot allocator: set-ups on a fresh allocator of pages of one slot. The
#: ``slots_*`` scenarios go through the list protocol (a free reads its verdict at once); the
#: ``slot_arrays_*`` ones through the array surface (ERR-510..ERR-514), int32 ids, nothing read back.
SLOT_SCENARIOS: dict[str, Scenario] = {"slots_alloc": _slots_alloc, "slots_free": _slots_free}
ARRAY_SCENARIOS: dict[str, Scenario] = {
    "slot_arrays_alloc": _slots_alloc_arrays,
    "slot_arrays_free": _arrays_free,
    "slot_arrays_pair": _arrays_pair,
    **BLOCK_SCENARIOS,
    **TABLE_SCENARIOS,
}

#: The array surfaces as CUDA runs them: the CUDA C kernels of ``kvref_cuda``, one launch a call,
#: counted with their launches stood in for (nothing compiled) beside what torch dispatches around them.
CUDA_SCENARIOS: dict[str, Scenario] = {
    "cuda_slot_arrays_alloc": _slots_alloc_arrays,
    "cuda_slot_arrays_free": _arrays_free,
    "cuda_slot_arrays_pair": _arrays_pair,
    "cuda_slot_arrays_step": _arrays_step,
    "cuda_block_arrays_allocate": _blocks_allocate,
    "cuda_block_arrays_free": _blocks_free,
    "cuda_block_arrays_acquire": _blocks_acquire_one,
    "cuda_block_arrays_pair": _blocks_pair,
}

#: Operation -> how to set up one measured call of it at batch size ``n`` on a fresh pool.
SCENARIOS: dict[str, Scenario] = {
    "allocate": _allocate,
    "free": _free,
    "acquire": _acquire,
    "match": _match,
    "register": _register,
    "evicting_allocate": _evicting_allocate,
    "admission": _admission,
}
BATCHES = (1, 16, 256, 4096)
