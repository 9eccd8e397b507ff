"""What one launch costs on this GPU, by each path kvref can take: the floor under a fused call.

Each figure is microseconds per call, issued back to back (:data:`CALLS` calls, then one wait for
the device; the median of :data:`ROUNDS` rounds): a Triton kernel through Triton's dispatch, through
:class:`kvref_torch.launching.Launcher` and through its compiled launcher alone; a CuPy
``RawKernel`` on CuPy arrays and on torch tensors' addresses; ``torch.empty``; a small torch
in-place add and a ``torch.cat``; and reading torch's current stream. The slot allocator's calls
of ``torch-triton``, ``torch`` and ``cupy`` are timed one by one too (``alloc`` alone, ``free`` alone).

``python scripts/gpu_launch_costs.py [--out results/gpu/launch-costs]`` writes ``.json`` and prints
a table. CUDA only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

CALLS = 2000
ROUNDS = 5


def per_call(step: Callable[[], object], sync: Callable[[], None], calls: int = CALLS) -> float:
    """Microseconds per call of ``step``: the median round of ``calls`` calls and one wait."""
    step()
    sync()
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        sync()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(rounds)


def slot_calls(name: str, sync: Callable[[], None]) -> dict[str, float]:
    """The slot array surface of backend ``name`` on ``cuda:0``: ``alloc(n)`` alone and ``free`` alone."""
    from kvref.config.registry import load_backend

    backend: Any = load_backend(name)
    rows = {}
    for n in (1, 4096):
        calls = 40 if n > 16 else CALLS  # within the pool of 10**6 slots, without a merge
        slots = backend.create_slot_arrays(1_000_000, device="cuda:0")
        held = iter([slots.alloc(n) for _ in range(calls * (ROUNDS + 1) + 1)])
        rows[f"{name} slot free({n}) alone"] = per_call(lambda: slots.free(next(held)), sync, calls)  # noqa: B023
        fresh = backend.create_slot_arrays(1_000_000, device="cuda:0")
        rows[f"{name} slot alloc({n}) alone"] = per_call(lambda: fresh.alloc(n), sync, calls)  # noqa: B023
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", default="results/gpu/launch-costs")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_launch_costs: no CUDA device", file=sys.stderr)
        return 3
    import cupy
    import triton
    import triton.language as tl

    from kvref_torch.launching import Launcher

    def sync() -> None:
        torch.cuda.synchronize()

    @triton.jit(do_not_specialize=["n"])  # type: ignore[untyped-decorator]
    def touch(x_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        i = tl.arange(0, BLOCK)
        tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)

    x = torch.zeros(1024, dtype=torch.int64, device="cuda")
    rows: dict[str, float] = {}
    rows["triton dispatch kernel[grid](...)"] = per_call(lambda: touch[(1,)](x, 16, BLOCK=16), sync)
    launcher = Launcher(touch)
    rows["kvref Launcher"] = per_call(lambda: launcher((1,), x, 16, BLOCK=16), sync)
    compiled = touch[(1,)](x, 16, BLOCK=16)
    run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    stream = torch.cuda.current_stream().cuda_stream
    rows["compiled.run alone"] = per_call(
        lambda: run(1, 1, 1, stream, function, meta, None, None, None, x, 16, 16), sync
    )
    rows["torch._C._cuda_getCurrentRawStream"] = per_call(lambda: torch._C._cuda_getCurrentRawStream(0), sync)
    raw = cupy.RawKernel(
        r"""extern "C" __global__ void touch(long long* x, int n) {
            int i = threadIdx.x; if (i < n) x[i] += 1; }""",
        "touch",
    )
    y = cupy.zeros(1024, dtype=cupy.int64)
    n16 = cupy.int32(16)
    rows["cupy RawKernel on a cupy array"] = per_call(lambda: raw((1,), (32,), (y, n16)), sync)
    rawp = cupy.RawKernel(
        r"""extern "C" __global__ void touchp(unsigned long long p, int n) {
            long long* x = (long long*)p; int i = threadIdx.x; if (i < n) x[i] += 1; }""",
        "touchp",
    )
    ptr = cupy.uint64(x.data_ptr())
    rows["cupy RawKernel on a torch address"] = per_call(lambda: rawp((1,), (32,), (ptr, n16)), sync)
    rows["torch.empty(16, int32)"] = per_call(lambda: torch.empty(16, dtype=torch.int32, device="cuda"), sync)
    rows["torch x[:16].add_(1)"] = per_call(lambda: x[:16].add_(1), sync)
    a, b = x[:512], x[512:520]
    rows["torch.cat (512 + 8)"] = per_call(lambda: torch.cat((a, b)), sync)

    for name in ("torch-triton", "torch", "cupy"):
        rows.update(slot_calls(name, sync))
    width = max(len(k) for k in rows)
    for name, us in rows.items():
        print(f"{name:<{width}}  {us:8.2f} us")
    with open(f"{args.out}.json", "w") as out:
        json.dump({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
                   "cupy": cupy.__version__, "us_per_call": rows}, out, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
