"""Benchmarks of chapter 06's token-slot allocators side by side: alloc n slots, then free them.

Every backend with ``create_slots`` (the oracle, torch, CuPy) and, where SGLang imports (``nox
-s bench-peers``), SGLang's own ``TokenToKVPoolAllocator``, in one run so a report can put them as
ratios. The device allocators are driven through their list form with device ids (``alloc_ids``)
and, as ``NAME-arrays``, through the array surface (``create_slot_arrays``: int32 ids, every free
checked on the device, no host sync), as an engine keeping slot ids on the device would; SGLang's
through its tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvref.config.registry import backend_statuses, load_backend

BATCHES = [1, 16, 256, 4096]
POOL = 1 << 16


def slot_backends() -> list[str]:
    """Usable backends that make token-slot allocators, and ``sglang-direct`` where SGLang imports."""
    names = [s.name for s in backend_statuses() if s.usable and "token-slots" in s.capabilities]
    names = [n for n in names if not n.startswith("sglang")]
    names += [f"{s.name}-arrays" for s in backend_statuses() if s.usable and "slot-arrays" in s.capabilities]
    try:
        import sglang.srt.mem_cache.allocator  # noqa: F401
    except Exception:  # SGLang absent, or a dependency of it
        return names
    return [*names, "sglang-direct"]


def pair(name: str, size: int, device: str | None) -> tuple[Callable[[int], Any], Callable[[Any], None]]:
    """The fastest alloc and free of implementation ``name``."""
    if name == "sglang-direct":
        import torch
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator

        sglang = TokenToKVPoolAllocator(size, torch.float16, device or "cpu", None, False)
        return sglang.alloc, sglang.free
    if name.endswith("-arrays"):  # the array surface (ERR-510): int32 ids, checked on the device, no sync
        maker: Any = load_backend(name.removesuffix("-arrays"))
        arrays = maker.create_slot_arrays(size, device=device)
        return arrays.alloc, arrays.free
    backend: Any = load_backend(name)
    allocator = backend.create_slots(size, device=None if name == "oracle" else device)
    return getattr(allocator, "alloc_ids", allocator.alloc), allocator.free


@pytest.mark.benchmark_suite
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("name", slot_backends())
def test_slots_alloc_then_free(benchmark: Any, request: pytest.FixtureRequest, name: str, batch: int) -> None:
    device = request.config.getoption("--kvref-bench-device")
    alloc, free = pair(name, POOL, device)

    def round_() -> None:
        got = alloc(batch)
        assert got is not None and len(got) == batch, f"{name}: alloc({batch}) of a {POOL}-slot pool gave {got}"
        free(got)

    benchmark.extra_info.update(backend=name, workload="slots-alloc-free", batch=batch, blocks_per_round=batch)
    benchmark(round_)
