"""The fused calls of the array surfaces as CUDA C kernels, launched through CuPy (one launch a call).

:class:`CudaSlotKernels` is a :class:`kvref_arraypool.slot_arrays.SlotKernels` and
:class:`CudaBlockKernels` a :class:`kvref_arraypool.block_arrays.BlockKernels`, over the kernels of
:mod:`kvref_cuda.source`. One launch a call costs far less than the forty to seventy array
operations of the array path (a slot pair took 23-35 us on an H100, against 790-1,650 us), so
these are what a CUDA build of the ``cupy`` backend runs, and what the ``torch`` backend runs on
CUDA where CuPy is installed. The launch goes to the driver itself: on that H100 CuPy's
``RawKernel`` call cost 8.7 us and a Triton kernel through Python 13-19 us.

Arrays reach a kernel by their device addresses through :class:`Arrays`: CuPy arrays, launched on
CuPy's current stream (:func:`cupy_arrays`), or torch tensors, on torch's (:func:`torch_arrays`).
The module compiles once per device (NVRTC, cached on disk by CuPy); each launch goes to the
driver directly (:class:`_Launch`).
"""

from __future__ import annotations

import ctypes
import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvref_cuda.source import KERNELS, MAX_CALL, MAX_THREADS, PARAMETERS, SOURCE

__all__ = ["Arrays", "CudaBlockKernels", "CudaSlotKernels", "DryLaunch", "cupy_arrays", "torch_arrays"]

_DTYPE_SUFFIX = {"int32": "i32", "int64": "i64"}


@dataclass(frozen=True)
class Arrays:
    """How one array library meets the kernels: addresses, fresh outputs, the stream to launch on.

    ``address(a)`` is array ``a``'s device address; ``empty(n, dtype)`` a fresh array of
    ``"int32"``, ``"int64"`` or ``"bool"``; ``suffixes`` maps the library's int32 and int64
    dtypes to the kernels' suffixes (ids of another dtype are widened to int64 first, by
    ``widen``); ``contiguous(a)`` the caller's ids laid out densely (the kernels read entry ``i``
    at ``base + i``); ``stream()`` the library's current stream, a driver handle, read while
    ``device`` is current (:class:`_Launch` makes it so).
    """

    device: int
    address: Callable[[Any], int]
    empty: Callable[[int, str], Any]
    suffixes: dict[Any, str]
    widen: Callable[[Any], Any]
    contiguous: Callable[[Any], Any]
    stream: Callable[[], int]


def cupy_arrays(device: int) -> Arrays:
    """CuPy arrays on CUDA device ``device``, launched on CuPy's current stream there.

    What the kernels make (outputs, widened or dense copies) is made on ``device`` whatever device
    is current, and ids that live on another device are copied over first: a kernel on one GPU
    must never be handed another GPU's address.
    """
    import cupy

    current = cupy.cuda.runtime.getDevice

    def here(make: Callable[[], Any]) -> Any:
        if current() == device:
            return make()
        with cupy.cuda.Device(device):
            return make()

    def dense(a: Any) -> Any:
        if a.flags.c_contiguous and a.device.id == device:
            return a
        return here(a.copy)  # a copy is made on the current device, C-ordered

    return Arrays(
        device=device,
        address=lambda a: a.data.ptr,
        empty=lambda n, dtype: here(lambda: cupy.empty(n, dtype=dtype)),
        suffixes={cupy.dtype(cupy.int32): "i32", cupy.dtype(cupy.int64): "i64"},
        widen=lambda a: here(lambda: a.astype(cupy.int64)),
        contiguous=dense,
        stream=lambda: cupy.cuda.get_current_stream().ptr,  # read where _Launch has made the device current
    )


def torch_arrays(device: int, *, tensors: str | None = None) -> Arrays:
    """torch tensors on CUDA device ``device``, launched on torch's current stream there.

    ``tensors`` puts the outputs on another torch device (``"cpu"``): for kernels whose launches are
    only counted (:class:`CudaSlotKernels`'s ``launch``), never for a real launch.
    """
    import torch

    where = torch.device(tensors) if tensors is not None else torch.device("cuda", device)
    dtypes = {"int32": torch.int32, "int64": torch.int64, "bool": torch.bool}
    raw_stream = _raw_stream_reader() if tensors is None else None  # counted launches read no stream

    def stream() -> int:
        if raw_stream is not None:
            return int(raw_stream(device))
        return int(torch.cuda.current_stream(where).cuda_stream)

    return Arrays(
        device=device,
        address=lambda t: t.data_ptr(),
        empty=lambda n, dtype: torch.empty(n, dtype=dtypes[dtype], device=where),
        suffixes={torch.int32: "i32", torch.int64: "i64"},
        widen=lambda t: t.to(torch.int64),
        contiguous=lambda t: t if t.is_contiguous() else t.contiguous(),
        stream=stream,
    )


def _raw_stream_reader() -> Callable[[int], int] | None:
    """torch's current stream on a device as a driver handle, read the way Triton's launcher reads
    it (its public driver API: no ``torch.cuda.Stream`` object made a launch), where Triton is
    installed; else None, and torch's public ``current_stream`` is asked each time."""
    try:
        from triton.runtime.driver import driver

        reader: Callable[[int], int] = driver.active.get_current_stream
    except Exception:  # no Triton, or no CUDA driver it can use
        return None
    return reader


class _Module:
    """The kernels of :data:`kvref_cuda.source.SOURCE` on one device, compiled when first built."""

    def __init__(self, device: int) -> None:
        import cupy

        with cupy.cuda.Device(device):
            self.module = cupy.RawModule(code=SOURCE, options=("-std=c++17",))
            # RawModule hands out RawKernels; their .kernel is the loaded function, whose .ptr the driver takes
            self.functions = {name: self.module.get_function(name).kernel for name in KERNELS}


_MODULES: dict[int, _Module] = {}


def _module(device: int) -> _Module:
    module = _MODULES.get(device)
    if module is None:
        module = _MODULES[device] = _Module(device)
    return module


class _Launch:
    """Launches of one kernel through the driver, its arguments in one reused buffer of 8-byte slots.

    CuPy's ``RawKernel`` call converts every argument on every launch, which cost more than the
    launch itself on an H100 (8.7 us a call of two arguments). Here the kernel's arguments (every
    parameter is 8 bytes: an address or an ``i64``) are packed into one ctypes buffer whose slots'
    addresses the driver reads; ``cuLaunchKernel`` copies them at the launch, so the buffer is
    reused at once. One buffer per kernels object, and so per allocator or pool: like them, it is
    for one thread at a time.
    """

    def __init__(self, function: Any, count: int) -> None:
        from cupy.cuda import driver, runtime

        self.function = function  # keeps the handle's module alive
        self.handle = function.ptr
        self.values = (ctypes.c_int64 * count)()
        base = ctypes.addressof(self.values)
        self.pointers = (ctypes.c_uint64 * count)(*(base + 8 * i for i in range(count)))
        self.params = ctypes.addressof(self.pointers)
        self.pack = struct.Struct(f"{count}q").pack_into  # 0.4 us for 14 ints, a NumPy slice write 1.5 us
        self.launch_kernel = driver.launchKernel
        self.current_device = runtime.getDevice

    def __call__(self, arrays: Arrays, grid: int, block: int, args: tuple[int, ...]) -> None:
        self.pack(self.values, 0, *args)
        if self.current_device() != arrays.device:  # the module's context is its device's
            import cupy

            with cupy.cuda.Device(arrays.device):
                self.launch_kernel(self.handle, grid, 1, 1, block, 1, 1, 0, arrays.stream(), self.params, 0)
            return
        self.launch_kernel(self.handle, grid, 1, 1, block, 1, 1, 0, arrays.stream(), self.params, 0)


#: A stand-in for the driver: given each launch's kernel name, grid, block and arguments.
DryLaunch = Callable[[str, int, int, tuple[int, ...]], None]


def _dry(launch: DryLaunch, name: str, arrays: Arrays, grid: int, block: int, args: tuple[int, ...]) -> None:
    launch(name, grid, block, args)


def _threads(m: int) -> int:
    """Threads for a one-block call of ``m`` entries: a whole number of warps, at most a block's worth."""
    return min(MAX_THREADS, max(32, (m + 31) // 32 * 32))


class _Kernels:
    """What the slot and block kernels share: the library's arrays, the launches, their count."""

    name = "cuda"

    def __init__(self, arrays: Arrays, *, launch: DryLaunch | None = None) -> None:
        """``launch``, when given, is called instead of the driver with each launch (the kernel's name,
        grid, block and arguments) and nothing is compiled: how ``tests.launch_counting`` counts them."""
        self.arrays = arrays
        self._launches: dict[str, Callable[[Arrays, int, int, tuple[int, ...]], None]]
        if launch is None:
            functions = _module(arrays.device).functions
            self._launches = {name: _Launch(f, PARAMETERS[KERNELS[name]]) for name, f in functions.items()}
        else:
            self._launches = {name: functools.partial(_dry, launch, name) for name in KERNELS}
        #: Kernel launches made so far (the launch budget counts them).
        self.launches = 0

    def _ids(self, ids: Any) -> tuple[Any, str]:
        """``ids`` as a kernel reads them and their suffix: int32 and int64 as they are, others widened."""
        arrays = self.arrays
        suffix = arrays.suffixes.get(ids.dtype)
        if suffix is None:
            ids, suffix = arrays.widen(ids), "i64"
        return arrays.contiguous(ids), suffix

    def _launch(self, name: str, grid: int, block: int, args: tuple[int, ...]) -> None:
        self._launches[name](self.arrays, grid, block, args)
        self.launches += 1


class CudaSlotKernels(_Kernels):
    """:class:`~kvref_arraypool.slot_arrays.SlotKernels` in CUDA C: one launch per ``alloc`` and per ``free``."""

    max_free = MAX_CALL

    def alloc(
        self,
        *,
        ring: Any,
        state: Any,
        version: Any,
        record: Any,
        head: int,
        want: int,
        num_pages: int,
        page_size: int,
        dtype: str,
    ) -> Any:
        """Take ``want`` pages from the ring at ``head``: mark them held, bump their slots' versions,
        lower the ring's device length; the fresh slots in ``dtype``."""
        arrays, at = self.arrays, self.arrays.address
        n = want * page_size
        out = arrays.empty(n, dtype)
        if n == 0:  # a grid of no blocks is not a launch the driver takes
            return out
        threads = min(256, _threads(n))
        self._launch(
            f"slot_alloc_{_DTYPE_SUFFIX[dtype]}",
            (n + threads - 1) // threads,
            threads,
            (at(ring), at(state), at(version), at(record), at(out), head, want, num_pages, page_size),
        )
        return out

    def free(
        self,
        *,
        slots: Any,
        state: Any,
        first: Any,
        ring: Any,
        released: Any,
        record: Any,
        head: int,
        num_pages: int,
        page_size: int,
        sort: bool,
        group: bool,
    ) -> tuple[Any, Any] | None:
        """Check ``slots`` and release (in a group: mark) the first entry of each page they name; a
        refused call writes only the record. In a group, returns each entry's page and kept flag."""
        arrays, at = self.arrays, self.arrays.address
        m = len(slots)
        slots, suffix = self._ids(slots)
        if group:
            page, keep = arrays.empty(m, "int64"), arrays.empty(m, "bool")
        else:  # nothing is written there
            page, keep = first, state
        pointers = map(at, (state, first, ring, released, record, page, keep))
        arguments = (at(slots), m, *pointers, head, num_pages, page_size, int(sort), int(group))
        self._launch(f"slot_free_{suffix}", 1, _threads(m), arguments)
        return (page, keep) if group else None

    def free_then_alloc(
        self,
        *,
        slots: Any,
        state: Any,
        first: Any,
        ring: Any,
        released: Any,
        record: Any,
        version: Any,
        head: int,
        want: int,
        num_pages: int,
        page_size: int,
        sort: bool,
        dtype: str,
    ) -> Any:
        """``free`` of ``slots`` then ``alloc`` of ``want`` pages at ``head``, in one launch (RADIX-616)."""
        arrays, at = self.arrays, self.arrays.address
        m, n = len(slots), want * page_size
        slots, suffix = self._ids(slots)
        out = arrays.empty(n, dtype)
        pointers = map(at, (state, first, ring, released, record, version, out))
        arguments = (at(slots), m, *pointers, head, want, num_pages, page_size, int(sort))
        self._launch(f"slot_free_alloc_{suffix}_{_DTYPE_SUFFIX[dtype]}", 1, _threads(max(m, n)), arguments)
        return out


class CudaBlockKernels(_Kernels):
    """:class:`~kvref_arraypool.block_arrays.BlockKernels` in CUDA C: one launch per call of one request slot."""

    max_call = MAX_CALL

    def allocate(
        self, *, stack: Any, ref: Any, gen: Any, bits: Any, record: Any, total: int, words: int, slot: int, dtype: str
    ) -> Any:
        """Pop ``total`` blocks for request slot ``slot``; the fresh ids in ``dtype``."""
        arrays, at = self.arrays, self.arrays.address
        out = arrays.empty(total, dtype)
        if total == 0:
            return out
        self._launch(
            f"block_allocate_{_DTYPE_SUFFIX[dtype]}",
            1,
            _threads(total),
            (at(stack), at(ref), at(gen), at(bits), at(record), at(out), total, words, slot // 32, 1 << (slot % 32)),
        )
        return out

    def call(
        self,
        *,
        ids: Any,
        ref: Any,
        bits: Any,
        reserved: Any,
        first: Any,
        stack: Any,
        record: Any,
        num_blocks: int,
        words: int,
        slot: int,
        free: bool,
    ) -> None:
        """Check and apply one ``free`` (or ``acquire``) of ``ids`` by request slot ``slot``."""
        at = self.arrays.address
        m = len(ids)
        ids, suffix = self._ids(ids)
        pointers = map(at, (ref, bits, reserved, first, stack, record))
        arguments = (at(ids), m, num_blocks, *pointers, words, slot // 32, 1 << (slot % 32), int(free))
        self._launch(f"block_call_{suffix}", 1, _threads(m), arguments)
