"""The token-slot allocator's array surface in one Triton kernel per call (ERR-510..ERR-513, chapter 06).

:class:`TritonSlotKernels` does what :class:`kvref_arraypool.slot_arrays.DeviceSlotAllocator`
does with some forty array operations per ``free`` in **one** kernel launch, and ``alloc`` in one:

* ``free``: one program over the whole call (up to :data:`MAX_FREE` entries): the per-entry codes
  (range, padding page, held), the first offending entry and the record update, the first
  occurrence of each page (an ``atomic_min`` of positions between two barriers), then the
  predicated release: the page state, and the append to the back of the ring or the release
  list at ``counter + rank`` (a ``cumsum``). A refused call writes nothing but the record.
* ``alloc``: a grid over the slots taken: gather the ring from the host-known head, mark the pages
  held, bump the versions, write the fresh output in the caller's dtype; program 0 lowers the
  ring's device length.

The record layout is :mod:`kvref_arraypool.deferred`'s (slots 0-5, then the ring's and the release
list's lengths). Batches beyond :data:`MAX_FREE` take the array path; so does a group's end.

Without CUDA the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` set before this
module is imported), which is how CI checks them: ``nox -s kernels``.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from kvref_arraypool.slot_errors import free_then_alloc_in_two

from kvref_torch.launching import Launcher
from kvref_torch.record_kernels import note_first_error

__all__ = ["MAX_FREE", "TritonSlotKernels"]

#: The largest free done in one program; larger ones take the array path.
MAX_FREE = 4096
_ALLOC_BLOCK = 1024
_RING_COUNTER, _RELEASED_COUNTER = 6, 7


@triton.jit(do_not_specialize=["m", "head", "num_pages", "page_size"])  # one compile per dtype (launching.py)
def _free_kernel(
    slots_ptr,
    m,
    state_ptr,
    first_ptr,
    ring_ptr,
    released_ptr,
    rec_ptr,
    page_out_ptr,
    keep_out_ptr,
    head,
    num_pages,
    page_size,
    SORT: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.arange(0, BLOCK)
    live = i < m
    s = tl.load(slots_ptr + i, mask=live, other=0).to(tl.int64)
    top = (num_pages + 1) * page_size
    out = (s < 0) | (s >= top)
    page = tl.where(out, 0, s // page_size)
    state = tl.load(state_ptr + page, mask=live, other=0)
    code = tl.where(out, 1, tl.where(page == 0, 2, tl.where(state == 1, 0, 3)))
    code = tl.where(live, code, 0)
    # The record: the first offending entry of the first refused call (ERR-511, ERR-512).
    pos = note_first_error(rec_ptr, code, s, i, BLOCK)
    # The first occurrence of each page named: the least position, between barriers.
    tl.store(first_ptr + page, BLOCK, mask=live)
    tl.debug_barrier()
    tl.atomic_min(first_ptr + page, i.to(tl.int64), mask=live)
    tl.debug_barrier()
    first = tl.load(first_ptr + page, mask=live, other=-1)
    accepted = (tl.zeros([BLOCK], dtype=tl.int32) + pos) == BLOCK  # a vector: scalar & vector loses the bool type
    keep = live & (first == i) & accepted
    if GROUP:  # the group's parts, for its end
        tl.store(page_out_ptr + i, page, mask=live)
        tl.store(keep_out_ptr + i, keep, mask=live)
        tl.store(state_ptr + page, 2, mask=keep)  # freed in the open group: released at its end
    else:
        tl.store(state_ptr + page, 0, mask=keep)
        kept = keep.to(tl.int64)
        rank = tl.cumsum(kept, axis=0) - 1
        total = tl.sum(kept, axis=0)
        if SORT:
            count = tl.load(rec_ptr + 7)
            tl.store(released_ptr + count + rank, page, mask=keep)
            tl.store(rec_ptr + 7, count + total)
        else:
            count = tl.load(rec_ptr + 6)
            tl.store(ring_ptr + (head + count + rank) % num_pages, page, mask=keep)
            tl.store(rec_ptr + 6, count + total)


@triton.jit(do_not_specialize=["head", "want", "num_pages", "page_size"])
def _alloc_kernel(
    ring_ptr, state_ptr, version_ptr, rec_ptr, out_ptr, head, want, num_pages, page_size, BLOCK: tl.constexpr
):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < want * page_size
    k = i // page_size
    offset = i % page_size
    page = tl.load(ring_ptr + (head + k) % num_pages, mask=live, other=0)
    tl.store(state_ptr + page, 1, mask=live & (offset == 0))
    slot = page * page_size + offset
    version = tl.load(version_ptr + slot, mask=live, other=0)
    tl.store(version_ptr + slot, version + 1, mask=live)
    tl.store(out_ptr + i, slot.to(out_ptr.dtype.element_ty), mask=live)
    if tl.program_id(0) == 0:
        tl.store(rec_ptr + 6, tl.load(rec_ptr + 6) - want)


_launch_alloc = Launcher(_alloc_kernel)
_launch_free = Launcher(_free_kernel)


class TritonSlotKernels:
    """The fused calls :class:`~kvref_arraypool.slot_arrays.DeviceSlotAllocator` makes when given them."""

    name = "triton"
    max_free = MAX_FREE

    def __init__(self) -> None:
        #: Kernel launches made so far (the launch budget counts them beside torch's own).
        self.launches = 0

    def alloc(
        self, *, ring: Any, state: Any, version: Any, record: Any, head: int, want: int, num_pages: int,
        page_size: int, dtype: str,
    ) -> Any:  # fmt: skip
        """Take ``want`` pages from the ring at ``head``: one launch; returns the fresh slots."""
        n = want * page_size
        out = torch.empty(n, dtype=torch.int32 if dtype == "int32" else torch.int64, device=ring.device)
        grid = (triton.cdiv(n, _ALLOC_BLOCK),)
        _launch_alloc(grid, ring, state, version, record, out, head, want, num_pages, page_size, BLOCK=_ALLOC_BLOCK)
        self.launches += 1
        return out

    def free(
        self, *, slots: Any, state: Any, first: Any, ring: Any, released: Any, record: Any, head: int,
        num_pages: int, page_size: int, sort: bool, group: bool,
    ) -> tuple[Any, Any] | None:  # fmt: skip
        """Check and release (or, in a group, mark) the pages ``slots`` name: one launch.

        In a group, returns each entry's page and whether it was marked (the group's parts); else None.
        """
        m = len(slots)
        if group:
            page = torch.empty(m, dtype=torch.int64, device=slots.device)
            keep = torch.empty(m, dtype=torch.bool, device=slots.device)
        else:  # nothing is written there: no outputs to make
            page, keep = first, state
        block = max(16, triton.next_power_of_2(m))
        _launch_free(
            (1,), slots, m, state, first, ring, released, record, page, keep, head, num_pages, page_size,
            SORT=sort, GROUP=group, BLOCK=block, num_warps=4 if block <= 1024 else 8,
        )  # fmt: skip
        self.launches += 1
        return (page, keep) if group else None

    def free_then_alloc(self, **call: Any) -> Any:
        """``free`` then ``alloc``, as the two launches they are here (RADIX-616; ``kvref_cuda`` fuses them)."""
        return free_then_alloc_in_two(self, **call)
