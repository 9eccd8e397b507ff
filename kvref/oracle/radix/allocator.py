"""The oracle's token-slot allocator with pages (chapter 06, RADIX-601..RADIX-611).

Slots are token positions in a KV buffer. Pages of ``page_size`` slots are the unit of
allocation: page ``p`` holds slots ``p * page_size .. p * page_size + page_size - 1``, pages
``1 .. num_pages`` are handed out and page 0 (slot 0, the padding slot) never is. With
``page_size = 1`` a page is a slot, as in SGLang's ``TokenToKVPoolAllocator``; larger pages are
its ``PagedTokenToKVPoolAllocator``.

State: ``_free`` (pages ready to hand out, in order: :class:`FreePages`), ``_released`` (pages
freed since the last merge, in order; only when ``sort`` is on), ``_allocated`` (the set of pages
handed out), ``_version`` (per page, bumped by every allocation; a slot's version is its page's,
since a page's slots are handed out together: a bitmask allocator's staleness check), and the open
free group, if any (``_group``: pages freed in it, in order, not yet released).

Each call is checked as a whole with set operations before it changes anything; only a call found
wrong is walked slot by slot, by :func:`kvref.contract.checks.pages_to_free`, to name its first fault.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, SupportsIndex

from kvref.contract.checks import page_counts, pages_to_free, split_by
from kvref.contract.errors import BlockIdError, FreeGroupError, InvalidValueError, InvariantViolation
from kvref.contract.extend import decode_prefixes, plan_extend
from kvref.contract.validate import IntsLike, as_block_id_list, as_count, as_int

__all__ = ["FreePages", "OracleSlotAllocator"]


class FreePages:
    """Pages ready to hand out, in order (RADIX-610): ``take(n)`` from the front, ``extend`` at the back.

    A list read from ``start``: a take slices it and moves ``start`` on, and the taken front is cut
    off once it is half the list, so taking ``n`` pages costs O(n) at C speed.
    """

    __slots__ = ("pages", "start")

    def __init__(self, pages: Iterable[int] = ()) -> None:
        self.pages = list(pages)
        self.start = 0

    def __len__(self) -> int:
        return len(self.pages) - self.start

    def __iter__(self) -> Iterator[int]:
        return islice(self.pages, self.start, None)

    def take(self, n: int) -> list[int]:
        """The first ``n`` pages, removed from the order (the caller has checked there are ``n``)."""
        start = self.start
        taken = self.pages[start : start + n]
        self.start = start + n
        if 2 * self.start >= len(self.pages):
            del self.pages[: self.start]
            self.start = 0
        return taken

    def extend(self, pages: Iterable[int]) -> None:
        """Put ``pages`` at the back, in their order."""
        self.pages.extend(pages)

    def sort(self) -> None:
        """Order the pages ascending (RADIX-610's merge with ``sort`` on)."""
        del self.pages[: self.start]
        self.start = 0
        self.pages.sort()


class OracleSlotAllocator:
    """Token slots in pages, strict: ``alloc``, ``free``, free groups, versions, ``clear`` (chapter 06).

    ``OracleSlotAllocator(size, *, page_size=1, sort=True)``: ``size`` usable slots, a multiple of
    ``page_size`` (RADIX-601). ``sort`` is SGLang's ``need_sort``: freed pages wait in a release
    list and are merged, sorted ascending, when an allocation runs short (RADIX-610).
    """

    def __init__(self, size: SupportsIndex, *, page_size: SupportsIndex = 1, sort: bool = True) -> None:
        op = "OracleSlotAllocator"
        n = as_count(size, op=op, arg="size")
        ps = as_count(page_size, op=op, arg="page_size")
        if ps < 1:
            raise InvalidValueError("RADIX-601", f"{op}: page_size must be at least 1, got {ps}")
        if n < ps or n % ps:
            raise InvalidValueError(
                "RADIX-601", f"{op}: size {n} must be a positive multiple of page_size {ps} (whole pages only)"
            )
        if not isinstance(sort, bool):
            raise InvalidValueError("RADIX-601", f"{op}: sort must be a bool, got {sort!r}")
        self._size = n
        self._page = ps
        self._pages = n // ps
        self._sort = sort
        self._version = [0] * (self._pages + 1)
        self._allocated: set[int] = set()
        self._free = FreePages()
        self._released: list[int] = []
        self._group: dict[int, None] | None = None
        self.clear()

    # ------------------------------------------------------------------ sizes

    @property
    def size(self) -> int:
        """Usable slots: ``num_pages * page_size`` (slots of page 0 excluded)."""
        return self._size

    @property
    def page_size(self) -> int:
        """Slots per page (RADIX-601)."""
        return self._page

    @property
    def num_pages(self) -> int:
        """Pages that can be handed out: ``1 .. num_pages``."""
        return self._pages

    @property
    def sort(self) -> bool:
        """Whether released pages are merged sorted (SGLang's ``need_sort``)."""
        return self._sort

    def available_size(self) -> int:
        """Slots ``alloc`` can hand out now: free and released pages, not those of an open group (RADIX-605)."""
        return (len(self._free) + len(self._released)) * self._page

    @property
    def in_group(self) -> bool:
        """Whether a free group is open (RADIX-607)."""
        return self._group is not None

    # ------------------------------------------------------------- allocation

    def alloc(self, need_size: SupportsIndex) -> list[int] | None:
        """``need_size`` slots in whole pages, or None (changing nothing) when fewer are available (RADIX-603).

        ``need_size`` must be a multiple of ``page_size`` (RADIX-604). Each page's slots come in
        order; pages come off the front of the free list (RADIX-610). Every slot handed out gets
        a new version (RADIX-608).
        """
        n = as_count(need_size, op="alloc", arg="need_size")
        ps = self._page
        if n % ps:
            raise InvalidValueError(
                "RADIX-604",
                f"alloc: {n} slots is not a whole number of pages of {ps}; a short allocation would lose "
                f"{n % ps} slot(s)",
            )
        want = n // ps
        if want > len(self._free) + len(self._released):
            return None
        if want > len(self._free):
            self._merge()
        pages = self._free.take(want)
        self._allocated.update(pages)
        version = self._version
        for p in pages:
            version[p] += 1
        if ps == 1:
            return pages  # a page is a slot
        return [slot for p in pages for slot in range(p * ps, p * ps + ps)]

    def alloc_many(self, need_sizes: Sequence[SupportsIndex]) -> list[list[int]] | None:
        """One step's allocations: the slots of one ``alloc(sum)``, split per count, or None (RADIX-612)."""
        counts = page_counts(need_sizes, self._page)
        got = self.alloc(sum(counts))
        return None if got is None else split_by(got, counts)

    def alloc_extend(self, prefix_lens: object, seq_lens: object, last_locs: object) -> list[int] | None:
        """A step's slots for tokens ``[prefix_len, seq_len)`` of each request, or None (RADIX-613, RADIX-614).

        Each request first fills its partly filled last page after ``last_loc`` (a page it must
        hold), then takes new pages; the step's new pages are those one ``alloc`` of them hands
        out, taken in request order. None, changing nothing, when they do not fit.
        """
        return self._extend(prefix_lens, seq_lens, last_locs, "alloc_extend")

    def _extend(self, prefix_lens: object, seq_lens: object, last_locs: object, op: str) -> list[int] | None:
        plan = plan_extend(prefix_lens, seq_lens, last_locs, self._page, op, held=self._pages_held)
        fresh = self.alloc(plan.new_pages * self._page)
        return None if fresh is None else plan.compose(fresh)

    def _pages_held(self, slots: list[int]) -> list[bool]:
        top, ps, allocated = (self._pages + 1) * self._page, self._page, self._allocated
        return [0 <= s < top and s // ps in allocated for s in slots]

    def alloc_decode(self, seq_lens: object, last_locs: object) -> list[int] | None:
        """One slot per request, for its token ``seq_len - 1``: ``alloc_extend(seq_lens - 1, seq_lens,
        last_locs)`` (RADIX-615)."""
        prefixes, seq = decode_prefixes(seq_lens)
        return self._extend(prefixes, seq, last_locs, "alloc_decode")

    def _merge(self) -> None:
        """Move the release list onto the free list; sorted ascending when ``sort`` is on (RADIX-610)."""
        self._free.extend(self._released)
        self._released.clear()
        if self._sort:
            self._free.sort()

    def merge_and_sort_free(self) -> None:
        """Merge released pages into the free list now (SGLang's name; a no-op without released pages)."""
        if self._released:
            self._merge()

    # ----------------------------------------------------------------- release

    def free(self, indices: IntsLike) -> None:
        """Return the pages ``indices`` fall in; any slot of a page names the whole page (RADIX-606).

        Each page named must be allocated and not already freed in the open group: a slot out of
        range raises BlockIdError, one of page 0 ReservedBlockError, one of a free page
        NotHeldError; nothing changes then (ERR-501). Inside a free group the pages are released
        at ``free_group_end`` (RADIX-607).
        """
        pages = self._pages_of(as_block_id_list(indices, op="free", arg="indices"), "free")
        if not pages:
            return
        if self._group is not None:
            self._group.update(dict.fromkeys(pages))
        else:
            self._release(pages)

    def _pages_of(self, slots: Sequence[int], op: str) -> list[int]:
        """The distinct pages ``slots`` name, in first-named order (RADIX-606).

        All of them allocated and none freed earlier in the open group is the whole check: a slot
        out of range or in page 0 names a page never allocated. Otherwise :func:`pages_to_free`
        walks the slots and names the first at fault.
        """
        ps, group = self._page, self._group
        named = slots if ps == 1 else [s // ps for s in slots]
        distinct = set(named)
        if distinct <= self._allocated and (group is None or group.keys().isdisjoint(distinct)):
            return list(named) if len(distinct) == len(named) else list(dict.fromkeys(named))
        pending = frozenset(group or ())
        return pages_to_free(slots, ps, self._pages, self._allocated.__contains__, pending, op)

    def _release(self, pages: list[int]) -> None:
        self._allocated.difference_update(pages)
        (self._released if self._sort else self._free).extend(pages)

    def free_group_begin(self) -> None:
        """Open a free group: later frees are checked at once and released together at its end (RADIX-607)."""
        if self._group is not None:
            raise FreeGroupError("RADIX-607", "free_group_begin: a free group is already open; groups do not nest")
        self._group = {}

    def free_group_end(self) -> None:
        """Close the open free group, releasing its pages as one free of their concatenation (RADIX-607)."""
        if self._group is None:
            raise FreeGroupError("RADIX-607", "free_group_end: no free group is open")
        pages, self._group = self._group, None
        self._release(list(pages))

    def clear(self) -> None:
        """Every page free, in ascending order; no release list, no open group; versions kept (RADIX-609)."""
        self._free = FreePages(range(1, self._pages + 1))
        self._released = []
        self._group = None
        self._allocated.clear()

    # ---------------------------------------------------------------- versions

    def version(self, slot: SupportsIndex) -> int:
        """How many times ``slot`` has been handed out (RADIX-608)."""
        return self._version[self._slot(slot, "version") // self._page]

    def is_current(self, slot: SupportsIndex, version: SupportsIndex) -> bool:
        """Whether ``(slot, version)`` names the slot's current allocation: allocated, same version (RADIX-608)."""
        s = self._slot(slot, "is_current")
        v = as_count(version, op="is_current", arg="version")
        p = s // self._page
        return p in self._allocated and self._version[p] == v

    def is_allocated(self, slot: SupportsIndex) -> bool:
        """Whether ``slot``'s page is allocated (freed in an open group still counts as allocated)."""
        return self._slot(slot, "is_allocated") // self._page in self._allocated

    def _slot(self, value: object, op: str) -> int:
        s = as_int(value, op=op, arg="slot")
        top = (self._pages + 1) * self._page
        if not 0 <= s < top:
            raise BlockIdError("RADIX-606", f"{op}: slot {s} outside [0, {top})")
        return s

    # -------------------------------------------------------------- inspection

    def free_order(self) -> list[int]:
        """Pages in the order ``alloc`` would take them now, merging as it would (RADIX-610)."""
        pending = [*self._free, *self._released]
        return sorted(pending) if self._sort and self._released else pending

    def snapshot(self) -> dict[str, Any]:
        """A deep, comparable copy of the whole state (ERR-501)."""
        return {
            "free": list(self._free),
            "released": list(self._released),
            "allocated": bytes(p in self._allocated for p in range(self._pages + 1)),  # a flag per page
            "version": [v for v in self._version for _ in range(self._page)],  # per slot
            "group": None if self._group is None else list(self._group),
        }

    def check_invariants(self) -> None:
        """Every page is in exactly one place: free, released or allocated; page 0 never (RADIX-611)."""
        places = [*self._free, *self._released]
        if len(set(places)) != len(places):
            raise InvariantViolation("RADIX-611", f"check_invariants: a page is listed twice among free {places}")
        if 0 in places or any(not 1 <= p <= self._pages for p in places):
            raise InvariantViolation("RADIX-602", f"check_invariants: page 0 or an unknown page among free {places}")
        if not self._allocated.isdisjoint(places):
            raise InvariantViolation("RADIX-611", "check_invariants: an allocated page is also free")
        if 0 in self._allocated:
            raise InvariantViolation("RADIX-602", "check_invariants: page 0, the padding page, is marked allocated")
        if any(not 1 <= p <= self._pages for p in self._allocated):
            raise InvariantViolation("RADIX-602", "check_invariants: an unknown page is marked allocated")
        allocated = len(self._allocated)
        if allocated + len(places) != self._pages:
            raise InvariantViolation(
                "RADIX-611",
                f"check_invariants: {allocated} allocated + {len(places)} free != {self._pages} pages",
            )
        if self._released and not self._sort:
            raise InvariantViolation("RADIX-610", "check_invariants: pages wait in the release list without sort")
        if self._group is not None and not self._allocated.issuperset(self._group):
            raise InvariantViolation("RADIX-607", "check_invariants: a page in the open group is not allocated")

    def __repr__(self) -> str:
        return (
            f"OracleSlotAllocator(size={self._size}, page_size={self._page}, sort={self._sort}, "
            f"available={self.available_size()})"
        )
