"""The token-slot allocator's fused calls for arrays in host memory (``torch`` on ``cpu``, NumPy).

:class:`HostSlotKernels` does what the Triton kernels of ``kvref_torch.slot_kernels`` do on a GPU,
with NumPy over the allocator's own arrays (:mod:`kvref_arraypool.host_views`): same checks, same
record writes, same orders; the differential machine of ``tests/test_host_kernels.py``
holds them to :class:`~kvref_arraypool.slot_arrays.DeviceSlotAllocator`'s array path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvref_arraypool.host_views import SCALAR_LIMIT, HostViews, first_refusal
from kvref_arraypool.ops import Array
from kvref_arraypool.slot_errors import free_then_alloc_in_two

__all__ = ["SCALAR_LIMIT", "HostSlotKernels"]

# The allocator's two counters after the record's slots (kvref_arraypool.deferred).
_RING, _RELEASED = 6, 7
_FREE, _HELD, _PENDING = 0, 1, 2  # a page's state, as slot_arrays keeps it


class HostSlotKernels(HostViews):
    """:class:`~kvref_arraypool.slot_arrays.SlotKernels` for arrays in host memory (see :class:`HostViews`)."""

    name = "host"
    #: Any batch: NumPy has no block size.
    max_free = 1 << 62

    def alloc(
        self, *, ring: Array, state: Array, version: Array, record: Array, head: int, want: int, num_pages: int,
        page_size: int, dtype: str,
    ) -> Array:  # fmt: skip
        """Take ``want`` pages from ``ring`` at ``head``: mark them held, bump their slots' versions,
        lower the ring's length; the fresh slots in ``dtype``."""
        r, st, ver, rec = self._host(ring), self._host(state), self._host(version), self._host(record)
        self.launches += 1
        rec[_RING] -= want
        out_type = np.int32 if dtype == "int32" else np.int64
        if want * page_size <= self._scalar:  # a few element reads and writes beat a dozen array calls
            taken = [int(r[(head + k) % num_pages]) for k in range(want)]
            slots_list = [p * page_size + o for p in taken for o in range(page_size)]
            for p in taken:
                st[p] = _HELD
            for slot in slots_list:
                ver[slot] += 1
            return self._wrap(np.array(slots_list, dtype=out_type))
        end = head + want
        pages = r[head:end] if end <= num_pages else np.concatenate((r[head:num_pages], r[: end - num_pages]))
        st[pages] = _HELD
        slots = pages if page_size == 1 else (pages[:, None] * page_size + np.arange(page_size)).reshape(-1)
        ver[slots] += 1  # distinct slots: a plain fancy increment is exact
        return self._wrap(slots.astype(out_type))  # astype copies: the output is fresh

    def free(
        self, *, slots: Array, state: Array, first: Array, ring: Array, released: Array, record: Array, head: int,
        num_pages: int, page_size: int, sort: bool, group: bool,
    ) -> tuple[Array, Array] | None:  # fmt: skip
        """Check ``slots`` and release (in a group: mark) the first entry of each page they name; a
        refused call writes only the record. In a group, returns each entry's page and kept flag."""
        self.launches += 1
        given = self._ints(slots)
        st, rec = self._host(state), self._host(record)
        if len(given) <= self._scalar:
            return self._free_few(given.tolist(), st, rec, ring, released, head, num_pages, page_size, sort, group)
        out = (given < 0) | (given >= (num_pages + 1) * page_size)
        page = np.where(out, 0, given if page_size == 1 else given // page_size)
        code = np.where(out, 1, np.where(page == 0, 2, np.where(st[page] == _HELD, 0, 3)))
        if not self._note(rec, first_refusal(code, given)):  # refused: the record, nothing else (ERR-501)
            return (self._wrap(page), self._wrap(np.zeros(len(page), dtype=np.bool_))) if group else None
        if len(page) == 1:
            firsts: Any = np.zeros(1, dtype=np.int64)
        else:  # the first entry of each page, in the order of the call
            firsts = np.sort(np.unique(page, return_index=True)[1])
        kept = page[firsts]
        if group:
            st[kept] = _PENDING
            keep = np.zeros(len(page), dtype=np.bool_)
            keep[firsts] = True
            return self._wrap(page), self._wrap(keep)
        st[kept] = _FREE
        n = len(kept)
        if sort:  # to the back of the release list
            count = int(rec[_RELEASED])
            self._host(released)[count : count + n] = kept
            rec[_RELEASED] = count + n
        else:  # to the back of the ring
            count = int(rec[_RING])
            self._host(ring)[(head + count + np.arange(n)) % num_pages] = kept
            rec[_RING] = count + n
        return None

    def free_then_alloc(self, **call: Any) -> Array:
        """``free`` then ``alloc``, as the two calls (RADIX-616): on the host there is no launch to save."""
        return free_then_alloc_in_two(self, **call)

    def _free_few(
        self, given: list[int], st: np.ndarray, rec: np.ndarray, ring: Array, released: Array, head: int,
        num_pages: int, page_size: int, sort: bool, group: bool,
    ) -> tuple[Array, Array] | None:  # fmt: skip
        """:meth:`free` element by element, for a few slots: the same checks, writes and outputs."""
        top = (num_pages + 1) * page_size
        pages = [0 if not 0 <= s < top else s // page_size for s in given]
        codes = (
            1 if not 0 <= s < top else 2 if p == 0 else 0 if st[p] == _HELD else 3
            for s, p in zip(given, pages, strict=True)
        )
        refusal = next(((at, code, given[at]) for at, code in enumerate(codes) if code), None)
        if not self._note(rec, refusal):  # refused: the record, and nothing else (ERR-501)
            if not group:
                return None
            return self._wrap(np.array(pages, dtype=np.int64)), self._wrap(np.zeros(len(pages), dtype=np.bool_))
        seen: set[int] = set()
        keep = [not (p in seen or seen.add(p)) for p in pages]  # type: ignore[func-returns-value]
        kept = [p for p, k in zip(pages, keep, strict=True) if k]
        if group:
            for p in kept:
                st[p] = _PENDING
            return self._wrap(np.array(pages, dtype=np.int64)), self._wrap(np.array(keep, dtype=np.bool_))
        for p in kept:
            st[p] = _FREE
        if sort:  # to the back of the release list
            count = int(rec[_RELEASED])
            out = self._host(released)
            for k, p in enumerate(kept):
                out[count + k] = p
            rec[_RELEASED] = count + len(kept)
        else:  # to the back of the ring
            count = int(rec[_RING])
            out = self._host(ring)
            for k, p in enumerate(kept):
                out[(head + count + k) % num_pages] = p
            rec[_RING] = count + len(kept)
        return None
