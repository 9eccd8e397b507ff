"""Chapter 06 on the oracle: every refusal names its rule, its operation and the argument at fault.

Each bad call raises its specific error whose message starts ``[RULE] operation:`` and names the
argument at fault (ERR-502, ERR-521), and leaves the allocator and the tree as they were (ERR-501).
The boundaries of a slot's range are tried on both sides.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kvref.contract.errors import (
    BlockIdError,
    CacheInUseError,
    FreeGroupError,
    HashConflictError,
    InvalidTypeError,
    InvalidValueError,
    KVRefError,
    NotHeldError,
    ReservedBlockError,
    UnknownHashError,
)
from kvref.oracle.radix import OracleRadixCache, OracleSlotAllocator
from kvref.oracle.radix.records import LockReceipt
from tests.refusals import refused

rule = pytest.mark.rule
Allocator: Any = OracleSlotAllocator  # called with what its signature refuses, on purpose
Cache: Any = OracleRadixCache


@dataclass
class World:
    """A page-2 allocator of 16 slots and its tree: ``[1, 2, 3, 4]`` cached in slots 2..5, slots 6
    and 7 allocated and not in the tree, the rest free. Typed ``Any``: the cases call them with what
    their signatures refuse, on purpose."""

    a: Any
    t: Any
    cached: list[int]
    spare: list[int]


def world() -> World:
    a = OracleSlotAllocator(16, page_size=2)
    t = OracleRadixCache(a)
    cached = a.alloc(4) or []
    t.insert([1, 2, 3, 4], cached)
    return World(a, t, cached, a.alloc(2) or [])


def held_lock(w: World) -> None:
    w.t.lock(w.t.match([1, 2, 3, 4]).node)


#: (case, set-up before the snapshot, the bad call, error, rule, operation, argument or text the message names)
CASES: list[tuple[str, Callable[[World], Any] | None, Callable[[World], Any], type[KVRefError], str, str, str]] = [
    ("alloc: a str count", None, lambda w: w.a.alloc("2"), InvalidTypeError, "ERR-503", "alloc", "alloc: need_size"),
    ("alloc: a part page", None, lambda w: w.a.alloc(3), InvalidValueError, "RADIX-604", "alloc", "lose 1 slot(s)"),
    (
        "alloc_extend: a str",
        None,
        lambda w: w.a.alloc_extend("x", [2], [-1]),
        InvalidTypeError,
        "ERR-503",
        "alloc_extend",
        "alloc_extend: prefix_lens",
    ),
    (
        "alloc_extend: last_loc past the end",
        None,
        lambda w: w.a.alloc_extend([1], [2], [18]),
        InvalidValueError,
        "RADIX-614",
        "alloc_extend",
        "18",
    ),
    (
        "alloc_decode: a str",
        None,
        lambda w: w.a.alloc_decode("x", [-1]),
        InvalidTypeError,
        "ERR-503",
        "alloc_decode",
        "alloc_decode: seq_lens",
    ),
    (
        "alloc_decode: last_loc past the end",
        None,
        lambda w: w.a.alloc_decode([2], [18]),
        InvalidValueError,
        "RADIX-614",
        "alloc_decode",
        "last_loc 18",
    ),
    ("lock: a negative node", None, lambda w: w.t.lock(-1), InvalidValueError, "ERR-504", "lock", "lock: node must"),
    ("version: a negative slot", None, lambda w: w.a.version(-1), BlockIdError, "RADIX-606", "version", "slot -1"),
    ("free: a str", None, lambda w: w.a.free("2"), InvalidTypeError, "ERR-503", "free", "free: indices"),
    ("free: out of range", None, lambda w: w.a.free([18]), BlockIdError, "RADIX-606", "free", "slot 18"),
    ("free: the padding page", None, lambda w: w.a.free([1]), ReservedBlockError, "RADIX-602", "free", "slot 1"),
    ("free: a free page", None, lambda w: w.a.free([9]), NotHeldError, "RADIX-606", "free", "9"),
    (
        "free_group_begin: nested",
        lambda w: w.a.free_group_begin(),
        lambda w: w.a.free_group_begin(),
        FreeGroupError,
        "RADIX-607",
        "free_group_begin",
        "already open",
    ),
    (
        "free_group_end: none open",
        None,
        lambda w: w.a.free_group_end(),
        FreeGroupError,
        "RADIX-607",
        "free_group_end",
        "no free group is open",
    ),
    ("version: a str", None, lambda w: w.a.version("1"), InvalidTypeError, "ERR-503", "version", "version: slot must"),
    ("version: past the end", None, lambda w: w.a.version(18), BlockIdError, "RADIX-606", "version", "slot 18"),
    (
        "is_current: a str slot",
        None,
        lambda w: w.a.is_current("1", 0),
        InvalidTypeError,
        "ERR-503",
        "is_current",
        "is_current: slot must",
    ),
    (
        "is_current: a str version",
        None,
        lambda w: w.a.is_current(2, "1"),
        InvalidTypeError,
        "ERR-503",
        "is_current",
        "is_current: version",
    ),
    (
        "is_current: a negative version",
        None,
        lambda w: w.a.is_current(2, -1),
        InvalidValueError,
        "ERR-504",
        "is_current",
        "is_current: version",
    ),
    (
        "is_allocated: past the end",
        None,
        lambda w: w.a.is_allocated(18),
        BlockIdError,
        "RADIX-606",
        "is_allocated",
        "slot 18",
    ),
    ("match: a str", None, lambda w: w.t.match("12"), InvalidTypeError, "ERR-503", "match", "match: tokens"),
    (
        "match: a negative token",
        None,
        lambda w: w.t.match([1, -2]),
        InvalidValueError,
        "ERR-504",
        "match",
        "token id -2",
    ),
    (
        "match: a negative token in an array('q'), as SGLang keeps ids",
        None,
        lambda w: w.t.match(array("q", [1, -2])),
        InvalidValueError,
        "ERR-504",
        "match",
        "token id -2",
    ),
    (
        "match: a negative token in an array('b')",
        None,
        lambda w: w.t.match(array("b", [1, 2, -3, 4])),
        InvalidValueError,
        "ERR-504",
        "match",
        "token id -3",
    ),
    ("match: a bool token", None, lambda w: w.t.match([1, True]), InvalidTypeError, "ERR-503", "match", "tokens[1]"),
    (
        "match: a token at 2**64",
        None,
        lambda w: w.t.match([1, 2**64]),
        InvalidValueError,
        "ERR-504",
        "match",
        "token id 18446744073709551616 is not below 2**64",
    ),
    (
        "match: an unhashable namespace",
        None,
        lambda w: w.t.match([1, 2], namespace=[]),
        InvalidTypeError,
        "ERR-503",
        "match",
        "namespace",
    ),
    (
        "insert: a str key",
        None,
        lambda w: w.t.insert("56", w.spare),
        InvalidTypeError,
        "ERR-503",
        "insert",
        "insert: tokens",
    ),
    (
        "insert: str slots",
        None,
        lambda w: w.t.insert([5, 6], "67"),
        InvalidTypeError,
        "ERR-503",
        "insert",
        "insert: slots",
    ),
    (
        "insert: unpaired",
        None,
        lambda w: w.t.insert([5, 6], [6]),
        InvalidValueError,
        "ERR-506",
        "insert",
        "2 tokens for 1 slots",
    ),
    ("insert: a part page", None, lambda w: w.t.insert([5], [6]), InvalidValueError, "RADIX-621", "insert", "1 tokens"),
    (
        "insert: a negative token",
        None,
        lambda w: w.t.insert([5, -6], w.spare),
        InvalidValueError,
        "ERR-504",
        "insert",
        "token id -6",
    ),
    (
        "insert: a str priority",
        None,
        lambda w: w.t.insert([5, 6], w.spare, priority="1"),
        InvalidTypeError,
        "ERR-503",
        "insert",
        "insert: priority",
    ),
    (
        "insert: an unhashable namespace",
        None,
        lambda w: w.t.insert([5, 6], w.spare, namespace=[]),
        InvalidTypeError,
        "ERR-503",
        "insert",
        "namespace",
    ),
    (
        "insert: a slot twice",
        None,
        lambda w: w.t.insert([5, 6, 7, 8], [6, 7, 6, 7]),
        HashConflictError,
        "RADIX-626",
        "insert",
        "slot 6 is twice in this insert;",
    ),
    (
        "insert: a slot of the tree",
        None,
        lambda w: w.t.insert([5, 6], w.cached[:2]),
        HashConflictError,
        "RADIX-626",
        "insert",
        "already in the tree (node",
    ),
    (
        "insert: a free slot",
        None,
        lambda w: w.t.insert([5, 6], [8, 9]),
        NotHeldError,
        "RADIX-626",
        "insert",
        "slot 8 is not an allocated slot",
    ),
    (
        "insert: a slot past the end",
        None,
        lambda w: w.t.insert([5, 6], [18, 19]),
        NotHeldError,
        "RADIX-626",
        "insert",
        "slot 18 is not an allocated slot",
    ),
    (
        "insert: a page out of order",
        None,
        lambda w: w.t.insert([5, 6], [7, 6]),
        InvalidValueError,
        "RADIX-626",
        "insert",
        "slot 7 at position 0 breaks its page",
    ),
    ("lock: a str", None, lambda w: w.t.lock("1"), InvalidTypeError, "ERR-503", "lock", "lock: node must"),
    ("lock: an unknown node", None, lambda w: w.t.lock(999), UnknownHashError, "RADIX-624", "lock", "node 999"),
    (
        "unlock: a receipt never given",
        None,
        lambda w: w.t.unlock(LockReceipt(999, 1)),
        NotHeldError,
        "RADIX-624",
        "unlock",
        "999",
    ),
    ("evict: a str", None, lambda w: w.t.evict("1"), InvalidTypeError, "ERR-503", "evict", "evict: num_tokens"),
    ("evict: a negative count", None, lambda w: w.t.evict(-1), InvalidValueError, "ERR-504", "evict", "num_tokens"),
    ("reset: a lock held", held_lock, lambda w: w.t.reset(), CacheInUseError, "RADIX-630", "reset", "1 lock(s)"),
    (
        "node_tokens: an unknown node",
        None,
        lambda w: w.t.node_tokens(999),
        UnknownHashError,
        "RADIX-624",
        "node_tokens",
        "node 999",
    ),
]


@rule(
    "ERR-501",
    "ERR-502",
    "ERR-503",
    "ERR-504",
    "ERR-521",
    "RADIX-602",
    "RADIX-604",
    "RADIX-606",
    "RADIX-607",
    "RADIX-614",
    "RADIX-621",
    "RADIX-624",
    "RADIX-626",
    "RADIX-630",
)
@pytest.mark.parametrize(("case", "setup", "call", "error", "rule_id", "op", "names"), CASES, ids=[c[0] for c in CASES])
def test_a_refused_call_names_its_rule_operation_and_argument_and_changes_nothing(
    case: str,
    setup: Callable[[World], Any] | None,
    call: Callable[[World], Any],
    error: type[KVRefError],
    rule_id: str,
    op: str,
    names: str,
) -> None:
    w = world()
    if setup is not None:
        setup(w)
    before = (w.a.snapshot(), w.t.snapshot())
    with pytest.raises(error) as raised:
        call(w)
    message = str(raised.value)
    assert raised.value.rule == rule_id, f"{case}: raised {message!r}; the rule it breaks is {rule_id}"
    assert message.startswith(f"[{rule_id}] {op}: "), f"[ERR-521] {case}: {message!r} does not start with its call"
    assert names in message, f"[ERR-521] {case}: {message!r} does not name {names!r}"
    assert (w.a.snapshot(), w.t.snapshot()) == before, f"[ERR-501] {case}: the refused call changed the state"


@rule("RADIX-622")
@pytest.mark.parametrize("typecode", ["q", "Q", "l", "i", "h", "B"])
def test_a_key_given_as_an_integer_array_matches_as_the_same_list_does(typecode: str) -> None:
    w = world()
    found = w.t.match(array(typecode, [1, 2, 3, 4, 9]))
    assert (found.length, found.slots) == (4, w.cached), f"array({typecode!r}) key: {found}"
    assert w.t.insert(array(typecode, [1, 2, 5, 6]), [0, 0, *w.spare]) == 2, "the first page was cached already"
    assert w.t.node_tokens(w.t.match([1, 2, 5, 6]).node) == (1, 2, 5, 6)


CONSTRUCTION: list[tuple[str, Callable[[], Any], type[KVRefError], str, str]] = [
    ("a str size", lambda: Allocator("8"), InvalidTypeError, "ERR-503", "OracleSlotAllocator: size"),
    (
        "a float page",
        lambda: Allocator(8, page_size=1.0),
        InvalidTypeError,
        "ERR-503",
        "OracleSlotAllocator: page_size",
    ),
    (
        "page 0",
        lambda: Allocator(8, page_size=0),
        InvalidValueError,
        "RADIX-601",
        "OracleSlotAllocator: page_size must be at least 1, got 0",
    ),
    (
        "a part page",
        lambda: Allocator(10, page_size=4),
        InvalidValueError,
        "RADIX-601",
        "OracleSlotAllocator: size 10 must be a positive multiple of page_size 4",
    ),
    (
        "sort not a bool",
        lambda: Allocator(8, sort=1),
        InvalidValueError,
        "RADIX-601",
        "OracleSlotAllocator: sort must be a bool, got 1",
    ),
    ("not an allocator", lambda: Cache(object()), InvalidValueError, "RADIX-620", "OracleRadixCache: <object"),
    (
        "a policy not a str",
        lambda: Cache(Allocator(4), policy=5),
        InvalidTypeError,
        "RADIX-628",
        "policy must be a string",
    ),
    (
        "an unknown policy",
        lambda: Cache(Allocator(4), policy="lfru"),
        InvalidValueError,
        "RADIX-628",
        "unknown radix eviction policy 'lfru'",
    ),
]


@rule("ERR-502", "ERR-521", "RADIX-601", "RADIX-620", "RADIX-628")
@pytest.mark.parametrize(("case", "make", "error", "rule_id", "names"), CONSTRUCTION, ids=[c[0] for c in CONSTRUCTION])
def test_a_refused_construction_names_its_rule_and_what_is_wrong(
    case: str, make: Callable[[], Any], error: type[KVRefError], rule_id: str, names: str
) -> None:
    refused(case, make, error, rule_id, names)


@rule("RADIX-606", "RADIX-608")
def test_a_slots_version_is_readable_from_the_padding_slot_to_the_last_slot() -> None:
    a = OracleSlotAllocator(8, page_size=2)
    top = (a.num_pages + 1) * a.page_size
    assert [a.version(0), a.version(top - 1)] == [0, 0], "slots never handed out have version 0, slot 0 included"
    assert not a.is_current(0, 0) and not a.is_allocated(0), "the padding slot is never allocated"
    got = a.alloc(8) or []
    assert [a.version(s) for s in got] == [1] * 8 and a.is_current(top - 1, 1), "every slot handed out is at 1"
