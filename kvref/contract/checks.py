"""The order of precondition checks of each operation, written once (ERR-509, chapter 05).

:data:`ORDER_OF_CHECKS` is the table: for each operation, its checks in the order they are made,
so that an input breaking several rules raises the error of the first (spec chapter 05 prints
the same table; ``tests/test_order_of_checks.py`` keeps the two equal).

The explainers below walk that order over one call's arguments and raise the error of the first
check that fails, with the message the oracle gives. Every implementation calls them after its
own cheap detection says something is wrong: the oracle after a scalar pass, the array core of
the device backends after a vectorized one (a device kernel cannot call them; the conformance
suite holds it to the table instead). They read the pool through :class:`BlockView`, on the host,
and change nothing; an explainer that finds nothing wrong returns, and the caller goes on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import NoReturn, Protocol, SupportsIndex

from kvref.contract.errors import (
    BlockIdError,
    BlockStateError,
    HashConflictError,
    InvalidTypeError,
    InvalidValueError,
    NotHeldError,
    ReservedBlockError,
    StaleBlockError,
)
from kvref.contract.protocol import BlockState
from kvref.contract.validate import as_count

__all__ = [
    "ORDER_OF_CHECKS",
    "BlockView",
    "Check",
    "HashEntry",
    "explain_acquire",
    "explain_generations",
    "explain_register",
    "explain_release",
    "explain_unheld",
    "order_table",
    "page_counts",
    "pages_to_free",
    "split_by",
    "stale_reference",
]


@dataclass(frozen=True)
class Check:
    """One precondition of an operation: the rule it enforces and what it looks at."""

    rule: str
    what: str


_IDS = Check("ERR-503", "the block ids are a sequence of integers")
_HASHES = Check("ERR-503, HASH-207", "the hashes are a sequence of integers in [0, 2**63)")
_HOLDER = Check("ERR-503", "the holder is hashable")
_GENERATIONS = Check("ERR-503", "the generations, when given, are a sequence of integers")
_GEN_PAIRS = Check("ERR-506", "as many generations as ids")
_HOLDERS = Check("ERR-503, ERR-506", "one hashable holder per entry")
_PAUSED = Check("POOL-114", "the holder is not paused, when the call would give it references")
_STALE = Check("POOL-112", "each generation matches its block's (blocks in range and not reserved)")
_RANGE = Check("POOL-103", "entry by entry, in list order: the id is in range,")
_RESERVED = Check("POOL-118", "the block is not reserved,")

#: Operation -> its checks, first made first (ERR-509). Rows that say "entry by entry" run over a
#: call's entries in list order, every such row for one entry before the next entry.
ORDER_OF_CHECKS: Mapping[str, tuple[Check, ...]] = {
    "allocate": (
        Check("ERR-503", "the count is an integer"),
        Check("ERR-504", "the count is not negative"),
        _HOLDER,
        _PAUSED,
        Check("POOL-105", "the count is at most num_available"),
    ),
    "free": (
        _IDS,
        _HOLDER,
        _GENERATIONS,
        _GEN_PAIRS,
        _STALE,
        _RANGE,
        _RESERVED,
        Check("POOL-108", "and the holder holds a reference to it"),
        Check("POOL-109", "no block occurs more often than the holder's references to it"),
    ),
    "acquire": (
        _IDS,
        _HOLDER,
        _PAUSED,
        _GENERATIONS,
        _GEN_PAIRS,
        _STALE,
        _RANGE,
        _RESERVED,
        Check("POOL-119", "and the block is in use or cached, not free"),
    ),
    "register": (
        _IDS,
        _HASHES,
        Check("ERR-506", "as many hashes as ids"),
        Check("ERR-503, HASH-207", "the parent hash, when given, is a hash"),
        Check("PFX-304", "the parent hash is resident"),
        Check("PFX-303", "no block occurs twice in the call"),
        _RANGE,
        _RESERVED,
        Check("PFX-302", "the block is in use,"),
        Check("PFX-303", "the block has no hash yet,"),
        Check("PFX-306", "and its hash is not its own parent, keeps its resident parent and closes no cycle"),
    ),
    "match": (_HASHES, _HOLDER, Check("ERR-503, HASH-207", "the parent hash, when given, is a hash"), _PAUSED),
    "allocate_many": (
        Check("ERR-503, ERR-504", "entry by entry: the count is an integer, not negative"),
        _HOLDERS,
        Check("POOL-114", "entry by entry: a holder asking for blocks is not paused"),
    ),
    "free_many": (
        Check("ERR-503", "entry by entry: the block ids are a sequence of integers"),
        _HOLDERS,
        Check("POOL-117", "holder by holder, in order of first appearance: the checks of free over its entries"),
    ),
    "match_many": (
        Check("ERR-503, HASH-207", "entry by entry: the hashes are a sequence of integers in [0, 2**63)"),
        _HOLDERS,
        Check("POOL-114", "entry by entry: a holder with hashes to match is not paused"),
    ),
}


class BlockView(Protocol):
    """What the explainers read of a pool, host-side and read-only (the protocol's queries).

    Ids passed to the per-block queries are in range; the explainers check that first.
    """

    @property
    def num_blocks(self) -> int:
        """All blocks, reserved ones included."""
        ...

    def block_state(self, block_id: SupportsIndex) -> BlockState:
        """The state of a block (STATE-001)."""
        ...

    def holders(self, block_id: SupportsIndex) -> dict[Hashable, int]:
        """``{holder: references}`` on a block."""
        ...

    def generation(self, block_id: SupportsIndex) -> int:
        """How many times a block has been allocated."""
        ...

    def block_hash(self, block_id: SupportsIndex) -> int | None:
        """The hash a block is registered under, or None."""
        ...

    def hash_entry(self, block_hash: int) -> HashEntry | None:
        """What the prefix index knows of a hash, or None when it knows nothing."""
        ...


@dataclass(frozen=True)
class HashEntry:
    """A hash as the prefix index knows it: resident or not, its parent, whether it has children."""

    resident: bool
    parent: int | None
    has_children: bool


def explain_unheld(view: BlockView, b: int, holder: Hashable, op: str, *, rule: str = "POOL-108") -> NoReturn:
    """Raise the specific error for a block ``holder`` cannot release or share (POOL-103, POOL-118, ``rule``)."""
    if not 0 <= b < view.num_blocks:
        raise BlockIdError("POOL-103", f"{op}: block id {b} outside [0, {view.num_blocks})")
    state = view.block_state(b)
    if state is BlockState.RESERVED:
        raise ReservedBlockError("POOL-118", f"{op}: block {b} is reserved and never held")
    if state is not BlockState.IN_USE:
        raise NotHeldError(rule, f"{op}: block {b} is {state.value}; holder {holder!r} holds no reference to it")
    held = ", ".join(f"{h!r}: {n}" for h, n in sorted(view.holders(b).items(), key=lambda item: repr(item[0])))
    raise NotHeldError(rule, f"{op}: holder {holder!r} holds no reference to block {b} (its holders: {{{held}}})")


def explain_release(view: BlockView, ids: Sequence[int], holder: Hashable, op: str) -> None:
    """The first block of ``ids`` that ``holder`` cannot release, as often as it occurs (POOL-108, POOL-109)."""
    n = view.num_blocks
    for b in ids:
        if not 0 <= b < n or holder not in view.holders(b):
            explain_unheld(view, b, holder, op)
    for b, times in Counter(ids).items():
        have = view.holders(b)[holder]
        if times > have:
            raise NotHeldError(
                "POOL-109",
                f"{op}: block {b} occurs {times} times but holder {holder!r} holds {have} reference(s) to it",
            )


def stale_reference(op: str, b: int, given: int, current: int) -> StaleBlockError:
    """The POOL-112 error for a generation ``given`` of block ``b`` whose generation is ``current``."""
    return StaleBlockError(
        "POOL-112",
        f"{op}: stale reference to block {b}: generation {given}, current {current} "
        "(the block was freed and handed out again)",
    )


def explain_generations(view: BlockView, ids: Sequence[int], generations: Sequence[int], op: str) -> None:
    """The first in-range, unreserved block whose generation is not the one given (POOL-112)."""
    n = view.num_blocks
    for b, g in zip(ids, generations, strict=True):
        if 0 <= b < n and view.block_state(b) is not BlockState.RESERVED:
            current = view.generation(b)
            if current != g:
                raise stale_reference(op, b, g, current)


def explain_acquire(view: BlockView, ids: Sequence[int], op: str) -> None:
    """The first block of ``ids`` that cannot be acquired: out of range, reserved or free (POOL-119)."""
    n = view.num_blocks
    for b in ids:
        if not 0 <= b < n:
            raise BlockIdError("POOL-103", f"{op}: block id {b} outside [0, {n})")
        state = view.block_state(b)
        if state is BlockState.RESERVED:
            raise ReservedBlockError("POOL-118", f"{op}: block {b} is reserved and never held")
        if state is BlockState.FREE:
            raise BlockStateError("POOL-119", f"{op}: block {b} is free; only blocks in use or cached can be acquired")


def explain_register(view: BlockView, ids: Sequence[int], hashes: Sequence[int], parent: int | None, op: str) -> None:
    """The first position of a registration that breaks PFX-302, PFX-303 or PFX-306, in list order.

    The call's arguments are checked already (ERR-503, ERR-506, PFX-304, a block listed twice).
    Hashes the call itself makes resident count as resident from their position on.
    """
    prev = parent
    pending: dict[int, int | None] = {}  # hashes this call makes resident -> their parent
    for b, h in zip(ids, hashes, strict=True):
        if not 0 <= b < view.num_blocks or view.block_state(b) is BlockState.RESERVED:
            explain_unheld(view, b, None, op, rule="PFX-302")
        state = view.block_state(b)
        if state is not BlockState.IN_USE:
            raise BlockStateError("PFX-302", f"{op}: block {b} is {state.value}; only blocks in use can be registered")
        registered = view.block_hash(b)
        if registered is not None:
            raise HashConflictError("PFX-303", f"{op}: block {b} is already registered under {registered:#x}")
        if h == prev:
            raise HashConflictError("PFX-306", f"{op}: hash {h:#x} cannot be its own parent")
        entry = view.hash_entry(h)
        if entry is not None and entry.resident:
            known, known_parent = True, entry.parent
        else:
            known, known_parent = h in pending, pending.get(h)
        if known and known_parent != prev:
            raise HashConflictError(
                "PFX-306",
                f"{op}: hash {h:#x} is resident with parent {known_parent!r}, registration gives parent {prev!r}",
            )
        if not known and entry is not None and entry.has_children and _is_ancestor(view, h, prev, pending):
            raise HashConflictError(
                "PFX-306", f"{op}: registering {h:#x} under {prev!r} would make it its own ancestor"
            )
        pending.setdefault(h, prev)
        prev = h


def _is_ancestor(view: BlockView, h: int, start: int | None, pending: Mapping[int, int | None]) -> bool:
    """Whether ``h`` lies on the parent chain from ``start`` up (a would-be cycle, PFX-306)."""
    seen: set[int] = set()
    node = start
    while node is not None and node not in seen:
        if node == h:
            return True
        seen.add(node)
        entry = view.hash_entry(node)
        node = entry.parent if entry is not None and entry.resident else pending.get(node)
    return False


def order_table() -> str:
    """:data:`ORDER_OF_CHECKS` as the Markdown table spec chapter 05 prints (one row per check)."""
    rows = ["| operation | # | rule | what is checked |", "|---|---:|---|---|"]
    for op, checks in ORDER_OF_CHECKS.items():
        for i, check in enumerate(checks, 1):
            rows.append(f"| `{op}` | {i} | {check.rule} | {check.what} |")
    return "\n".join(rows)


def pages_to_free(
    slots: Sequence[int],
    page_size: int,
    num_pages: int,
    is_allocated: Callable[[int], bool],
    pending: Set[int],
    op: str = "free",
) -> list[int]:
    """The distinct pages a token-slot ``free`` names, in first-named order, or its first error (RADIX-606).

    Slot by slot, in list order: in range (BlockIdError), not in page 0, the padding page
    (ReservedBlockError, RADIX-602), its page allocated and not freed earlier in the open group
    (``pending``; NotHeldError). A page named twice in one call counts once. The oracle runs it
    on every free, the array allocator once its own check has found something wrong.
    """
    top = (num_pages + 1) * page_size
    seen: set[int] = set()
    pages: list[int] = []
    for slot in slots:
        if not 0 <= slot < top:
            raise BlockIdError("RADIX-606", f"{op}: slot {slot} outside [0, {top})")
        p = slot // page_size
        if p == 0:
            raise ReservedBlockError("RADIX-602", f"{op}: slot {slot} is in page 0, the padding page, never handed out")
        if p in seen:
            continue
        if p in pending or not is_allocated(p):
            where = "freed earlier in the open free group" if p in pending else "not allocated"
            raise NotHeldError(
                "RADIX-606", f"{op}: slot {slot} is in page {p}, which is {where} (a double free?); nothing freed"
            )
        seen.add(p)
        pages.append(p)
    return pages


def page_counts(values: object, page_size: int, op: str = "alloc_many") -> list[int]:
    """Each count of a batched ``alloc`` as ``alloc`` checks its own, in order: an integer, not
    negative (ERR-503, ERR-504), a whole number of pages (RADIX-604); the list, or the first error."""
    if isinstance(values, (str, bytes, set, frozenset, dict)) or not hasattr(values, "__len__"):
        raise InvalidTypeError("ERR-503", f"{op}: the counts must be a sequence of integers, got {values!r}")
    counts = [as_count(v, op=op, arg="count") for v in values]  # type: ignore[attr-defined]
    for i, n in enumerate(counts):
        if n % page_size:
            raise InvalidValueError(
                "RADIX-604", f"{op}: count {i} ({n} slots) is not a whole number of pages of {page_size}"
            )
    return counts


def split_by(items: list[int], counts: list[int]) -> list[list[int]]:
    """``items`` cut in order into lists of ``counts`` (which sum to its length) (RADIX-612)."""
    out, at = [], 0
    for n in counts:
        out.append(items[at : at + n])
        at += n
    return out
