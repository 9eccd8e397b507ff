"""Chapter 05's bad-input matrix: a pool with something to lose, and one bad call per case.

:func:`make_world` builds a pool that holds blocks, caches a chain and has events and statistics
to lose; :data:`CASES` lists each bad call with the error class and rule it must raise;
:func:`needs` says which capabilities a case exercises. :mod:`kvref_conformance.suites.errors`
runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvref.contract.errors import (
    BlockIdError,
    BlockStateError,
    HashConflictError,
    InvalidTypeError,
    InvalidValueError,
    KVRefError,
    NotHeldError,
    OutOfBlocksError,
    ReservedBlockError,
    StaleBlockError,
    UnknownHashError,
)
from kvref_conformance.suites.base import first_policy
from kvref_conformance.target import Target

__all__ = ["CASES", "WRONG_INTS", "WRONG_SEQS", "Case", "Unequal", "World", "int_kinds", "make_world", "needs"]


@dataclass
class World:
    """A pool with something to lose: held blocks, a cached chain, events and statistics."""

    pool: Any  # Any: the matrix passes wrong types on purpose
    held: list[int]  # held by "r"; with a prefix cache, held[0] is registered under 4 (parent 3)
    cached: list[int]  # hashes 1, 2, 3, evictable (empty without a prefix cache)
    never: int  # a block never allocated


def make_world(impl: Target) -> World:
    caching = impl.has("prefix-cache")
    pool = impl.create(16, policy=first_policy(impl), enable_events=impl.has("events"), paused_limit=2)
    cached: list[int] = []
    if caching:
        cached = pool.allocate(3, holder="c")
        pool.register(cached, [1, 2, 3])
        pool.free(cached[::-1], holder="c")
        pool.free(pool.match([1], holder="m"), holder="m")
    held = pool.allocate(3, holder="r")
    if caching:
        pool.register(held[:1], [4], parent_hash=3)
    never = next(b for b in range(1, 16) if pool.generation(b) == 0)
    return World(pool, held, cached, never)


class Unequal:
    """A hashable holder whose ``__eq__`` raises: no later call could name it (ERR-516)."""

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("Unequal cannot be compared")


Case = tuple[str, Callable[[World], Any], type[KVRefError], str]

WRONG_INTS: list[object] = [1.0, True, False, np.bool_(True), "1", None, b"1", 1 + 0j, np.float64(2.0)]
WRONG_SEQS: list[object] = [
    5,
    "abc",
    b"ab",
    None,
    3.0,
    {1: 2},
    {1},
    frozenset({1}),
    memoryview(b"\x01"),
    np.zeros((2, 2), dtype=np.int64),
]


def shown(value: object) -> str:
    """A case's value as its test id shows it: the same in every process (no memory address)."""
    if isinstance(value, memoryview):
        return f"memoryview({value.tobytes()!r})"
    return repr(value)


CASES: list[Case] = [
    # allocate
    ("allocate: negative count", lambda w: w.pool.allocate(-1), InvalidValueError, "ERR-504"),
    ("allocate: huge count", lambda w: w.pool.allocate(10**12), OutOfBlocksError, "POOL-105"),
    (
        "allocate: one more than available",
        lambda w: w.pool.allocate(w.pool.num_available + 1),
        OutOfBlocksError,
        "POOL-105",
    ),
    ("allocate: unhashable holder", lambda w: w.pool.allocate(1, holder=[]), InvalidTypeError, "ERR-503"),
    (
        "allocate: holder not equal to itself",
        lambda w: w.pool.allocate(1, holder=float("nan")),
        InvalidValueError,
        "ERR-516",
    ),
    (
        "allocate: holder whose __eq__ raises",
        lambda w: w.pool.allocate(1, holder=Unequal()),
        InvalidValueError,
        "ERR-516",
    ),
    (
        "free: holder not equal to itself",
        lambda w: w.pool.free(w.held[:1], holder=float("nan")),
        InvalidValueError,
        "ERR-516",
    ),
    *[
        (
            f"allocate: count {shown(v)}",
            (lambda bad: lambda w: w.pool.allocate(bad))(v),
            InvalidTypeError,
            "ERR-503",
        )
        for v in WRONG_INTS
    ],
    # free
    ("free: negative id", lambda w: w.pool.free([-1], holder="r"), BlockIdError, "POOL-103"),
    ("free: id = num_blocks", lambda w: w.pool.free([16], holder="r"), BlockIdError, "POOL-103"),
    ("free: huge id", lambda w: w.pool.free([2**70], holder="r"), BlockIdError, "POOL-103"),
    ("free: reserved id", lambda w: w.pool.free([0], holder="r"), ReservedBlockError, "POOL-118"),
    ("free: never allocated", lambda w: w.pool.free([w.never], holder="r"), NotHeldError, "POOL-108"),
    ("free: cached block", lambda w: w.pool.free(w.cached[:1], holder="r"), NotHeldError, "POOL-108"),
    ("free: other holder's block", lambda w: w.pool.free(w.held[:1], holder="x"), NotHeldError, "POOL-108"),
    ("free: default holder holds nothing", lambda w: w.pool.free(w.held[:1]), NotHeldError, "POOL-108"),
    (
        "free: duplicate beyond references",
        lambda w: w.pool.free([w.held[1], w.held[1]], holder="r"),
        NotHeldError,
        "POOL-109",
    ),
    (
        "free: valid then invalid",
        lambda w: w.pool.free([w.held[2], w.never], holder="r"),
        NotHeldError,
        "POOL-108",
    ),
    (
        "free: generations too short",
        lambda w: w.pool.free(w.held[:2], holder="r", generations=[1]),
        InvalidValueError,
        "ERR-506",
    ),
    (
        "free: stale generation",
        lambda w: w.pool.free(w.held[:1], holder="r", generations=[0]),
        StaleBlockError,
        "POOL-112",
    ),
    (
        "free: generation of wrong type",
        lambda w: w.pool.free(w.held[:1], holder="r", generations=[1.0]),
        InvalidTypeError,
        "ERR-503",
    ),
    ("free: float array", lambda w: w.pool.free(np.array([1.0]), holder="r"), InvalidTypeError, "ERR-503"),
    # a generation beside an id that is out of range or reserved: the id's own error comes first
    ("free: id 16, a generation", lambda w: w.pool.free([16], holder="r", generations=[1]), BlockIdError, "POOL-103"),
    ("free: id 2**70, a generation", lambda w: w.pool.free([2**70], generations=[1]), BlockIdError, "POOL-103"),
    ("acquire: id 0, a generation", lambda w: w.pool.acquire([0], generations=[5]), ReservedBlockError, "POOL-118"),
    *[
        (
            f"free: element {shown(v)}",
            (lambda bad: lambda w: w.pool.free([w.held[0], bad], holder="r"))(v),
            InvalidTypeError,
            "ERR-503",
        )
        for v in WRONG_INTS
    ],
    *[
        (
            f"free: ids {type(v).__name__} {shown(v)}",
            (lambda bad: lambda w: w.pool.free(bad, holder="r"))(v),
            InvalidTypeError,
            "ERR-503",
        )
        for v in WRONG_SEQS
    ],
    # acquire
    ("acquire: free block", lambda w: w.pool.acquire([w.never], holder="r"), BlockStateError, "POOL-119"),
    ("acquire: reserved id", lambda w: w.pool.acquire([0]), ReservedBlockError, "POOL-118"),
    ("acquire: out of range", lambda w: w.pool.acquire([16]), BlockIdError, "POOL-103"),
    ("acquire: negative id", lambda w: w.pool.acquire([-3]), BlockIdError, "POOL-103"),
    (
        "acquire: stale generation",
        lambda w: w.pool.acquire(w.cached[:1], generations=[7]),
        StaleBlockError,
        "POOL-112",
    ),
    (
        "acquire: valid then free",
        lambda w: w.pool.acquire([w.cached[0], w.never]),
        BlockStateError,
        "POOL-119",
    ),
    *[
        (f"acquire: ids {shown(v)}", (lambda bad: lambda w: w.pool.acquire(bad))(v), InvalidTypeError, "ERR-503")
        for v in WRONG_SEQS
    ],
    *[
        (
            f"acquire: element {shown(v)}",
            (lambda bad: lambda w: w.pool.acquire([bad]))(v),
            InvalidTypeError,
            "ERR-503",
        )
        for v in WRONG_INTS
    ],
    # register
    ("register: free block", lambda w: w.pool.register([w.never], [9]), BlockStateError, "PFX-302"),
    ("register: cached block", lambda w: w.pool.register(w.cached[:1], [9]), BlockStateError, "PFX-302"),
    ("register: reserved block", lambda w: w.pool.register([0], [9]), ReservedBlockError, "POOL-118"),
    ("register: out of range", lambda w: w.pool.register([99], [9]), BlockIdError, "POOL-103"),
    ("register: hashed block", lambda w: w.pool.register(w.held[:1], [9]), HashConflictError, "PFX-303"),
    (
        "register: block twice",
        lambda w: w.pool.register([w.held[1], w.held[1]], [8, 9]),
        HashConflictError,
        "PFX-303",
    ),
    (
        "register: unknown parent",
        lambda w: w.pool.register(w.held[1:2], [9], parent_hash=77),
        UnknownHashError,
        "PFX-304",
    ),
    (
        "register: new parent for resident hash",
        lambda w: w.pool.register(w.held[1:2], [2]),
        HashConflictError,
        "PFX-306",
    ),
    (
        "register: own parent",
        lambda w: w.pool.register(w.held[1:2], [4], parent_hash=4),
        HashConflictError,
        "PFX-306",
    ),
    ("register: length mismatch", lambda w: w.pool.register(w.held[1:3], [9]), InvalidValueError, "ERR-506"),
    ("register: negative hash", lambda w: w.pool.register(w.held[1:2], [-1]), InvalidValueError, "HASH-207"),
    ("register: 64-bit hash", lambda w: w.pool.register(w.held[1:2], [2**63]), InvalidValueError, "HASH-207"),
    ("register: float hash", lambda w: w.pool.register(w.held[1:2], [1.5]), InvalidTypeError, "ERR-503"),
    (
        "register: second block bad",
        lambda w: w.pool.register(w.held[1:3], [9, -2]),
        InvalidValueError,
        "HASH-207",
    ),
    (
        "register: second block free",
        lambda w: w.pool.register([w.held[1], w.never], [9, 10]),
        BlockStateError,
        "PFX-302",
    ),
    (
        "register: parent of wrong type",
        lambda w: w.pool.register(w.held[1:2], [9], parent_hash="3"),
        InvalidTypeError,
        "ERR-503",
    ),
    (
        "register: one hash twice with two parents",
        lambda w: w.pool.register(w.held[1:3], [9, 9], parent_hash=4),
        HashConflictError,
        "PFX-306",
    ),
    # lookup and match
    ("lookup: str hash", lambda w: w.pool.lookup(["a"]), InvalidTypeError, "ERR-503"),
    ("lookup: negative hash", lambda w: w.pool.lookup([1, -5]), InvalidValueError, "HASH-207"),
    ("lookup: None", lambda w: w.pool.lookup(None), InvalidTypeError, "ERR-503"),
    ("lookup: bad parent", lambda w: w.pool.lookup([1], parent_hash=-1), InvalidValueError, "HASH-207"),
    ("match: bool hash", lambda w: w.pool.match([True]), InvalidTypeError, "ERR-503"),
    ("match: unhashable holder", lambda w: w.pool.match([1], holder={}), InvalidTypeError, "ERR-503"),
    (
        "match: holder not equal to itself",
        lambda w: w.pool.match([1], holder=float("nan")),
        InvalidValueError,
        "ERR-516",
    ),
    ("match: huge hash", lambda w: w.pool.match([2**64]), InvalidValueError, "HASH-207"),
    # batched forms
    (
        "allocate_many: negative",
        lambda w: w.pool.allocate_many([1, -1], holders=["a", "b"]),
        InvalidValueError,
        "ERR-504",
    ),
    (
        "allocate_many: float",
        lambda w: w.pool.allocate_many([1, 1.0], holders=["a", "b"]),
        InvalidTypeError,
        "ERR-503",
    ),
    (
        "allocate_many: holders short",
        lambda w: w.pool.allocate_many([1, 1], holders=["a"]),
        InvalidValueError,
        "ERR-506",
    ),
    (
        "allocate_many: holders a str",
        lambda w: w.pool.allocate_many([1], holders="a"),
        InvalidTypeError,
        "ERR-503",
    ),
    (
        "allocate_many: counts a str",
        lambda w: w.pool.allocate_many("12", holders=["a", "b"]),
        InvalidTypeError,
        "ERR-503",
    ),
    (
        "free_many: bad later entry",
        lambda w: w.pool.free_many([w.held[:1], [w.never]], holders=["r", "r"]),
        NotHeldError,
        "POOL-108",
    ),
    (
        "free_many: duplicates across entries",
        lambda w: w.pool.free_many([w.held[:1], w.held[:1]], holders=["r", "r"]),
        NotHeldError,
        "POOL-109",
    ),
    (
        "free_many: holders short",
        lambda w: w.pool.free_many([w.held[:1]], holders=[]),
        InvalidValueError,
        "ERR-506",
    ),
    ("free_many: not a list", lambda w: w.pool.free_many(None, holders=[]), InvalidTypeError, "ERR-503"),
    (
        "free_many: entry wrong type",
        lambda w: w.pool.free_many([w.held[:1], "x"], holders=["r", "r"]),
        InvalidTypeError,
        "ERR-503",
    ),
    (
        "match_many: bad hash",
        lambda w: w.pool.match_many([[1], [-1]], holders=["a", "b"]),
        InvalidValueError,
        "HASH-207",
    ),
    (
        "match_many: holders short",
        lambda w: w.pool.match_many([[1], [1]], holders=["a"]),
        InvalidValueError,
        "ERR-506",
    ),
    # pause, queries
    ("pause: unhashable", lambda w: w.pool.pause([]), InvalidTypeError, "ERR-503"),
    ("resume: unhashable", lambda w: w.pool.resume({}), InvalidTypeError, "ERR-503"),
    ("ref_count: float", lambda w: w.pool.ref_count(1.0), InvalidTypeError, "ERR-503"),
    ("ref_count: bool", lambda w: w.pool.ref_count(True), InvalidTypeError, "ERR-503"),
    ("generation: out of range", lambda w: w.pool.generation(16), BlockIdError, "POOL-103"),
    ("block_state: None", lambda w: w.pool.block_state(None), InvalidTypeError, "ERR-503"),
]


def needs(name: str) -> tuple[str, ...]:
    """Capabilities a case needs, from the operation it exercises and what it touches."""
    op = name.split(":")[0]
    needs = {
        "register": ("prefix-cache",),
        "lookup": ("prefix-cache",),
        "match": ("prefix-cache",),
        "allocate_many": ("batching",),
        "free_many": ("batching",),
        "match_many": ("batching", "prefix-cache"),
        "pause": ("pause",),
        "resume": ("pause",),
    }.get(op, ())
    touches_cache = ("cached", "stale generation", "valid then free")
    if op == "free" and "stale" in name:
        return needs
    if any(t in name for t in touches_cache):
        needs = (*needs, "prefix-cache")
    return needs


def int_kinds() -> list[Callable[[int], object]]:
    kinds: list[Callable[[int], object]] = [np.int64, np.int32, np.uint16, lambda v: np.array(v)]
    try:
        import torch
    except ImportError:
        return kinds
    kinds.append(lambda v: torch.tensor(v))
    kinds.append(lambda v: torch.tensor(v, dtype=torch.int32))
    return kinds
