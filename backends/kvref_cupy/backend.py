"""The CuPy backend object: availability, device choice and pool creation (CONF-901, CONF-906, CONF-907).

On a host where ``cupy.cuda.is_available()`` is False (no driver, no device) the pools run on
NumPy arrays under the very same core, and the device is reported as ``host``.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any, Literal

from kvref.contract.errors import ConfigError
from kvref.contract.protocol import ARRAY_CAPABILITIES, DATA_CAPABILITIES, SLOT_CAPABILITIES

if TYPE_CHECKING:
    from kvref_arraypool.block_arrays import DeviceBlockPool
    from kvref_arraypool.block_tables import DeviceBlockTables
    from kvref_arraypool.ops import NumpyLikeOps
    from kvref_arraypool.pool import ArrayBlockPool
    from kvref_arraypool.slot_arrays import DeviceSlotAllocator
    from kvref_arraypool.slots import ArraySlotAllocator

    from kvref.oracle.data import DataPlane
    from kvref.oracle.radix import OracleRadixCache

__all__ = ["CupyBackend", "backend"]


def _cuda_available() -> bool:
    try:
        import cupy
    except ImportError:
        return False
    try:
        return bool(cupy.cuda.is_available())
    except Exception:  # pragma: no cover - a broken driver counts as no device
        return False


class CupyBackend:
    """Factory of :class:`ArrayBlockPool` on CuPy (``cuda:N``) or, without CUDA, on NumPy (``host``)."""

    name = "cupy"
    conformance_profile = "exact-order"

    def version(self) -> str:
        """The installed CuPy's version (any build: cupy-cuda12x, cupy-cuda13x, ...), or ``numpy <v>``."""
        for dist in metadata.packages_distributions().get("cupy", []):
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        import numpy

        return f"numpy {numpy.__version__}"

    def availability(self) -> str | None:
        """None when CuPy (or, for the host path, NumPy) imports; else why not."""
        try:
            import numpy  # noqa: F401
        except ImportError:
            return "numpy is not installed"
        try:
            import cupy  # noqa: F401
        except ImportError:
            return "cupy is not installed"
        return None

    def device(self, requested: str | None = None) -> str:
        """``cuda:N`` when CUDA works (``cuda`` = ``cuda:0``), else ``host``; refuses what cannot be had."""
        cuda = _cuda_available()
        if requested is None:
            return "cuda:0" if cuda else "host"
        if requested in ("host", "cpu"):
            return "host"
        if requested == "cuda" or requested.startswith("cuda:"):
            if not cuda:
                raise ConfigError(
                    "CONF-907",
                    f"backend 'cupy': device {requested!r} needs CUDA, and cupy.cuda.is_available() is False",
                )
            index = requested.partition(":")[2] or "0"
            if not index.isdigit():
                raise ConfigError("CONF-907", f"backend 'cupy': device {requested!r} is not cuda:N")
            import cupy

            if int(index) >= cupy.cuda.runtime.getDeviceCount():
                raise ConfigError("CONF-907", f"backend 'cupy': device {requested!r} does not exist here")
            return f"cuda:{index}"
        raise ConfigError(
            "CONF-907", f"backend 'cupy' runs on 'host' or 'cuda:N'; device {requested!r} is not possible"
        )

    def capabilities(self) -> frozenset[str]:
        """Everything the spec defines (the array core is complete), chapter 06's token slots included."""
        return self.create(2, device="host").capabilities() | SLOT_CAPABILITIES | ARRAY_CAPABILITIES | DATA_CAPABILITIES

    def data_plane(self, device: str | None = None) -> DataPlane:
        """Chapter 08's data plane on CuPy arrays on ``cuda:N``, or NumPy on the host without CUDA."""
        from kvref_arraypool.tensors import LibraryTensors

        from kvref.oracle.data import DataPlane

        where = self.device(device)
        if where == "host":
            import numpy

            return DataPlane(LibraryTensors(numpy, name="cupy (host: numpy)", device="host"))
        import cupy  # pragma: no cover - needs a CUDA device

        cupy.cuda.Device(int(where.partition(":")[2])).use()  # pragma: no cover
        return DataPlane(LibraryTensors(cupy, name="cupy", device=where))  # pragma: no cover

    def create_slots(
        self, size: int, *, page_size: int = 1, sort: bool = True, device: str | None = None
    ) -> ArraySlotAllocator:
        """Chapter 06's token-slot allocator on CuPy (or, without CUDA, NumPy) arrays."""
        from kvref_arraypool.slots import ArraySlotAllocator

        where = self.device(device)
        return ArraySlotAllocator(
            size, ops=self._ops(where), page_size=page_size, sort=sort, kernels=fused_kernels("slot", where)
        )

    def create_radix(
        self,
        size: int,
        *,
        page_size: int = 1,
        policy: str = "lru",
        sort: bool = True,
        max_tokens: int | None = None,
        enable_events: bool = False,
        device: str | None = None,
    ) -> tuple[ArraySlotAllocator, OracleRadixCache]:
        """Chapter 06's allocator on device arrays and the oracle's radix tree over it, on the host (as SGLang's)."""
        from kvref.oracle.radix import OracleRadixCache

        slots = self.create_slots(size, page_size=page_size, sort=sort, device=device)
        return slots, OracleRadixCache(slots, policy=policy, max_tokens=max_tokens, enable_events=enable_events)

    def create_slot_arrays(
        self, size: int, *, page_size: int = 1, sort: bool = True, dtype: str = "int32", device: str | None = None
    ) -> DeviceSlotAllocator:
        """Chapter 06's allocator with the array surface (ERR-510..ERR-514): CuPy (or NumPy) arrays in and out."""
        from kvref_arraypool.slot_arrays import DeviceSlotAllocator

        where = self.device(device)
        kernels = fused_kernels("slot", where)
        return DeviceSlotAllocator(
            size, ops=self._ops(where), page_size=page_size, sort=sort, dtype=dtype, kernels=kernels
        )

    def create_block_arrays(
        self,
        num_blocks: int,
        *,
        max_requests: int = 256,
        reserved_ids: Sequence[int] = (0,),
        dtype: str = "int32",
        device: str | None = None,
    ) -> DeviceBlockPool:
        """Chapter 01's block pool with the array surface (ERR-517..ERR-520): request slots, CuPy (or NumPy) arrays."""
        from kvref_arraypool.block_arrays import DeviceBlockPool

        where = self.device(device)
        return DeviceBlockPool(
            num_blocks, ops=self._ops(where), max_requests=max_requests, reserved_ids=reserved_ids, dtype=dtype,
            kernels=fused_kernels("block", where),
        )  # fmt: skip

    def create_block_tables(
        self,
        num_blocks: int,
        *,
        max_requests: int = 256,
        block_size: int = 16,
        max_blocks: int = 64,
        dtype: str = "int32",
        device: str | None = None,
    ) -> DeviceBlockTables:
        """A batch's block tables over a new block array surface: one call per scheduler step (REQ-750..REQ-756)."""
        from kvref_arraypool.block_tables import DeviceBlockTables

        pool = self.create_block_arrays(num_blocks, max_requests=max_requests, dtype=dtype, device=device)
        return DeviceBlockTables(pool, block_size=block_size, max_blocks=max_blocks)

    def _ops(self, where: str) -> NumpyLikeOps:
        """NumPy on the host, CuPy on ``cuda:N`` (made current)."""
        from kvref_arraypool.ops import NumpyLikeOps

        if where == "host":
            import numpy

            return NumpyLikeOps(numpy, device="host", is_device=False)
        import cupy  # pragma: no cover - needs a CUDA device

        cupy.cuda.Device(int(where.partition(":")[2])).use()  # pragma: no cover
        return NumpyLikeOps(cupy, device=where, is_device=True)  # pragma: no cover

    def create(
        self,
        num_blocks: int,
        *,
        policy: str = "lru",
        device: str | None = None,
        reserved_ids: Sequence[int] = (0,),
        paused_limit: int = 0,
        enable_events: bool = False,
    ) -> ArrayBlockPool:
        """A new pool on ``device`` (default: the first CUDA device, else the host)."""
        from kvref_arraypool.pool import ArrayBlockPool

        where = self.device(device)
        ops = self._ops(where)
        name = "cupy (host: numpy)" if where == "host" else "cupy"
        return ArrayBlockPool(
            num_blocks,
            ops=ops,
            policy=policy,
            reserved_ids=reserved_ids,
            paused_limit=paused_limit,
            enable_events=enable_events,
            name=name,
        )


def fused_kernels(surface: Literal["slot", "block"], device: str) -> Any:
    """The fused calls of an array surface (``"slot"`` or ``"block"``): on the host, the host kernels
    of ``kvref_arraypool`` over the NumPy arrays themselves; on CUDA, the CUDA C kernels of
    :mod:`kvref_cuda` (None where they cannot load there: the array path)."""
    if device != "host":
        from kvref_cuda import cuda_kernels

        return cuda_kernels(surface, "cupy", device)
    from kvref_arraypool.host_block_kernels import HostBlockKernels
    from kvref_arraypool.host_slot_kernels import HostSlotKernels

    kind = HostSlotKernels if surface == "slot" else HostBlockKernels
    return kind(view=lambda a: a, wrap=lambda a: a)


#: The object the entry point names.
backend = CupyBackend()
