"""The torch backend object: availability, device choice and pool creation (CONF-901, CONF-906, CONF-907).

``torch`` is imported only when the backend is asked for (``availability``, ``device`` or
``create``), never when the entry point is loaded.
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
    from kvref_arraypool.ops import ArrayOps
    from kvref_arraypool.pool import ArrayBlockPool
    from kvref_arraypool.slot_arrays import DeviceSlotAllocator
    from kvref_arraypool.slots import ArraySlotAllocator

    from kvref.oracle.data import DataPlane
    from kvref.oracle.radix import OracleRadixCache

__all__ = ["TorchBackend", "backend"]


class TorchBackend:
    """Factory of :class:`ArrayBlockPool` on torch tensors (``cpu`` or ``cuda:N``)."""

    name = "torch"
    conformance_profile = "exact-order"

    def version(self) -> str:
        """The installed torch version."""
        try:
            return metadata.version("torch")
        except metadata.PackageNotFoundError:
            return "not installed"

    def availability(self) -> str | None:
        """None when torch imports; else why not."""
        try:
            import torch  # noqa: F401
        except ImportError:
            return "torch is not installed"
        try:
            import numpy  # noqa: F401
        except ImportError:
            return "numpy is not installed (the array core takes caller input through it)"
        return None

    def device(self, requested: str | None = None) -> str:
        """``cuda:0`` by default where torch sees a CUDA device, else ``cpu`` (as CuPy picks); ``cuda:N`` on request."""
        import torch

        if requested is None:
            return "cuda:0" if torch.cuda.is_available() else "cpu"
        if requested == "cpu":
            return "cpu"
        if requested == "cuda" or requested.startswith("cuda:"):
            index = requested.partition(":")[2] or "0"
            if not index.isdigit():
                raise ConfigError("CONF-907", f"backend 'torch': device {requested!r} is not cuda:N")
            if not torch.cuda.is_available():
                raise ConfigError(
                    "CONF-907", f"backend 'torch': device {requested!r} needs CUDA, which torch cannot use here"
                )
            if int(index) >= torch.cuda.device_count():
                raise ConfigError("CONF-907", f"backend 'torch': device {requested!r} does not exist here")
            return f"cuda:{index}"
        raise ConfigError(
            "CONF-907", f"backend 'torch' runs on 'cpu' or 'cuda:N'; device {requested!r} is not possible"
        )

    def capabilities(self) -> frozenset[str]:
        """Everything the spec defines (the array core is complete), chapter 06's token slots included."""
        return self.create(2).capabilities() | SLOT_CAPABILITIES | ARRAY_CAPABILITIES | DATA_CAPABILITIES

    def data_plane(self, device: str | None = None, *, pin_memory: bool = False) -> DataPlane:
        """Chapter 08's data plane on torch tensors on ``device`` (``cuda:0`` where torch sees CUDA)."""
        from kvref.oracle.data import DataPlane
        from kvref_torch.tensors import TorchTensors

        return DataPlane(TorchTensors(self.device(device), pin_memory=pin_memory))

    def create_slots(
        self, size: int, *, page_size: int = 1, sort: bool = True, device: str | None = None
    ) -> ArraySlotAllocator:
        """Chapter 06's token-slot allocator on torch tensors on ``device``."""
        from kvref_arraypool.slots import ArraySlotAllocator

        from kvref_torch.ops import TorchOps

        where = self.device(device)
        return ArraySlotAllocator(
            size, ops=TorchOps(where), page_size=page_size, sort=sort, kernels=fused_kernels("slot", where)
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
        """Chapter 06's allocator with the array surface (ERR-510..ERR-514): tensors in and out, no host sync."""
        from kvref_arraypool.slot_arrays import DeviceSlotAllocator

        from kvref_torch.ops import TorchOps

        where = self.device(device)
        return DeviceSlotAllocator(
            size,
            ops=TorchOps(where),
            page_size=page_size,
            sort=sort,
            dtype=dtype,
            kernels=fused_kernels("slot", where),
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
        """Chapter 01's block pool with the array surface (ERR-517..ERR-520): request slots, tensors in and out."""
        from kvref_arraypool.block_arrays import DeviceBlockPool

        from kvref_torch.ops import TorchOps

        where = self.device(device)
        return DeviceBlockPool(
            num_blocks, ops=TorchOps(where), max_requests=max_requests, reserved_ids=reserved_ids, dtype=dtype,
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
        """A new pool on ``device`` (default: ``cuda:0`` where torch sees CUDA, else ``cpu``).

        On ``cpu`` the core runs on NumPy, handing out tensors of its memory
        (:class:`kvref_torch.host_ops.TorchHostOps`).
        """
        from kvref_arraypool.pool import ArrayBlockPool

        where = self.device(device)
        return ArrayBlockPool(
            num_blocks,
            ops=array_ops(where),
            policy=policy,
            reserved_ids=reserved_ids,
            paused_limit=paused_limit,
            enable_events=enable_events,
            name=f"torch ({where})",
        )


def array_ops(device: str) -> ArrayOps:
    """The array layer for a list-protocol pool on ``device``: torch's own ops on CUDA, NumPy on ``cpu``,
    handing out tensors of its memory (where torch's dispatch per call would cost more than the work)."""
    if device == "cpu":
        from kvref_torch.host_ops import TorchHostOps

        return TorchHostOps()
    from kvref_torch.ops import TorchOps

    return TorchOps(device)


def fused_kernels(surface: Literal["slot", "block"], device: str) -> Any:
    """The fused calls of an array surface (``"slot"`` or ``"block"``): on ``cpu``, the host kernels of
    ``kvref_arraypool`` as NumPy over the tensors' own memory; on CUDA, the CUDA C kernels of
    :mod:`kvref_cuda` launched on the tensors' addresses (None where CuPy cannot launch there: the
    array path; ``torch-triton`` brings its own)."""
    if device != "cpu":
        from kvref_cuda import cuda_kernels

        return cuda_kernels(surface, "torch", device)
    import torch
    from kvref_arraypool.host_block_kernels import HostBlockKernels
    from kvref_arraypool.host_slot_kernels import HostSlotKernels

    kind = HostSlotKernels if surface == "slot" else HostBlockKernels
    return kind(view=lambda t: t.numpy(), wrap=torch.from_numpy)


#: The object the entry point names.
backend = TorchBackend()
