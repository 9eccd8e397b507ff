"""Allocate n + free, side by side in one process: kvref's surfaces beside SGLang's allocators.

The GPU issue's table, remade: for each implementation and n in 1, 16, 256, 4096, a round is
:data:`PAIRS` pairs of alloc(n) + free(those ids) issued back to back and then one wait for the
device; the time of a pair is the round's over :data:`PAIRS` (the median of :data:`ROUNDS`
rounds, after a warm-up round). On CUDA the same pairs run once more under torch's profiler,
whose CUPTI trace sees every kernel of the process (torch's and CuPy's alike): it
counts kernel launches, host-device copies and host synchronisations per pair.

Implementations: kvref's oracle (host lists); the token-slot allocator's array surface
(``create_slot_arrays``) and the block pool's (``create_block_arrays``, a request slot as holder)
of every usable device backend (torch, CuPy), the slot surface also as a scheduler
step (``free_then_alloc``: the pair in one call); the block pool's list protocol
(``allocate_ids``) of the device backends; and, where ``sglang.srt.mem_cache.allocator``
imports (see ``scripts/sglang_allocators.py`` for a GPU machine), SGLang's
``TokenToKVPoolAllocator`` and ``PagedTokenToKVPoolAllocator`` (page 16, n >= 16).

``python scripts/gpu_pairs.py [--device cuda:0] [--out results/gpu/pairs]`` writes ``.json``
(every figure, the device and versions) and ``.md`` (the table) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from kvref.config.registry import backend_statuses, load_backend

BATCHES = (1, 16, 256, 4096)
POOL = 1_000_000
PAIRS = 200
ROUNDS = 5
PROFILED_PAIRS = 10

Pair = tuple[Callable[[int], Any], Callable[[Any], None]]


def sglang_makers(device: str) -> dict[str, Callable[[], Pair]]:
    """SGLang's allocators, where they import."""
    try:
        import torch
        from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    except Exception as exc:  # SGLang absent, or a dependency of it
        print(f"gpu_pairs: SGLang's allocators do not import ({exc}); measured without them", file=sys.stderr)
        return {}

    def token(sort: bool) -> Callable[[], Pair]:
        def make() -> Pair:
            allocator = TokenToKVPoolAllocator(POOL, torch.float16, device, None, sort)
            return allocator.alloc, allocator.free

        return make

    def paged() -> Pair:
        allocator = PagedTokenToKVPoolAllocator(POOL, 16, torch.float16, device, None, False)
        return allocator.alloc, allocator.free

    return {"sglang token": token(False), "sglang token need_sort": token(True), "sglang paged16": paged}


def kvref_makers(device: str) -> dict[str, Callable[[], Pair]]:
    """kvref's oracle and every usable device backend's surfaces."""
    makers: dict[str, Callable[[], Pair]] = {}
    oracle: Any = load_backend("oracle")

    def oracle_slots() -> Pair:
        slots = oracle.create_slots(POOL)
        return slots.alloc, slots.free

    makers["kvref oracle slots"] = oracle_slots
    for status in backend_statuses():
        if not status.usable or status.name == "oracle" or status.name.startswith(("sglang", "vllm", "megatron")):
            continue
        backend: Any = load_backend(status.name)
        if "slot-arrays" in status.capabilities:
            makers[f"kvref {status.name} slot arrays"] = slot_arrays(backend, device)
            makers[f"kvref {status.name} slot arrays, step"] = slot_steps(backend, device)
        if "block-arrays" in status.capabilities:
            makers[f"kvref {status.name} block arrays"] = block_arrays(backend, device)
        if status.name in ("torch", "cupy"):
            makers[f"kvref {status.name} block list"] = block_list(backend, device)
    return makers


def slot_arrays(backend: Any, device: str) -> Callable[[], Pair]:
    def make() -> Pair:
        arrays = backend.create_slot_arrays(POOL, device=device)
        return arrays.alloc, arrays.free

    return make


def slot_steps(backend: Any, device: str) -> Callable[[], Pair]:
    """A scheduler step's form of the pair: each ``alloc`` frees the slots the last pair handed back
    (``free_then_alloc``, RADIX-616), so a pair is one call; the first ``alloc`` frees nothing."""

    def make() -> Pair:
        arrays = backend.create_slot_arrays(POOL, device=device)
        returned: list[Any] = []

        def alloc(n: int) -> Any:
            return arrays.free_then_alloc(returned.pop(), n) if returned else arrays.alloc(n)

        return alloc, returned.append

    return make


def block_arrays(backend: Any, device: str) -> Callable[[], Pair]:
    def make() -> Pair:
        pool = backend.create_block_arrays(POOL, device=device)
        return (lambda n: pool.allocate([n], [7])[0]), (lambda ids: pool.free(ids, 7))

    return make


def block_list(backend: Any, device: str) -> Callable[[], Pair]:
    def make() -> Pair:
        pool = backend.create(POOL, device=device)
        return (lambda n: pool.allocate_ids(n, holder=7)), (lambda ids: pool.free(ids, holder=7))

    return make


def synchronize(device: str) -> None:
    """Wait for every stream of the device (torch's and CuPy's share the device's queue here)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
        try:
            import cupy

            cupy.cuda.Device().synchronize()
        except ImportError:
            pass


def time_pair(pair: Pair, n: int, device: str) -> float:
    """Microseconds per pair: the median round of :data:`PAIRS` pairs and one wait."""
    alloc, free = pair
    rounds = []
    for i in range(ROUNDS + 1):
        start = time.perf_counter()
        for _ in range(PAIRS):
            free(alloc(n))
        synchronize(device)
        if i:
            rounds.append((time.perf_counter() - start) / PAIRS * 1e6)
    return statistics.median(rounds)


def count_pair(pair: Pair, n: int, device: str) -> dict[str, float]:
    """Kernels, copies and synchronisations per pair, from CUPTI's trace (CUDA only)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    alloc, free = pair
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_PAIRS):
            free(alloc(n))
        torch.cuda.synchronize()
    counts = {"launches": 0, "copies": 0, "syncs": 0}
    for event in prof.events():
        name = event.name
        if "LaunchKernel" in name or name in ("cuLaunchKernelEx", "cudaGraphLaunch"):
            counts["launches"] += 1
        elif "Memcpy" in name and not name.startswith("Memcpy"):
            counts["copies"] += 1
        # The closing torch.cuda.synchronize is a cudaDeviceSynchronize; no allocator calls that one.
        if ("Synchronize" in name and name != "cudaDeviceSynchronize") or name in ("cudaMemcpy", "cuMemcpyDtoH_v2"):
            counts["syncs"] += 1
    return {key: value / PROFILED_PAIRS for key, value in counts.items()}


def measure(makers: dict[str, Callable[[], Pair]], device: str) -> list[dict[str, Any]]:
    rows = []
    for name, make in makers.items():
        for n in BATCHES:
            if name.endswith("paged16") and n % 16:
                continue
            try:
                pair = make()
                free, alloc = pair[1], pair[0]
                free(alloc(n))  # warm: compile kernels, fill caches
                row: dict[str, Any] = {"impl": name, "n": n, "us_per_pair": time_pair(pair, n, device)}
                if device.startswith("cuda") and n in (1, 4096):
                    row.update(count_pair(pair, n, device))
            except Exception as exc:  # a failing implementation is a row that says why, not a lost table
                row = {"impl": name, "n": n, "error": f"{type(exc).__name__}: {exc}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table: one row per implementation, per n the microseconds (launches, syncs) per pair."""
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    lines = ["| implementation | " + " | ".join(f"n={n}" for n in BATCHES) + " |", "|---|" + "---:|" * len(BATCHES)]
    for impl in impls:
        cells = []
        for n in BATCHES:
            row = next((r for r in rows if r["impl"] == impl and r["n"] == n), None)
            if row is None:
                cells.append("-")
            elif "error" in row:
                cells.append("error")
            else:
                cell = f"{row['us_per_pair']:,.1f} us"
                if "launches" in row:
                    cell += f" ({row['launches']:g} k, {row['syncs']:g} s)"
                cells.append(cell)
        lines.append(f"| {impl} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--out", default="results/gpu/pairs")
    parser.add_argument("--only", default="", help="comma-separated: measure only names containing one of these")
    args = parser.parse_args()
    makers = {**sglang_makers(args.device), **kvref_makers(args.device)}
    wanted = args.only.split(",")
    makers = {k: v for k, v in makers.items() if any(w in k for w in wanted)}
    rows = measure(makers, args.device)
    info: dict[str, Any] = {"device": args.device, "python": platform.python_version(), "pool": POOL, "pairs": PAIRS}
    if args.device.startswith("cuda"):
        import torch

        info["gpu"] = torch.cuda.get_device_name(args.device)
        info["torch"] = torch.__version__
    text = table(rows)
    with open(f"{args.out}.json", "w") as out:
        json.dump({"machine": info, "rows": rows}, out, indent=1)
    with open(f"{args.out}.md", "w") as out:
        out.write(f"Allocate n + free, us per pair (kernel launches k, host syncs s per pair): {info}\n\n{text}\n")
    print(text)
    errors = [r for r in rows if "error" in r]
    for r in errors:
        print(f"gpu_pairs: {r['impl']} n={r['n']}: {r['error']}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
