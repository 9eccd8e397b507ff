"""CONF-908 on a real GPU: a captured CUDA graph reads the pool's arrays while the pool changes.

For a pool declaring ``cuda-graph``: a kernel reading ``graph_arrays()`` (``ref``, ``gen``,
``bhash``) is captured once into a CUDA graph; then pool operations and graph replays alternate,
and every replay must see the state the protocol reports at that moment, which holds only if the
arrays kept their addresses and the pool wrote them in place. Skipped with its reason on a pool
without the capability (every pool on a host without CUDA).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvref_conformance.suites.base import ConformanceSuite, requires, rule
from kvref_conformance.target import Target

__all__ = ["CudaGraphSuite"]

_SUMS = r"""
extern "C" __global__ void kvref_sums(const long long* ref, const long long* gen, const long long* bhash,
                                      long long n, long long* out) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        long long refs = 0, hashed = 0, gens = 0;
        for (long long i = 0; i < n; ++i) { refs += ref[i]; hashed += bhash[i] >= 0; gens += gen[i]; }
        out[0] = refs; out[1] = hashed; out[2] = gens;
    }
}
"""


def _torch_graph(arrays: dict[str, Any]) -> tuple[Callable[[], list[int]], Any]:  # pragma: no cover - CUDA
    import torch

    ref, gen, bhash = arrays["ref"], arrays["gen"], arrays["bhash"]
    out = torch.zeros(3, dtype=torch.int64, device=ref.device)

    def body() -> None:
        out[0].copy_(ref.sum())
        out[1].copy_((bhash >= 0).sum())
        out[2].copy_(gen.sum())

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up outside the capture, as torch.cuda.graph asks
            body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()

    def replay() -> list[int]:
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        return [int(v) for v in out.tolist()]

    return replay, graph


def _cupy_graph(arrays: dict[str, Any]) -> tuple[Callable[[], list[int]], Any]:  # pragma: no cover - CUDA
    import cupy

    ref, gen, bhash = arrays["ref"], arrays["gen"], arrays["bhash"]
    out = cupy.zeros(3, dtype=cupy.int64)
    kernel = cupy.RawKernel(_SUMS, "kvref_sums")
    args = (ref, gen, bhash, cupy.int64(len(ref)), out)
    kernel((1,), (1,), args)  # compiled and loaded before the capture
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        kernel((1,), (1,), args)
        graph = stream.end_capture()

    def replay() -> list[int]:
        cupy.cuda.Device().synchronize()
        graph.launch(stream)
        stream.synchronize()
        return [int(v) for v in out.tolist()]

    return replay, graph


def _seen_by_the_protocol(pool: Any) -> list[int]:
    blocks = range(pool.num_blocks)
    return [
        sum(pool.ref_count(b) for b in blocks),
        sum(pool.block_hash(b) is not None for b in blocks),
        sum(pool.generation(b) for b in blocks),
    ]


class CudaGraphSuite(ConformanceSuite):
    """CONF-908 for a pool declaring ``cuda-graph``: captured graphs read the current state."""

    @rule("CONF-908")
    @requires("cuda-graph", "prefix-cache")
    def test_a_captured_graph_reads_the_current_state_between_pool_operations(self, impl: Target) -> None:
        pool = self.pool(impl, 64)
        arrays = pool.graph_arrays()
        library = type(arrays["ref"]).__module__.split(".")[0]
        replay, _graph = (_torch_graph if library == "torch" else _cupy_graph)(arrays)
        steps: list[Callable[[], object]] = [
            lambda: pool.allocate(5, holder="a"),
            lambda: pool.register(pool.allocate(3, holder="b"), [11, 12, 13]),
            lambda: pool.match([11, 12], holder="c"),
            lambda: pool.reset() if pool.num_in_use == 0 else pool.allocate(1, holder="a"),
        ]
        for i, step in enumerate(steps * 3):
            step()
            got, want = replay(), _seen_by_the_protocol(pool)
            assert got == want, (
                f"[CONF-908] after step {i}, a replay of the captured graph read (references, hashed blocks, "
                f"generations) = {got}; the protocol reports {want}: the arrays moved or were not written in place"
            )
