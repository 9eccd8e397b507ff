"""Benchmarks of the block pool's array surface beside the list forms: allocate n blocks, then free them.

Every usable backend's block pool through its fastest list-protocol spelling (the oracle's lists,
the device backends' ``allocate_ids``), and, as ``NAME-arrays``, through the array surface
(``create_block_arrays``: a request slot as the holder, int32 ids, every free checked on the
device, no host sync), as a GPU engine's scheduler would call it. One run, so ``kvref report``
can put them as ratios; the token-slot allocator's pair (and SGLang's) is in ``test_bench_slots``.

A round is :data:`PAIRS` pairs and then one wait for the device (none on the host), as the GPU
issue's table was measured: the time of a round over :data:`PAIRS` is what one pair costs when a
scheduler issues calls without waiting for each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvref.config.registry import backend_statuses, load_backend

BATCHES = [1, 16, 256, 4096]
POOL = 1 << 16
PAIRS = 20


def block_backends() -> list[str]:
    """Usable kvref backends (list protocol) and ``NAME-arrays`` for those with ``block-arrays``."""
    names = [s.name for s in backend_statuses() if s.usable and not s.name.startswith(("sglang", "vllm", "megatron"))]
    return names + [f"{s.name}-arrays" for s in backend_statuses() if s.usable and "block-arrays" in s.capabilities]


Pair = tuple[Callable[[int], Any], Callable[[Any], None], Callable[[], int], Callable[[], None]]


def pair(name: str, device: str | None) -> Pair:
    """The fastest allocate and free of implementation ``name``, its free count and its wait for the device."""
    if name.endswith("-arrays"):
        maker: Any = load_backend(name.removesuffix("-arrays"))
        pool = maker.create_block_arrays(POOL, device=device)
        allocate = lambda n: pool.allocate([n], [7])[0]  # noqa: E731
        return allocate, (lambda ids: pool.free(ids, 7)), pool.available_blocks, pool.ops.synchronize
    backend: Any = load_backend(name)
    lists = backend.create(POOL, device=None if name == "oracle" else device)
    allocate = getattr(lists, "allocate_ids", lists.allocate)
    wait = lists.ops.synchronize if hasattr(lists, "ops") else (lambda: None)
    return (lambda n: allocate(n, holder=7)), (lambda ids: lists.free(ids, holder=7)), (lambda: lists.num_free), wait


@pytest.mark.benchmark_suite
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("name", block_backends())
def test_blocks_allocate_then_free(benchmark: Any, request: pytest.FixtureRequest, name: str, batch: int) -> None:
    device = request.config.getoption("--kvref-bench-device")
    allocate, free, free_count, wait = pair(name, device)

    def round_() -> None:
        for _ in range(PAIRS):
            free(allocate(batch))
        wait()

    benchmark.extra_info.update(
        backend=name, workload="blocks-allocate-free", batch=batch, blocks_per_round=PAIRS * batch, pairs=PAIRS
    )
    benchmark(round_)
    assert free_count() == POOL - 1, f"{name}: {free_count()} of {POOL - 1} blocks free after the rounds"
