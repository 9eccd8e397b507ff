"""What the torch and CuPy backend objects share: every factory of the array core, written once.

A backend over an array library names its library (``kernel_library``, ``version``,
``availability``), resolves a device (``device``), builds the library's :class:`ArrayOps` and
tensors for a device (``ops``, ``tensors``) and names its pools; :class:`ArrayBackend` builds every
object of the spec on top of those: the block pool (chapters 00-05), chapter 06's allocators and
radix cache, chapter 01's array surface and its block tables (chapter 07's batched step) and
chapter 08's data plane (CONF-901, CONF-906, CONF-907).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from kvref.contract.errors import ConfigError
from kvref.contract.protocol import ARRAY_CAPABILITIES, DATA_CAPABILITIES, SLOT_CAPABILITIES

if TYPE_CHECKING:
    from kvref.oracle.data import DataPlane
    from kvref.oracle.data.tensors import Tensors
    from kvref.oracle.radix import OracleRadixCache
    from kvref_arraypool.block_arrays import DeviceBlockPool
    from kvref_arraypool.block_tables import DeviceBlockTables
    from kvref_arraypool.ops import ArrayOps
    from kvref_arraypool.pool import ArrayBlockPool
    from kvref_arraypool.slot_arrays import DeviceSlotAllocator
    from kvref_arraypool.slots import ArraySlotAllocator

__all__ = ["ArrayBackend"]


class ArrayBackend(ABC):
    """A backend of the array core over one array library; a subclass says which library and where."""

    name: str
    conformance_profile = "exact-order"
    #: The library whose arrays the CUDA C kernels are launched on (:func:`kvref_cuda.cuda_kernels`).
    kernel_library: Literal["cupy", "torch"]
    #: Where :meth:`capabilities` builds the pool it asks (None: the default device).
    probe_device: str | None = None

    @abstractmethod
    def version(self) -> str:
        """The installed library's version."""

    @abstractmethod
    def availability(self) -> str | None:
        """None when the library imports; else why not (CONF-906)."""

    #: The name the backend gives the CPU, and every name of it a caller may ask for.
    host_device: str
    host_names: tuple[str, ...]
    #: Why CUDA cannot be used, said when ``cuda:N`` is asked for where the library sees no device.
    no_cuda: str

    @abstractmethod
    def cuda_devices(self) -> int:
        """How many CUDA devices the library can use here (0 where it cannot use CUDA)."""

    def device(self, requested: str | None = None) -> str:
        """The device a call runs on: ``cuda:0`` where the library sees a CUDA device, else the host, by
        default; ``cuda`` means ``cuda:0``; refuses what cannot be had (CONF-907)."""
        if requested is None:
            return "cuda:0" if self.cuda_devices() else self.host_device
        if requested in self.host_names:
            return self.host_device
        where = f"backend {self.name!r}: device {requested!r}"
        if requested == "cuda" or requested.startswith("cuda:"):
            index = requested.partition(":")[2] or "0"
            if not index.isdigit():
                raise ConfigError("CONF-907", f"{where} is not cuda:N")
            count = self.cuda_devices()
            if not count:
                raise ConfigError("CONF-907", f"{where} needs CUDA, {self.no_cuda}")
            if int(index) >= count:
                raise ConfigError("CONF-907", f"{where} does not exist here")
            return f"cuda:{index}"
        raise ConfigError(
            "CONF-907",
            f"backend {self.name!r} runs on {self.host_device!r} or 'cuda:N'; device {requested!r} is not possible",
        )

    @abstractmethod
    def ops(self, device: str) -> ArrayOps:
        """The array layer on a resolved ``device``."""

    @abstractmethod
    def tensors(self, device: str, **options: Any) -> Tensors:
        """Chapter 08's tensor library on a resolved ``device``."""

    def pool_name(self, device: str) -> str:
        """What a pool on ``device`` calls itself in messages and tables."""
        return f"{self.name} ({device})"

    def on_host(self, device: str) -> bool:
        """Whether ``device`` is the CPU: no CUDA C kernels there, the array path runs every call."""
        return not device.startswith("cuda")

    def fused_kernels(self, surface: Literal["slot", "block"], device: str) -> Any:
        """The fused calls of an array surface (``"slot"`` or ``"block"``): on CUDA the CUDA C kernels of
        :mod:`kvref_cuda`; None on the CPU, or where they cannot load there: the array path."""
        if self.on_host(device):
            return None
        from kvref_cuda import cuda_kernels

        return cuda_kernels(surface, self.kernel_library, device)

    def capabilities(self) -> frozenset[str]:
        """Everything the spec defines (the array core is complete), chapter 06's token slots included."""
        pool = self.create(2, device=self.probe_device)
        return pool.capabilities() | SLOT_CAPABILITIES | ARRAY_CAPABILITIES | DATA_CAPABILITIES

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
        """A new block pool and prefix cache (chapters 00-05) on ``device`` (the default: :meth:`device`)."""
        from kvref_arraypool.pool import ArrayBlockPool

        where = self.device(device)
        return ArrayBlockPool(
            num_blocks,
            ops=self.ops(where),
            policy=policy,
            reserved_ids=reserved_ids,
            paused_limit=paused_limit,
            enable_events=enable_events,
            name=self.pool_name(where),
        )

    def data_plane(self, device: str | None = None, **options: Any) -> DataPlane:
        """Chapter 08's data plane on this library's tensors on ``device`` (``options``: the library's)."""
        from kvref.oracle.data import DataPlane

        return DataPlane(self.tensors(self.device(device), **options))

    def create_slots(
        self, size: int, *, page_size: int = 1, sort: bool = True, device: str | None = None
    ) -> ArraySlotAllocator:
        """Chapter 06's token-slot allocator, the list form over the array surface."""
        from kvref_arraypool.slots import ArraySlotAllocator

        where = self.device(device)
        return ArraySlotAllocator(
            size, ops=self.ops(where), page_size=page_size, sort=sort, kernels=self.fused_kernels("slot", where)
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
        """Chapter 06's allocator with the array surface (ERR-510..ERR-514): device arrays in and out, no host sync."""
        from kvref_arraypool.slot_arrays import DeviceSlotAllocator

        where = self.device(device)
        return DeviceSlotAllocator(
            size,
            ops=self.ops(where),
            page_size=page_size,
            sort=sort,
            dtype=dtype,
            kernels=self.fused_kernels("slot", where),
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
        """Chapter 01's block pool with the array surface (ERR-517..ERR-520): request slots, arrays in and out."""
        from kvref_arraypool.block_arrays import DeviceBlockPool

        where = self.device(device)
        return DeviceBlockPool(
            num_blocks,
            ops=self.ops(where),
            max_requests=max_requests,
            reserved_ids=reserved_ids,
            dtype=dtype,
            kernels=self.fused_kernels("block", where),
        )

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
