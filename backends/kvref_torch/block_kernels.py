"""The block pool's array surface in one Triton kernel per call (ERR-517..ERR-520, chapter 01).

:class:`TritonBlockKernels` does what :class:`kvref_arraypool.block_arrays.DeviceBlockPool` does
with some fifty array operations per call in **one** kernel launch, for the calls of one request
slot (the common call: one request's blocks, given with one host int as its slot):

* ``allocate``: one program: pop ``total`` blocks from the top of the free stack (its length is
  the record's device counter), give each one reference, bump its generation, set the slot's
  bit, write the fresh output in the caller's dtype, and lower the counter.
* ``free`` and ``acquire``: one program over the whole call (up to :data:`MAX_CALL` entries):
  the per-entry codes (range, reserved, held, named twice: the first occurrence of each block
  by an ``atomic_min`` of positions between two barriers; for ``acquire`` a free block), the
  first offending entry and the record update, then the writes, predicated on the verdict: the
  holding bit, the reference count, and for ``free`` the push of each block left with no
  reference at ``counter + rank`` (a ``cumsum``). A refused call writes nothing but the record.

Calls naming several slots, and larger calls, take the array path. The record layout is
:mod:`kvref_arraypool.deferred`'s (slots 0-5, then the free stack's length at 6).

Without CUDA the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` set before this
module is imported), which is how CI checks them: ``nox -s kernels``.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kvref_torch.launching import Launcher
from kvref_torch.record_kernels import note_first_error

__all__ = ["MAX_CALL", "TritonBlockKernels"]

#: The largest ``free`` or ``acquire`` done in one program; larger ones take the array path.
MAX_CALL = 4096
_ALLOCATE_BLOCK = 1024
_STACK_COUNTER = tl.constexpr(6)  # a global a compiled kernel reads must be a constexpr


@triton.jit(do_not_specialize=["total", "words", "word", "bit"])  # one compile per dtype (launching.py)
def _allocate_kernel(
    stack_ptr, ref_ptr, gen_ptr, bits_ptr, rec_ptr, out_ptr, total, words, word, bit, BLOCK: tl.constexpr
):
    top = tl.load(rec_ptr + _STACK_COUNTER)
    for start in range(0, total, BLOCK):
        k = start + tl.arange(0, BLOCK)
        live = k < total
        block = tl.load(stack_ptr + top - 1 - k, mask=live, other=0)
        tl.store(ref_ptr + block, 1, mask=live)
        tl.store(gen_ptr + block, tl.load(gen_ptr + block, mask=live, other=0) + 1, mask=live)
        tl.store(bits_ptr + block * words + word, bit, mask=live)  # a free block's row is all zero
        tl.store(out_ptr + k, block.to(out_ptr.dtype.element_ty), mask=live)
    tl.store(rec_ptr + _STACK_COUNTER, top - total)


@triton.jit(do_not_specialize=["m", "num_blocks", "words", "word", "bit"])
def _call_kernel(
    ids_ptr,
    m,
    num_blocks,
    ref_ptr,
    bits_ptr,
    reserved_ptr,
    first_ptr,
    stack_ptr,
    rec_ptr,
    words,
    word,
    bit,
    FREE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.arange(0, BLOCK)
    live = i < m
    b = tl.load(ids_ptr + i, mask=live, other=0).to(tl.int64)
    out = (b < 0) | (b >= num_blocks)
    safe = tl.where(out, num_blocks, b)
    reserved = tl.load(reserved_ptr + safe, mask=live, other=0) != 0
    at = safe * words + word
    old = tl.load(bits_ptr + at, mask=live, other=0)
    held = (old & bit) != 0
    ref = tl.load(ref_ptr + safe, mask=live, other=0)
    # The first occurrence of each block named: one slot, so a repeated block is a repeated pair.
    tl.store(first_ptr + safe, BLOCK, mask=live)
    tl.debug_barrier()
    tl.atomic_min(first_ptr + safe, i.to(tl.int64), mask=live)
    tl.debug_barrier()
    first = tl.load(first_ptr + safe, mask=live, other=-1) == i
    if FREE:
        code = tl.where(out, 1, tl.where(reserved, 2, tl.where(held, tl.where(first, 0, 5), 3)))
    else:
        code = tl.where(out, 1, tl.where(reserved, 2, tl.where(ref == 0, 6, tl.where(held | (first == 0), 7, 0))))
    code = tl.where(live, code, 0)
    # The record: the first offending entry of the first refused call (ERR-511, ERR-512).
    pos = note_first_error(rec_ptr, code, b, i, BLOCK)
    accepted = (tl.zeros([BLOCK], dtype=tl.int32) + pos) == BLOCK  # a vector: scalar & vector loses the bool type
    keep = live & accepted
    if FREE:  # an accepted call names each block once: plain stores
        tl.store(bits_ptr + at, old & ~bit, mask=keep)
        tl.store(ref_ptr + safe, ref - 1, mask=keep)
        zero = keep & (ref == 1)
        kept = zero.to(tl.int64)
        rank = tl.cumsum(kept, axis=0) - 1
        count = tl.load(rec_ptr + _STACK_COUNTER)
        tl.store(stack_ptr + count + rank, safe, mask=zero)
        tl.store(rec_ptr + _STACK_COUNTER, count + tl.sum(kept, axis=0))
    else:
        tl.store(bits_ptr + at, old | bit, mask=keep)
        tl.store(ref_ptr + safe, ref + 1, mask=keep)


_launch_allocate = Launcher(_allocate_kernel)
_launch_call = Launcher(_call_kernel)


class TritonBlockKernels:
    """The fused calls :class:`~kvref_arraypool.block_arrays.DeviceBlockPool` makes for one-slot calls."""

    name = "triton"
    max_call = MAX_CALL

    def __init__(self) -> None:
        #: Kernel launches made so far (the launch budget counts them beside torch's own).
        self.launches = 0

    def allocate(
        self, *, stack: Any, ref: Any, gen: Any, bits: Any, record: Any, total: int, words: int, slot: int, dtype: str
    ) -> Any:
        """Pop ``total`` blocks for request slot ``slot``: one launch; returns the fresh ids."""
        out = torch.empty(total, dtype=torch.int32 if dtype == "int32" else torch.int64, device=stack.device)
        _launch_allocate(
            (1,), stack, ref, gen, bits, record, out, total, words, slot // 32, 1 << (slot % 32), BLOCK=_ALLOCATE_BLOCK
        )
        self.launches += 1
        return out

    def call(
        self, *, ids: Any, ref: Any, bits: Any, reserved: Any, first: Any, stack: Any, record: Any, num_blocks: int,
        words: int, slot: int, free: bool,
    ) -> None:  # fmt: skip
        """Check and apply one ``free`` (or ``acquire``) of ``ids`` by request slot ``slot``: one launch."""
        m = len(ids)
        block = max(16, triton.next_power_of_2(m))
        _launch_call(
            (1,), ids, m, num_blocks, ref, bits, reserved, first, stack, record, words, slot // 32, 1 << (slot % 32),
            FREE=free, BLOCK=block, num_warps=4 if block <= 1024 else 8,
        )  # fmt: skip
        self.launches += 1
