"""Chapter 06's token-slot allocator on device arrays: pages, free list, release list, versions.

:class:`ArraySlotAllocator` keeps the oracle's semantics (:class:`kvref.oracle.radix.OracleSlotAllocator`,
RADIX-601..RADIX-611) over an :class:`~kvref_arraypool.ops.ArrayOps`:

* the free list is a ring of page ids (``ring``) whose head and length are host counters, so
  ``alloc`` is one gather and a few scatters with no host sync, and ``available_size`` never
  waits for the device;
* the release list (``sort`` on) is a second array with a host length; merging is one concat
  and one sort, run only when an allocation asks for more pages than the free list holds;
* ``allocated`` (a flag per page), ``pending`` (pages freed in the open group) and ``version``
  (per slot, bumped by every allocation, RADIX-608) are device arrays.

``free`` checks its slots with array operations (one host read of the verdict); only when
something is wrong does :func:`kvref.contract.checks.pages_to_free` walk them on the host to name
the first offending slot, with the oracle's error.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, SupportsIndex

import numpy as np

from kvref.contract.checks import pages_to_free
from kvref.contract.errors import BlockIdError, FreeGroupError, InvalidValueError, InvariantViolation
from kvref.contract.validate import as_count
from kvref_arraypool.inputs import index_array
from kvref_arraypool.ops import Array, ArrayOps

__all__ = ["ArraySlotAllocator"]


class ArraySlotAllocator:
    """Token slots in pages over device arrays; the oracle's allocator, slot for slot (chapter 06)."""

    def __init__(self, size: SupportsIndex, *, ops: ArrayOps, page_size: SupportsIndex = 1, sort: bool = True) -> None:
        op = "ArraySlotAllocator"
        n = as_count(size, op=op, arg="size")
        ps = as_count(page_size, op=op, arg="page_size")
        if ps < 1 or n < ps or n % ps:
            raise InvalidValueError(
                "RADIX-601", f"{op}: size {n} must be a positive multiple of page_size {ps} (at least 1)"
            )
        if not isinstance(sort, bool):
            raise InvalidValueError("RADIX-601", f"{op}: sort must be a bool, got {sort!r}")
        self.ops = ops
        self.size, self.page_size, self.num_pages, self.sort = n, ps, n // ps, sort
        pages = self.num_pages
        self._ring = ops.zeros(pages)
        self._released = ops.zeros(pages)
        self._allocated = ops.zeros(pages + 1)
        self._pending = ops.zeros(pages + 1)
        self._version = ops.zeros((pages + 1) * ps)
        self._offsets = ops.arange(ps)
        self._head = self._count = self._nrel = 0
        self._group: list[Array] | None = None
        self.clear()

    # ------------------------------------------------------------------ sizes

    def available_size(self) -> int:
        """Slots of free and released pages, not those of an open group (RADIX-605); host counters only."""
        return (self._count + self._nrel) * self.page_size

    @property
    def in_group(self) -> bool:
        """Whether a free group is open (RADIX-607)."""
        return self._group is not None

    # ------------------------------------------------------------- allocation

    def alloc_ids(self, need_size: SupportsIndex) -> Array | None:
        """``alloc`` returning the slots as a device array (int64), or None; no host sync (RADIX-603)."""
        n = as_count(need_size, op="alloc", arg="need_size")
        ps = self.page_size
        if n % ps:
            raise InvalidValueError(
                "RADIX-604",
                f"alloc: {n} slots is not a whole number of pages of {ps}; a short allocation would lose some",
            )
        want = n // ps
        if want > self._count + self._nrel:
            return None
        if want > self._count:
            self._merge()
        ops = self.ops
        at = (self._head + ops.arange(want)) % self.num_pages
        pages = self._ring[at]
        self._head = (self._head + want) % self.num_pages
        self._count -= want
        self._allocated[pages] = 1
        slots = (pages[:, None] * ps + self._offsets[None, :]).reshape(-1)
        self._version[slots] += 1
        return slots

    def alloc(self, need_size: SupportsIndex) -> list[int] | None:
        """``need_size`` slots in whole pages as a list, or None when fewer are available (RADIX-603, RADIX-604)."""
        got = self.alloc_ids(need_size)
        return None if got is None else self.ops.tolist(got)

    def _merge(self) -> None:
        """Append the release list to the free list, sorted ascending when ``sort`` is on (RADIX-610)."""
        ops, pages = self.ops, self.num_pages
        live = self._ring[(self._head + ops.arange(self._count)) % pages]
        merged = ops.concat([live, self._released[: self._nrel]])
        if self.sort:
            merged = merged[ops.argsort(merged)]
        self._ring[: len(merged)] = merged
        self._head, self._count, self._nrel = 0, len(merged), 0

    # ----------------------------------------------------------------- release

    def free(self, indices: Iterable[SupportsIndex] | Array) -> None:
        """Return the pages ``indices`` fall in, each once; errors as the oracle's (RADIX-602, RADIX-606)."""
        host, items = index_array(indices, op="free", arg="indices")
        if len(host) == 0:
            return
        pages = self._checked_pages(host, items)
        if self._group is not None:
            self._pending[pages] = 1
            self._group.append(pages)
        else:
            self._release(pages)

    def _checked_pages(self, host: np.ndarray, items: list[int] | None) -> Array:
        """The distinct pages ``host`` names, on the device, in first-named order; or the oracle's error."""
        ops, ps = self.ops, self.page_size
        top = (self.num_pages + 1) * ps
        if int(host.min()) >= ps and int(host.max()) < top:
            named = host // ps
            _, first = np.unique(named, return_index=True)
            pages = ops.asarray(named[np.sort(first)])
            if not ops.any((self._allocated[pages] == 0) | (self._pending[pages] != 0)):
                return pages
        allocated = self.ops.to_host(self._allocated)
        pending = {int(p) for p in np.flatnonzero(self.ops.to_host(self._pending))}
        originals = items if items is not None else host.tolist()
        pages_to_free(originals, ps, self.num_pages, lambda p: bool(allocated[p]), pending)
        raise InvariantViolation(
            "ERR-508", "free: the device check refused what the host check accepts"
        )  # pragma: no cover

    def _release(self, pages: Array) -> None:
        m = len(pages)
        self._allocated[pages] = 0
        if self.sort:
            self._released[self._nrel : self._nrel + m] = pages
            self._nrel += m
        else:
            at = (self._head + self._count + self.ops.arange(m)) % self.num_pages
            self._ring[at] = pages
            self._count += m

    def free_group_begin(self) -> None:
        """Open a free group (RADIX-607)."""
        if self._group is not None:
            raise FreeGroupError("RADIX-607", "free_group_begin: a free group is already open; groups do not nest")
        self._group = []

    def free_group_end(self) -> None:
        """Release the open group's pages as one free of their concatenation (RADIX-607)."""
        if self._group is None:
            raise FreeGroupError("RADIX-607", "free_group_end: no free group is open")
        parts, self._group = self._group, None
        if parts:
            pages = self.ops.concat(parts)
            self._pending[pages] = 0
            self._release(pages)

    def clear(self) -> None:
        """Every page free in ascending order; versions kept (RADIX-609)."""
        self._ring[:] = self.ops.arange(1, self.num_pages + 1)
        self._head, self._count, self._nrel = 0, self.num_pages, 0
        self._allocated[:] = 0
        self._pending[:] = 0
        self._group = None

    # ---------------------------------------------------------------- versions

    def version(self, slot: SupportsIndex) -> int:
        """How many times ``slot`` has been handed out (RADIX-608); a host read."""
        return int(self._version[self._slot(slot)])

    def is_current(self, slot: SupportsIndex, version: SupportsIndex) -> bool:
        """Whether ``(slot, version)`` names the slot's current allocation (RADIX-608); a host read."""
        s = self._slot(slot)
        v = as_count(version, op="is_current", arg="version")
        return bool(int(self._allocated[s // self.page_size])) and int(self._version[s]) == v

    def is_allocated(self, slot: SupportsIndex) -> bool:
        """Whether ``slot``'s page is allocated; a host read."""
        return bool(int(self._allocated[self._slot(slot) // self.page_size]))

    def _slot(self, value: object) -> int:
        host, items = index_array([value], op="slot", arg="slot")
        s = int(items[0]) if items is not None else int(host[0])
        top = (self.num_pages + 1) * self.page_size
        if not 0 <= s < top:
            raise BlockIdError("RADIX-606", f"slot: slot {s} outside [0, {top})")
        return s

    def snapshot(self) -> dict[str, Any]:
        """The free order, the allocated pages and the versions, for before/after comparison."""
        ops = self.ops
        ring = ops.tolist(self._ring[(self._head + ops.arange(self._count)) % self.num_pages])
        return {
            "free": ring,
            "released": ops.tolist(self._released[: self._nrel]),
            "allocated": ops.tolist(self._allocated),
            "version": ops.tolist(self._version),
            "group": None if self._group is None else [ops.tolist(p) for p in self._group],
        }

    def __repr__(self) -> str:
        return (
            f"ArraySlotAllocator(size={self.size}, page_size={self.page_size}, sort={self.sort}, "
            f"device={self.ops.device!r}, available={self.available_size()})"
        )
