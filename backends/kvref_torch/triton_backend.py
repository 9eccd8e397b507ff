"""The ``torch-triton`` backend: the torch backend whose array surfaces run fused Triton kernels.

Everything is the ``torch`` backend's but chapter 06's allocator, both surfaces of which
(``create_slots``, ``create_slot_arrays``) make one launch per ``alloc`` and per ``free``
(:mod:`kvref_torch.slot_kernels`), and the block pool's array surface (``create_block_arrays``),
which makes one per call of one request slot (:mod:`kvref_torch.block_kernels`). On a CUDA
device the kernels are compiled; without one they run under Triton's interpreter when
``TRITON_INTERPRET=1`` was set before the first import (slowly: it is how CI checks their
semantics, ``nox -s kernels``). Otherwise the backend says why it is not usable. It is a backend
of its own, not the ``torch`` default, until a GPU session has measured it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from kvref_torch.backend import TorchBackend

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kvref_arraypool.block_arrays import DeviceBlockPool
    from kvref_arraypool.slot_arrays import DeviceSlotAllocator
    from kvref_arraypool.slots import ArraySlotAllocator

__all__ = ["TritonTorchBackend", "backend"]


class TritonTorchBackend(TorchBackend):
    """:class:`TorchBackend` with :class:`kvref_torch.slot_kernels.TritonSlotKernels` under its slot allocator."""

    name = "torch-triton"

    def availability(self) -> str | None:
        """None when torch and Triton import and the kernels can run: on CUDA, or interpreted."""
        reason = super().availability()
        if reason is not None:
            return reason
        try:
            import triton  # noqa: F401
        except ImportError:
            return "triton is not installed (pip install 'kvref[triton]')"
        import torch

        if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
            return "no CUDA device, and TRITON_INTERPRET=1 is not set to run the kernels on the CPU"
        return None

    def create_slot_arrays(
        self, size: int, *, page_size: int = 1, sort: bool = True, dtype: str = "int32", device: str | None = None
    ) -> DeviceSlotAllocator:
        """Chapter 06's allocator with the array surface, one Triton launch per ``alloc`` and per ``free``."""
        from kvref_arraypool.slot_arrays import DeviceSlotAllocator

        from kvref_torch.ops import TorchOps
        from kvref_torch.slot_kernels import TritonSlotKernels

        ops = TorchOps(self.device(device))
        return DeviceSlotAllocator(
            size, ops=ops, page_size=page_size, sort=sort, dtype=dtype, kernels=TritonSlotKernels()
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
        """Chapter 01's block pool with the array surface, one Triton launch per call of one request slot."""
        from kvref_arraypool.block_arrays import DeviceBlockPool

        from kvref_torch.block_kernels import TritonBlockKernels
        from kvref_torch.ops import TorchOps

        ops = TorchOps(self.device(device))
        return DeviceBlockPool(
            num_blocks, ops=ops, max_requests=max_requests, reserved_ids=reserved_ids, dtype=dtype,
            kernels=TritonBlockKernels(),
        )  # fmt: skip

    def create_slots(
        self, size: int, *, page_size: int = 1, sort: bool = True, device: str | None = None
    ) -> ArraySlotAllocator:
        """Chapter 06's allocator with the list protocol, over the fused array surface."""
        from kvref_arraypool.slots import ArraySlotAllocator

        arrays = self.create_slot_arrays(size, page_size=page_size, sort=sort, dtype="int64", device=device)
        return ArraySlotAllocator.over(arrays)


#: The object the entry point names.
backend = TritonTorchBackend()
