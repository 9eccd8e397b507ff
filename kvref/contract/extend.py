"""A scheduler step's extend of cached prefixes on pages: the plan every allocator follows (RADIX-613..RADIX-615).

A request whose first ``prefix_len`` tokens have slots (cached, or computed in earlier steps) and
which now runs to ``seq_len`` tokens needs slots for tokens ``[prefix_len, seq_len)``: first the
rest of its partly filled last page, right after ``last_loc`` (the slot of its token
``prefix_len - 1``), then new pages. :func:`plan_extend` checks a step's arguments as every
implementation must and says, per request, how many slots come from its last page and how many
new pages it takes; :meth:`ExtendPlan.compose` lays the step's slots out from the new pages'
slots, in request order, as SGLang's paged ``alloc_extend`` returns them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvref.contract.errors import InvalidTypeError, InvalidValueError
from kvref.contract.validate import as_count, as_int

__all__ = ["ExtendPlan", "ExtendRow", "decode_prefixes", "plan_extend"]


@dataclass(frozen=True)
class ExtendRow:
    """One request of a step: its prefix and new lengths, its last prefix slot, what it takes."""

    prefix_len: int
    seq_len: int
    last_loc: int
    #: Slots taken from the request's own last page, right after ``last_loc``.
    head: int
    #: Slots taken from new pages (all of them but the last full).
    tail: int
    #: New pages the request takes.
    new_pages: int


@dataclass(frozen=True)
class ExtendPlan:
    """A step's extend: each request's row, in order, and the page size."""

    rows: tuple[ExtendRow, ...]
    page_size: int

    @property
    def new_pages(self) -> int:
        """New pages the whole step takes."""
        return sum(r.new_pages for r in self.rows)

    @property
    def num_tokens(self) -> int:
        """Slots the step hands out (SGLang's ``extend_num_tokens``)."""
        return sum(r.seq_len - r.prefix_len for r in self.rows)

    def partial_last_locs(self) -> list[int]:
        """The ``last_loc`` of every request that continues a partly filled page (its page must be allocated)."""
        return [r.last_loc for r in self.rows if r.head]

    def compose(self, new_slots: Sequence[int]) -> list[int]:
        """The step's slots in request order, from ``new_slots``: the slots of the step's new pages,
        as one ``alloc`` of them hands them out (page after page, each page's slots in order)."""
        ps, at = self.page_size, 0
        out: list[int] = []
        for r in self.rows:
            out.extend(range(r.last_loc + 1, r.last_loc + 1 + r.head))
            out.extend(new_slots[at : at + r.tail])
            at += r.new_pages * ps
        return out


def plan_extend(
    prefix_lens: object,
    seq_lens: object,
    last_locs: object,
    page_size: int,
    op: str,
    *,
    held: Callable[[list[int]], Sequence[bool]],
) -> ExtendPlan:
    """Check a step's ``alloc_extend`` arguments (ERR-503, ERR-504, ERR-506, RADIX-614) and plan it.

    A request's ``prefix_len`` must not exceed its ``seq_len``; when the prefix ends inside a page,
    ``last_loc`` must be the slot before its next token (``(last_loc + 1) % page_size ==
    prefix_len % page_size``), outside the padding page, and in a page the allocator has handed
    out: ``held(last_locs)`` says so for those ``last_loc`` (the allocator's one look at its state).
    A prefix on a page boundary leaves ``last_loc`` unread.
    """
    pre = _ints(prefix_lens, op, "prefix_lens", count=True)
    seq = _ints(seq_lens, op, "seq_lens", count=True)
    last = _ints(last_locs, op, "last_locs", count=False)
    if not len(pre) == len(seq) == len(last):
        raise InvalidValueError(
            "ERR-506", f"{op}: {len(pre)} prefix_lens, {len(seq)} seq_lens and {len(last)} last_locs must pair up"
        )
    rows = []
    for i, (p, s, loc) in enumerate(zip(pre, seq, last, strict=True)):
        if s < p:
            raise InvalidValueError("RADIX-614", f"{op}: request {i} has seq_len {s} below its prefix_len {p}")
        into = p % page_size
        if into and ((loc + 1) % page_size != into or loc < page_size):
            raise InvalidValueError(
                "RADIX-614",
                f"{op}: request {i}'s prefix of {p} tokens ends inside a page, so last_loc must be the slot of its "
                f"token {p - 1} (one with (last_loc + 1) % {page_size} == {into}, outside the padding page); "
                f"got {loc}",
            )
        head = min(s - p, page_size - into) if into else 0
        tail = s - p - head
        rows.append(ExtendRow(p, s, loc, head, tail, -(-tail // page_size)))
    plan = ExtendPlan(tuple(rows), page_size)
    partial = plan.partial_last_locs()
    for loc, ok in zip(partial, held(partial) if partial else [], strict=True):
        if not ok:
            raise InvalidValueError(
                "RADIX-614", f"{op}: last_loc {loc} is in a page that is not allocated; its request holds none"
            )
    return plan


def decode_prefixes(seq_lens: object, op: str = "alloc_decode") -> tuple[list[int], list[int]]:
    """``alloc_decode``'s lengths as ``alloc_extend``'s: each request's prefix (``seq_len - 1``) and
    ``seq_len``; every ``seq_len`` must be at least 1, since the step writes token ``seq_len - 1`` (RADIX-615)."""
    seq = _ints(seq_lens, op, "seq_lens", count=True)
    for i, s in enumerate(seq):
        if s < 1:
            raise InvalidValueError(
                "RADIX-615", f"{op}: request {i} has seq_len {s}; a decode step writes token seq_len - 1"
            )
    return [s - 1 for s in seq], seq


def _ints(values: object, op: str, arg: str, *, count: bool) -> list[int]:
    if isinstance(values, (str, bytes, set, frozenset, dict)) or not hasattr(values, "__len__"):
        raise InvalidTypeError("ERR-503", f"{op}: {arg} must be a sequence of integers, got {values!r}")
    given: Any = values
    items = given.tolist() if hasattr(given, "tolist") else list(given)
    return [as_count(v, op=op, arg=arg) if count else as_int(v, op=op, arg=arg) for v in items]
