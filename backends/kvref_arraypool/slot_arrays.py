"""Chapter 06's token-slot allocator as an engine calls it on a GPU: device arrays in and out, no host sync.

:class:`DeviceSlotAllocator` is the array surface (ERR-510..ERR-514) of the allocator of
chapter 06 (RADIX-601..RADIX-611), the form SGLang's ``TokenToKVPoolAllocator`` has: ``alloc(n)``
returns the slots as a fresh device array (int32 unless asked otherwise) and ``free(slots)`` takes
one. Every rule is still checked, on the device: a refused ``free`` changes nothing and leaves its
error in a :class:`~kvref_arraypool.deferred.DeviceErrorRecord` that :meth:`check` raises.

Where the counts live:

* the free list is a ring of page ids whose **head** is a host counter (only ``alloc`` moves it)
  and whose **length** is a device counter (``free`` appends on the device, where it alone knows
  how many pages a call frees); the release list (``sort`` on) has a device length too;
* the host keeps a **floor**: pages known to be in the ring, exact after every host read and
  lowered by each ``alloc``. An ``alloc`` within the floor never waits for the device; one beyond
  it reads the counters (and the record) once, then decides exactly (ERR-513).

Each ``free`` appends with scatters into positions computed on the device; positions of refused
entries are sent to a dump slot past the end of each list, so no write depends on a host branch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, SupportsIndex

import numpy as np

from kvref.contract.checks import page_counts
from kvref.contract.errors import BlockIdError, FreeGroupError, InvalidValueError, NotHeldError, ReservedBlockError
from kvref.contract.validate import as_count, as_int
from kvref_arraypool.deferred import DeviceErrorRecord, ErrorKind
from kvref_arraypool.inputs import device_array
from kvref_arraypool.ops import Array, ArrayOps

__all__ = ["SLOT_ERRORS", "DeviceSlotAllocator", "SlotKernels"]

#: The errors a device-checked ``free`` records (ERR-511), by code; RADIX-606 and RADIX-602.
SLOT_ERRORS = {
    1: ErrorKind("RADIX-606", BlockIdError, "is out of range"),
    2: ErrorKind("RADIX-602", ReservedBlockError, "is in page 0, the padding page, never handed out"),
    3: ErrorKind(
        "RADIX-606",
        NotHeldError,
        "is in a page that is not allocated or was freed earlier in the open group (a double free?)",
    ),
}


class SlotKernels(Protocol):
    """Fused ``alloc`` and ``free`` for one array library and device (:class:`kvref_cuda.CudaSlotKernels`).

    Each does in one launch what the array path of :class:`DeviceSlotAllocator` does, over the
    same arrays and record, with the same result; ``free`` handles up to ``max_free`` entries and,
    in an open group, returns each entry's page and whether it was kept (marked); else None.
    """

    name: str
    max_free: int

    def alloc(
        self,
        *,
        ring: Array,
        state: Array,
        version: Array,
        record: Array,
        head: int,
        want: int,
        num_pages: int,
        page_size: int,
        dtype: str,
    ) -> Array:
        """Take ``want`` pages from ``ring`` at ``head``; the fresh slots in ``dtype``."""

    def free(
        self,
        *,
        slots: Array,
        state: Array,
        first: Array,
        ring: Array,
        released: Array,
        record: Array,
        head: int,
        num_pages: int,
        page_size: int,
        sort: bool,
        group: bool,
    ) -> tuple[Array, Array] | None:
        """Check ``slots`` and release (or, in a group, mark) their pages; in a group, each page and kept flag."""

    def free_then_alloc(
        self,
        *,
        slots: Array,
        state: Array,
        first: Array,
        ring: Array,
        released: Array,
        record: Array,
        version: Array,
        head: int,
        want: int,
        num_pages: int,
        page_size: int,
        sort: bool,
        dtype: str,
    ) -> Array:
        """``free`` of ``slots`` (no group open) then ``alloc`` of ``want`` pages at ``head``, as the two
        calls would (RADIX-616): in one launch where the kernels fuse them."""


_RING, _RELEASED = 0, 1  # the record's counters: the ring's length, the release list's length
_DTYPES = ("int32", "int64")
_FREE, _HELD, _PENDING = 0, 1, 2  # a page's state


class DeviceSlotAllocator:
    """Token slots in pages, device arrays in and out, checked on the device (ERR-510..ERR-514, chapter 06).

    ``size`` usable slots in pages of ``page_size`` (RADIX-601); ``sort`` as chapter 06's release
    list; ``dtype`` of the returned slots, ``"int32"`` (the seeds' choice) or ``"int64"``.
    """

    def __init__(
        self,
        size: SupportsIndex,
        *,
        ops: ArrayOps,
        page_size: SupportsIndex = 1,
        sort: bool = True,
        dtype: str = "int32",
        kernels: SlotKernels | None = None,
    ) -> None:
        op = "DeviceSlotAllocator"
        n = as_count(size, op=op, arg="size")
        ps = as_count(page_size, op=op, arg="page_size")
        if ps < 1 or n < ps or n % ps:
            raise InvalidValueError(
                "RADIX-601", f"{op}: size {n} must be a positive multiple of page_size {ps} (at least 1)"
            )
        if not isinstance(sort, bool):
            raise InvalidValueError("RADIX-601", f"{op}: sort must be a bool, got {sort!r}")
        if dtype not in _DTYPES:
            raise InvalidValueError("ERR-510", f"{op}: dtype must be one of {_DTYPES}, got {dtype!r}")
        if dtype == "int32" and n + ps > 2**31:
            raise InvalidValueError("ERR-510", f"{op}: {n + ps} slot ids do not fit int32; ask for dtype='int64'")
        self.ops = ops
        #: Fused kernels for ``alloc`` and ``free`` (one launch each), or None: array operations.
        self.kernels = kernels
        self.size, self.page_size, self.num_pages, self.sort, self.dtype = n, ps, n // ps, sort, dtype
        pages = self.num_pages
        # Each list has a dump slot at index ``pages`` for the writes of refused entries.
        self._ring = ops.zeros(pages + 1)
        self._released = ops.zeros(pages + 1)
        self._state = ops.zeros(pages + 1)  # per page: FREE, HELD, or PENDING (freed in the open group)
        self._first = ops.zeros(pages + 1)
        self._version = ops.zeros((pages + 1) * ps)
        self._offsets = ops.arange(ps)
        self._iota = ops.arange((pages + 1) * ps)
        self.record = DeviceErrorRecord(ops, SLOT_ERRORS, counters=2)
        self._head = self._floor = self._released_floor = 0
        self._unconfirmed = False
        self._group: list[tuple[Array, Array]] | None = None
        self.clear()

    # ------------------------------------------------------------------ sizes

    def available_size(self) -> int:
        """Slots of free and released pages, exactly (RADIX-605); reads the device only after a free (ERR-513)."""
        if self._unconfirmed:
            self._confirm()
        return (self._floor + self._released_floor) * self.page_size

    @property
    def in_group(self) -> bool:
        """Whether a free group is open (RADIX-607)."""
        return self._group is not None

    def check(self, explain: Callable[[], None] | None = None) -> None:
        """Raise the first error a device check recorded since the last report, once (ERR-511, ERR-512).

        One host read (a sync on a GPU), which also confirms the free counts. ``explain``, when
        given, runs first on the error path and may raise the immediate check's own error.
        """
        self._confirm(explain)

    def _confirm(self, explain: Callable[[], None] | None = None) -> None:
        host = self.record.read()
        self._floor = int(host[-2])
        self._released_floor = int(host[-1])
        self._unconfirmed = False
        error = self.record.first_error(host)
        if error is not None:
            self.record.clear()
            self.record.raise_error(error, "free", explain)

    # ------------------------------------------------------------- allocation

    def alloc(self, need_size: SupportsIndex) -> Array | None:
        """``need_size`` slots in whole pages as a fresh device array, or None (RADIX-603, RADIX-604, ERR-510).

        No host sync while the host floor covers the request (ERR-513); otherwise one read of the
        counters, which also raises an error a free recorded (ERR-512) before anything changes.
        """
        want = self._pages(need_size, "alloc")
        ps = self.page_size
        if want == 0:
            return self.ops.cast(self._iota[:0], self.dtype)
        if want > self._floor:
            self._confirm()
            if want > self._floor + self._released_floor:
                return None
            if want > self._floor:
                self._merge()
        if self.kernels is not None:
            return self._alloc_fused(self.kernels, want)
        pages = self._pop(want)
        self.ops.fill_at(self._state, pages, _HELD)
        slots = pages if ps == 1 else (pages[:, None] * ps + self._offsets[None, :]).reshape(-1)
        self.ops.scatter_add(self._version, slots, 1)
        return self.ops.cast(slots, self.dtype)

    def _pages(self, need_size: SupportsIndex, op: str) -> int:
        """``need_size`` slots as a number of pages; refused at once when not whole pages (RADIX-604, ERR-514)."""
        n = as_count(need_size, op=op, arg="need_size")
        ps = self.page_size
        if n % ps:
            raise InvalidValueError(
                "RADIX-604",
                f"{op}: {n} slots is not a whole number of pages of {ps}; a short allocation would lose some",
            )
        return n // ps

    def alloc_many(self, need_sizes: Any) -> tuple[Array, list[int]] | None:
        """A scheduler step's allocations in one call: the slots of one ``alloc(sum)`` and each
        request's start in them (``len(counts) + 1`` host offsets), or None (RADIX-612)."""
        counts = page_counts(need_sizes, self.page_size)
        got = self.alloc(sum(counts))
        if got is None:
            return None
        offsets = [0]
        for n in counts:
            offsets.append(offsets[-1] + n)
        return got, offsets

    def _alloc_fused(self, kernels: SlotKernels, want: int) -> Array:
        head = self._head
        got = kernels.alloc(
            ring=self._ring,
            state=self._state,
            version=self._version,
            record=self.record.array,
            head=head,
            want=want,
            num_pages=self.num_pages,
            page_size=self.page_size,
            dtype=self.dtype,
        )
        self._moved(head, want)
        return got

    def _moved(self, head: int, want: int) -> None:
        """The host's head and floor past ``want`` pages taken at ``head``, once the launch that takes
        them is made (a launch that raises leaves the host's counts as they were)."""
        self._head = (head + want) % self.num_pages
        self._floor -= want

    def _pop(self, want: int) -> Array:
        """The first ``want`` pages of the ring (the floor covers them); the head and counts move past them."""
        head, pages = self._head, self.num_pages
        wraps = head + want > pages
        taken = self._ring[(head + self._iota[:want]) % pages] if wraps else self._ring[head : head + want]
        self._head = (head + want) % pages
        self._floor -= want
        ring = self.record.counter(_RING)
        ring -= want  # in place: the counter is a view into the record's array
        return taken

    def _merge(self) -> None:
        """Append the release list to the free list, sorted ascending when ``sort`` is on (RADIX-610).

        Runs right after a host read, so both lengths are exact on the host.
        """
        ops, pages = self.ops, self.num_pages
        live = self._ring[(self._head + self._iota[: self._floor]) % pages]
        merged = ops.concat([live, self._released[: self._released_floor]])
        if self.sort:
            merged = merged[ops.argsort(merged)]
        m = len(merged)
        self._ring[:m] = merged
        self._head, self._floor, self._released_floor = 0, m, 0
        self._set_counts(m, 0)

    def _set_counts(self, ring: int, released: int) -> None:
        self.record.array[-2:] = self.ops.asarray(np.array([ring, released], dtype=np.int64))

    # ----------------------------------------------------------------- release

    def free(self, slots: Any) -> None:
        """Release every page one of ``slots`` falls in, once; checked on the device, no host sync (RADIX-606, ERR-511).

        ``slots``: a 1-d integer device array of this allocator's library and device (taken as it
        is), or any sequence of ints (checked for type at once, ERR-514, then copied in). A refused
        free changes nothing; :meth:`check` raises its error.
        """
        any_width = self.kernels is not None
        self._free_given(device_array(self.ops, slots, op="free", arg="indices", any_width=any_width))

    def _free_given(self, given: Array) -> None:
        ops, ps = self.ops, self.page_size
        fused = self.kernels is not None
        m = len(given)
        if m == 0:
            return
        if self.kernels is not None and m <= self.kernels.max_free:
            parts = self.kernels.free(
                slots=given,
                state=self._state,
                first=self._first,
                ring=self._ring,
                released=self._released,
                record=self.record.array,
                head=self._head,
                num_pages=self.num_pages,
                page_size=ps,
                sort=self.sort,
                group=self._group is not None,
            )
            if self._group is not None and parts is not None:
                self._group.append(parts)
            self._unconfirmed = True
            return
        given = ops.cast(given, "int64") if fused else given  # the array path works in int64
        out = (given < 0) | (given >= (self.num_pages + 1) * ps)
        page = ops.where(out, 0, given // ps)
        held = self._state[page] == _HELD
        codes = ops.where(out, 1, ops.where(page == 0, 2, ops.where(held, 0, 3)))
        accepted = self.record.note(codes, given)
        at = self._iota[:m] if m <= len(self._iota) else ops.arange(m)  # a call may name a slot many times
        ops.fill_at(self._first, page, m)
        ops.scatter_min(self._first, page, at)
        keep = (self._first[page] == at) & accepted
        if self._group is not None:
            ops.scatter_max(self._state, page, ops.cast(keep, "int64") * _PENDING)
            self._group.append((page, keep))
        else:
            self._release(page, keep, _HELD)
        self._unconfirmed = True

    def free_then_alloc(self, slots: Any, need_size: SupportsIndex) -> Array | None:
        """A scheduler step's release and allocation in one call: ``free(slots)`` then ``alloc(need_size)`` (RADIX-616).

        The same checks, record and result as the two calls; ``need_size`` is checked first (RADIX-604,
        ERR-514), so a refused step changes nothing. Where the kernels fuse them and the host floor
        covers the allocation (no group open, at most ``max_free`` slots freed), one launch.
        """
        want = self._pages(need_size, "free_then_alloc")
        ps = self.page_size
        kernels = self.kernels
        given = device_array(self.ops, slots, op="free_then_alloc", arg="indices", any_width=kernels is not None)
        if (
            kernels is None
            or self._group is not None
            or not 0 < want <= self._floor
            or not 0 < len(given) <= kernels.max_free
        ):
            self._free_given(given)
            return self.alloc(want * ps)
        head = self._head
        got = kernels.free_then_alloc(
            slots=given,
            state=self._state,
            first=self._first,
            ring=self._ring,
            released=self._released,
            record=self.record.array,
            version=self._version,
            head=head,
            want=want,
            num_pages=self.num_pages,
            page_size=ps,
            sort=self.sort,
            dtype=self.dtype,
        )
        self._moved(head, want)
        self._unconfirmed = True
        return got

    def _release(self, pages: Array, keep: Array, state: int) -> None:
        """Release the kept entries of ``pages`` (distinct, all in ``state``), in order, to the back of a list."""
        ops, n = self.ops, self.num_pages
        kept = ops.cast(keep, "int64")
        ops.scatter_add(self._state, pages, kept * -state)
        rank = ops.cumsum(kept) - 1
        if self.sort:
            target, counter = self._released, self.record.counter(_RELEASED)
            dest = ops.where(keep, counter + rank, n)
        else:
            target, counter = self._ring, self.record.counter(_RING)
            dest = ops.where(keep, (self._head + counter + rank) % n, n)
        target[dest] = pages
        counter += rank[-1:] + 1

    def free_group_begin(self) -> None:
        """Open a free group (RADIX-607); a host check, raised at once (ERR-514)."""
        if self._group is not None:
            raise FreeGroupError("RADIX-607", "free_group_begin: a free group is already open; groups do not nest")
        self._group = []

    def free_group_end(self) -> None:
        """Release the open group's pages as one free of their concatenation (RADIX-607)."""
        if self._group is None:
            raise FreeGroupError("RADIX-607", "free_group_end: no free group is open")
        parts, self._group = self._group, None
        if parts:
            pages = self.ops.concat([p for p, _ in parts])
            keep = self.ops.concat([k for _, k in parts])
            self._release(pages, keep, _PENDING)
            self._unconfirmed = True

    def clear(self) -> None:
        """Every page free in ascending order; versions kept (RADIX-609); an unreported error stays (ERR-512)."""
        pages = self.num_pages
        self._ring[:pages] = self.ops.arange(1, pages + 1)
        self._head, self._floor, self._released_floor = 0, pages, 0
        self._set_counts(pages, 0)
        self._state[:] = _FREE
        self._group = None
        self._unconfirmed = False

    # ---------------------------------------------------------------- queries

    def version(self, slot: SupportsIndex) -> int:
        """How many times ``slot`` has been handed out (RADIX-608); a host read."""
        return int(self._version[self._slot(slot, "version")])

    def is_current(self, slot: SupportsIndex, version: SupportsIndex) -> bool:
        """Whether ``(slot, version)`` names the slot's current allocation (RADIX-608); a host read."""
        s = self._slot(slot, "is_current")
        v = as_count(version, op="is_current", arg="version")
        return int(self._state[s // self.page_size]) != _FREE and int(self._version[s]) == v

    def is_allocated(self, slot: SupportsIndex) -> bool:
        """Whether ``slot``'s page is allocated (a page freed in an open group still is); a host read."""
        return int(self._state[self._slot(slot, "is_allocated") // self.page_size]) != _FREE

    def pending_pages(self) -> set[int]:
        """Pages freed in the open free group; a host read (for explaining a refused free)."""
        return {int(p) for p in np.flatnonzero(self.ops.to_host(self._state) == _PENDING)}

    def pages_held(self, slots: list[int]) -> list[bool]:
        """Whether each slot's page is allocated (slots out of range: False); one host read."""
        top = (self.num_pages + 1) * self.page_size
        pages = np.array([s // self.page_size if 0 <= s < top else 0 for s in slots], dtype=np.int64)
        held = self.ops.to_host(self._state[self.ops.asarray(pages)]) != _FREE
        return [bool(h) and p > 0 for h, p in zip(held.tolist(), pages.tolist(), strict=True)]

    def allocated_pages(self) -> np.ndarray:
        """A host copy of the per-page allocated flags (index 0 is the padding page)."""
        held: np.ndarray = self.ops.to_host(self._state) != _FREE
        return held

    def _slot(self, value: object, op: str) -> int:
        """``value`` as a slot id of this allocator, the padding page's included (the oracle's words)."""
        s = as_int(value, op=op, arg="slot")
        top = (self.num_pages + 1) * self.page_size
        if not 0 <= s < top:
            raise BlockIdError("RADIX-606", f"{op}: slot {s} outside [0, {top})")
        return s

    def snapshot(self) -> dict[str, Any]:
        """The free order, the allocated pages and the versions (host reads), for before/after comparison."""
        ops = self.ops
        host = self.record.read()
        ring, released = int(host[-2]), int(host[-1])
        return {
            "free": ops.tolist(self._ring[(self._head + self._iota[:ring]) % self.num_pages]),
            "released": ops.tolist(self._released[:released]),
            "state": ops.tolist(self._state),
            "version": ops.tolist(self._version),
            "group": None if self._group is None else [ops.tolist(p[k]) for p, k in self._group],
        }

    def __repr__(self) -> str:
        return (
            f"DeviceSlotAllocator(size={self.size}, page_size={self.page_size}, sort={self.sort}, "
            f"dtype={self.dtype!r}, device={self.ops.device!r})"
        )
