"""``kvref_cuda``'s CUDA C run on the CPU: each thread of a block an OS thread, ``__syncthreads`` a barrier.

The kernels of :data:`kvref_cuda.source.SOURCE` are compiled with the host's C++ compiler under a
small shim (``threadIdx`` and ``blockIdx`` thread-local, ``__shared__`` one static per block, the
atomics compare-and-swap loops, a block's barrier a ``std::barrier``) into a shared library, and
:func:`emulated` builds :class:`~kvref_cuda.kernels.CudaSlotKernels` or
:class:`~kvref_cuda.kernels.CudaBlockKernels` over NumPy arrays whose launches run there: the very
argument buffer :class:`~kvref_cuda.kernels._Launch` packs goes to an emulated launch that runs
each block's threads concurrently, so barriers and races behave as on a GPU as far as a CPU shows.

Where no C++20 compiler is found, :func:`emulated` skips. It is how the kernels' logic is checked
without a GPU (``tests/test_cuda_kernels.py``); a GPU still has the last word.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from kvref_cuda import kernels as cuda
from kvref_cuda.source import KERNELS, SOURCE

#: The device index the emulated module is filed under (no real device has it).
EMULATED = -7

_SHIM = r"""
#include <barrier>
#include <thread>
#include <vector>
struct kvref_dim3 { unsigned x, y, z; };
static thread_local kvref_dim3 threadIdx, blockIdx;
static kvref_dim3 blockDim, gridDim;
static std::barrier<>* kvref_block_barrier;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __shared__ static
inline void __syncthreads() { kvref_block_barrier->arrive_and_wait(); }
inline long long min(long long a, long long b) { return a < b ? a : b; }
template <typename V> inline V atomicMin(V* p, V v) {
    V old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
"""

_LAUNCHER = r"""
typedef long long L;
static void kvref_call(void* f, int n, const L* a) {
    switch (n) {
    case 9: ((void (*)(L, L, L, L, L, L, L, L, L))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8]); break;
    case 10: ((void (*)(L, L, L, L, L, L, L, L, L, L))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9]);
        break;
    case 13: ((void (*)(L, L, L, L, L, L, L, L, L, L, L, L, L))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7],
        a[8], a[9], a[10], a[11], a[12]); break;
    case 14: ((void (*)(L, L, L, L, L, L, L, L, L, L, L, L, L, L))f)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7],
        a[8], a[9], a[10], a[11], a[12], a[13]); break;
    }
}
extern "C" int kvref_emulate(void* f, int n, unsigned grid, unsigned block, void** params) {
    if (n != 9 && n != 10 && n != 13 && n != 14) return 1;
    L a[16];
    for (int i = 0; i < n; ++i) a[i] = *(L*)params[i];
    blockDim = {block, 1, 1};
    gridDim = {grid, 1, 1};
    for (unsigned b = 0; b < grid; ++b) {
        std::barrier<> bar(block);
        kvref_block_barrier = &bar;
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < block; ++t)
            threads.emplace_back([=] { threadIdx = {t, 0, 0}; blockIdx = {b, 0, 0}; kvref_call(f, n, a); });
        for (auto& th : threads) th.join();
    }
    return 0;
}
"""


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The emulation library, built once per source (cached in the temp directory); None without a compiler."""
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("clang++")
    if compiler is None:
        return None
    text = _SHIM + SOURCE + _LAUNCHER
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    where = os.path.join(tempfile.gettempdir(), f"kvref-cuda-emulation-{digest}")
    library = os.path.join(where, "kernels.so")
    if not os.path.exists(library):  # each process builds its own files, then one atomic rename wins
        os.makedirs(where, exist_ok=True)
        mine = f"{os.getpid()}"
        source, built_library = os.path.join(where, f"kernels.{mine}.cpp"), f"{library}.{mine}"
        with open(source, "w") as out:
            out.write(text)
        built = subprocess.run(
            [compiler, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-o", built_library, source],
            capture_output=True,
            text=True,
            check=False,
        )
        if built.returncode:
            raise RuntimeError(f"the CUDA C did not compile as emulated C++:\n{built.stderr[-3000:]}")
        os.replace(built_library, library)
        os.remove(source)
    lib = ctypes.CDLL(library)
    lib.kvref_emulate.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p]
    return lib


def _emulated_module(lib: ctypes.CDLL) -> Any:
    functions = {name: SimpleNamespace(ptr=ctypes.cast(getattr(lib, name), ctypes.c_void_p).value) for name in KERNELS}
    return SimpleNamespace(functions=functions)


def emulated(kind: str) -> Any:
    """``CudaSlotKernels`` (``kind="slot"``) or ``CudaBlockKernels`` (``"block"``) over NumPy arrays,
    their launches emulated on the CPU; a skip where no C++20 compiler is found."""
    lib = _library()
    if lib is None:
        pytest.skip("no C++ compiler here to emulate the CUDA kernels on the CPU")
    cuda._MODULES.setdefault(EMULATED, _emulated_module(lib))
    arrays = cuda.Arrays(
        device=EMULATED,
        address=lambda a: a.ctypes.data,
        empty=lambda n, dtype: np.empty(n, dtype=dtype),
        suffixes={np.dtype(np.int32): "i32", np.dtype(np.int64): "i64"},
        widen=lambda a: a.astype(np.int64),
        contiguous=np.ascontiguousarray,
        stream=lambda: 0,
    )
    made = cuda.CudaSlotKernels(arrays) if kind == "slot" else cuda.CudaBlockKernels(arrays)
    for launch in made._launches.values():
        if not isinstance(launch, cuda._Launch):  # the driver's path: its argument buffer is what is emulated
            raise TypeError(f"expected the driver's launches, got {launch!r}")
        launch.current_device = lambda: EMULATED
        launch.launch_kernel = functools.partial(_launch, lib, len(launch.values))
    return made


def _launch(lib: ctypes.CDLL, count: int, handle: int, gx: int, gy: int, gz: int, bx: int, *rest: int) -> None:
    """``cuLaunchKernel``'s arguments (grid, block, shared memory, stream, the argument buffer, extra), emulated."""
    params = rest[4]
    if lib.kvref_emulate(handle, count, gx, bx, params):
        raise RuntimeError(f"the emulator takes 9, 10, 13 or 14 parameters, not {count}")
