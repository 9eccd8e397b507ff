"""Argument checks shared by every implementation: integers, counts, id lists, hashes, holders.

Integers are accepted as Python ``int`` or anything with an integer ``__index__`` (NumPy integer
scalars, 0-d integer tensors); ``bool`` in every spelling, floats, strings and ``None`` are refused
with :class:`~kvref.contract.errors.InvalidTypeError` (ERR-503). Each helper names the operation and the
argument in its message, so the error reads like a bug report.
"""

from __future__ import annotations

import operator
import sys
from array import array
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, SupportsIndex, TypeAlias

from kvref.contract.errors import HashConflictError, InvalidTypeError, InvalidValueError, UnknownHashError

__all__ = [
    "HASH_MAX",
    "IntsLike",
    "as_block_id_list",
    "as_count",
    "as_hash",
    "as_hash_list",
    "as_holder",
    "as_holder_list",
    "as_int",
    "as_list",
    "as_pool_shape",
    "as_token_ids",
    "prefix_tree_violation",
    "register_arguments",
    "request_prefix_limit",
]

#: Block hashes are integers in ``[0, HASH_MAX)``: they fit a signed 64-bit slot and leave the
#: negative values free as sentinels for tensor hash tables (HASH-207).
HASH_MAX = 1 << 63

_UNSEEN: Any = object()  # a parent_of entry not yet made (None is a real parent: the root)


#: What an operation taking block ids, hashes or counts accepts: any iterable of integers (a list,
#: a tuple, a range, a 1-d NumPy array or tensor of an integer dtype), checked at run time.
IntsLike: TypeAlias = Iterable[SupportsIndex]


def _is_boolean(value: object) -> bool:
    if isinstance(value, bool):
        return True
    dtype = getattr(value, "dtype", None)
    return dtype is not None and "bool" in str(dtype)


def as_int(value: object, *, op: str, arg: str, rule: str = "ERR-503") -> int:
    """Return ``value`` as a Python int, or raise InvalidTypeError naming ``op`` and ``arg``."""
    if type(value) is int:
        return value
    if _is_boolean(value):
        raise InvalidTypeError(rule, f"{op}: {arg} must be an integer, got a boolean {value!r}")
    try:
        result = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidTypeError(rule, f"{op}: {arg} must be an integer, got {type(value).__name__} {value!r}") from None
    if type(result) is not int:
        raise InvalidTypeError(rule, f"{op}: {arg} must be an integer, got {value!r}")
    return result


def as_count(value: object, *, op: str, arg: str = "count", rule: str | None = None) -> int:
    """Return a non-negative count: a non-integer raises InvalidTypeError (ERR-503), a negative value
    InvalidValueError (ERR-504), or both naming ``rule`` where a chapter gives its own."""
    count = as_int(value, op=op, arg=arg, rule=rule or "ERR-503")
    if count < 0:
        raise InvalidValueError(rule or "ERR-504", f"{op}: {arg} must be >= 0, got {count}")
    return count


def as_list(values: object, *, op: str, arg: str, rule: str = "ERR-503") -> list[Any]:
    """``values`` as a list: any sequence or 1-d array, never a str, bytes, mapping or None; a refusal
    names ``rule`` (ERR-503 unless a chapter gives its own)."""
    if type(values) is list:
        return values
    if isinstance(values, (tuple, range)):
        return list(values)
    if isinstance(values, (str, bytes, bytearray, memoryview, Mapping)) or values is None:
        raise InvalidTypeError(rule, f"{op}: {arg} must be a sequence of integers, got {type(values).__name__}")
    if isinstance(values, (set, frozenset)):
        raise InvalidTypeError(rule, f"{op}: {arg} must be an ordered sequence; a {type(values).__name__} has no order")
    tolist = getattr(values, "tolist", None)
    if tolist is not None:
        if getattr(values, "ndim", 1) != 1:
            raise InvalidTypeError(
                rule, f"{op}: {arg} must be one-dimensional, got shape {getattr(values, 'shape', None)}"
            )
        result = tolist()
        if not isinstance(result, list):  # pragma: no cover - defensive for exotic arrays
            raise InvalidTypeError(rule, f"{op}: {arg} must be one-dimensional")
        return result
    if not isinstance(values, Iterable):
        raise InvalidTypeError(rule, f"{op}: {arg} must be a sequence of integers, got {type(values).__name__}")
    return list(values)


#: The one type a list of ids may hold to be taken as it is (``bool`` is an int subclass, not an id).
_INT_ONLY = frozenset({int})


def as_block_id_list(values: object, *, op: str, arg: str = "block_ids") -> list[int]:
    """Return ``values`` as a list of Python ints (not range-checked: that is the pool's job).

    Accepts lists, tuples, ranges, 1-d NumPy arrays and tensors. The returned list may be the
    caller's own list object when it already holds only ints; callers must not mutate it.
    """
    items = as_list(values, op=op, arg=arg)
    if _INT_ONLY.issuperset(map(type, items)):  # every item exactly an int (no bool): the list as it is
        return items
    return [as_int(x, op=op, arg=f"{arg}[{i}]") for i, x in enumerate(items)]


#: Integer typecodes of ``array.array``: an array of one holds nothing but integers.
_INT_TYPECODES = frozenset("bBhHiIlLqQ")
#: Where an 8-byte integer keeps its sign bit, in this machine's byte order.
_SIGN_BYTE = 7 if sys.byteorder == "little" else 0


def as_token_ids(values: object, *, op: str, arg: str = "tokens") -> array[int]:
    """Return ``values`` as an ``array("Q")`` of token ids: integers (ERR-503) in ``[0, 2**64)`` (ERR-504).

    The radix tree keeps its keys in this form, so slices compare at C speed. An ``array`` of an
    integer typecode holds nothing else, so its items are not looked at one by one: an
    ``array("q")`` (how SGLang's scheduler keeps a request's ids) is checked for negative ids by the
    sign byte of each and then read as unsigned, bit for bit. Anything else is checked as
    :func:`as_block_id_list` checks ids. The result may be the caller's own ``array("Q")``; callers
    must not mutate it.
    """
    if type(values) is array and values.typecode in _INT_TYPECODES:
        if values.typecode == "Q":
            return values
        if values.typecode == "q":
            raw = values.tobytes()
            if not raw[_SIGN_BYTE::8].isascii():  # a sign bit is set
                raise InvalidValueError("ERR-504", f"{op}: token id {min(values)} is negative")
            return array("Q", raw)
        items: Sequence[int] = values
    else:
        items = as_block_id_list(values, op=op, arg=arg)
    try:
        return array("Q", items)
    except OverflowError:  # an id below 0 or at 2**64 or beyond
        lowest = min(items)
        if lowest < 0:
            raise InvalidValueError("ERR-504", f"{op}: token id {lowest} is negative") from None
        raise InvalidValueError("ERR-504", f"{op}: token id {max(items)} is not below 2**64") from None


def as_hash(value: object, *, op: str, arg: str = "block_hash") -> int:
    """Return a block hash: an int in ``[0, 2**63)`` (HASH-207)."""
    result = as_int(value, op=op, arg=arg)
    if not 0 <= result < HASH_MAX:
        raise InvalidValueError("HASH-207", f"{op}: {arg} must lie in [0, 2**63), got {result}")
    return result


def as_hash_list(values: object, *, op: str, arg: str = "block_hashes") -> list[int]:
    """Return a list of block hashes, each checked as by :func:`as_hash`."""
    items = as_list(values, op=op, arg=arg)
    if _INT_ONLY.issuperset(map(type, items)) and (not items or (min(items) >= 0 and max(items) < HASH_MAX)):
        return items
    return [as_hash(x, op=op, arg=f"{arg}[{j}]") for j, x in enumerate(items)]


def as_holder(value: object, *, op: str) -> Hashable:
    """Return ``value`` if it can name a holder: hashable (ERR-503) and equal to itself (ERR-516), ``None`` included.

    A value not equal to itself (a float NaN) could never be found again as a key once a copy of
    it is passed, so the references it took would leak; it is refused instead.
    """
    try:
        hash(value)
    except Exception:  # any failure to hash makes it unusable as a holder
        raise InvalidTypeError("ERR-503", f"{op}: holder must be hashable, got {type(value).__name__}") from None
    if type(value) is str or type(value) is int or value is None:
        return value  # the common holders, equal to themselves
    try:
        same = bool(value == value)
    except Exception:  # an __eq__ that raises cannot name a holder either
        same = False
    if not same:
        raise InvalidValueError(
            "ERR-516", f"{op}: holder {value!r} is not equal to itself, so no later call could name it again"
        )
    return value


def as_pool_shape(num_blocks: object, reserved_ids: object, *, op: str) -> tuple[int, tuple[int, ...]]:
    """``(num_blocks, reserved_ids)`` of a new pool, checked as POOL-101 requires.

    Reserved ids must be distinct and in ``[0, num_blocks)``, and at least one block must be left
    usable; otherwise InvalidValueError citing POOL-101.
    """
    n = as_count(num_blocks, op=op, arg="num_blocks")
    reserved = tuple(as_block_id_list(reserved_ids, op=op, arg="reserved_ids"))
    if len(set(reserved)) != len(reserved):
        raise InvalidValueError("POOL-101", f"{op}: reserved_ids has duplicates: {list(reserved)}")
    for r in reserved:
        if not 0 <= r < n:
            raise InvalidValueError("POOL-101", f"{op}: reserved id {r} outside [0, {n}) for num_blocks={n}")
    if n - len(reserved) < 1:
        raise InvalidValueError(
            "POOL-101", f"{op}: num_blocks={n} leaves no usable block after {len(reserved)} reserved"
        )
    return n, reserved


def as_holder_list(holders: object, expected: int, *, op: str) -> list[Hashable]:
    """One holder per entry of a batched call: a sequence (not a string) of ``expected`` holders (ERR-503, ERR-506)."""
    if isinstance(holders, (str, bytes)) or not isinstance(holders, Sequence):
        raise InvalidTypeError("ERR-503", f"{op}: holders must be a sequence, one per entry")
    if len(holders) != expected:
        raise InvalidValueError("ERR-506", f"{op}: {len(holders)} holders for {expected} entries; they must pair up")
    if set(map(type, holders)) <= _PLAIN_HOLDERS:  # ints and strs name holders as they are: one pass in C
        return list(holders)
    return [as_holder(h, op=op) for h in holders]


_PLAIN_HOLDERS = {int, str}


def request_prefix_limit(num_hashes: int, num_tokens: object, block_size: object, *, op: str = "match_request") -> int:
    """How many of a request's ``num_hashes`` block hashes may be matched: its last token is never a hit (REQ-701).

    ``(num_tokens - 1) // block_size``, so the engine always has a token to compute. Refuses a zero
    block size and more hashes than the request has full blocks.
    """
    n = as_count(num_tokens, op=op, arg="num_tokens")
    size = as_count(block_size, op=op, arg="block_size")
    if size == 0:
        raise InvalidValueError("REQ-701", f"{op}: block_size must be >= 1")
    if num_hashes > n // size:
        raise InvalidValueError("REQ-701", f"{op}: {num_hashes} block hashes for {n} tokens of block size {size}")
    return max(n - 1, 0) // size


def prefix_tree_violation(
    ids: Sequence[int],
    parent_of: dict[int, int | None],
    resident: Mapping[int, int | None] | None = None,
) -> tuple[str, str] | None:
    """``(rule, reason)`` if the chain ``ids`` breaks the prefix tree, else None (TRACE-1006, PFX-306).

    An id names one prefix: it occurs once in a chain and always follows the same id (None: it
    comes first). ``parent_of`` maps every id seen in earlier chains to its predecessor and is
    updated in place. ``resident``, where given, maps resident hashes to their registered parent;
    an id met for the first time must follow that parent (PFX-306), as ``register`` would demand.
    """
    previous: int | None = None
    seen = parent_of.get
    for h in ids:
        known = seen(h, _UNSEEN)
        if known == previous:
            previous = h
            continue
        if known is _UNSEEN:
            if resident is not None and h in resident and resident[h] != previous:
                return "PFX-306", (f"hash {h:#x} is resident with parent {resident[h]!r} but follows {previous!r} here")
            parent_of[h] = previous
        else:
            if ids.count(h) > 1:
                return "TRACE-1006", f"block id {h} occurs twice in one request"
            return "TRACE-1006", (
                f"block id {h} follows {previous!r} here but {known!r} before; equal ids must mean equal prefixes"
            )
        previous = h
    return None


def register_arguments(
    block_ids: object, block_hashes: object, parent_hash: object, *, parent_resident: Callable[[int], bool]
) -> tuple[list[int], list[int], int | None]:
    """``register``'s arguments before any block is looked at: ids, hashes and the parent hash.

    Refuses ids and hashes that do not pair up (ERR-506), a parent hash that ``parent_resident``
    says is not resident (PFX-304), and a block listed twice (PFX-303). The checks of each block
    against the pool's state are the caller's.
    """
    op = "register"
    ids = as_block_id_list(block_ids, op=op)
    hs = as_hash_list(block_hashes, op=op)
    if len(ids) != len(hs):
        raise InvalidValueError("ERR-506", f"{op}: {len(ids)} block ids for {len(hs)} hashes; they must pair up")
    parent = None if parent_hash is None else as_hash(parent_hash, op=op, arg="parent_hash")
    if parent is not None and not parent_resident(parent):
        raise UnknownHashError("PFX-304", f"{op}: parent hash {parent:#x} is not resident; register the prefix first")
    if len(set(ids)) != len(ids):
        raise HashConflictError("PFX-303", f"{op}: a block occurs twice in {ids}; a block has one hash")
    return ids, hs, parent
