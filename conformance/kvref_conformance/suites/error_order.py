"""Chapter 05's order of checks (ERR-509): when one call breaks several rules, the first check wins.

Each case breaks two (or more) checks of :data:`kvref.contract.checks.ORDER_OF_CHECKS` at once and
must raise the error of the one listed first, leaving the state as it was (ERR-501). Entry-by-entry
checks run in list order, so a case also swaps the entries: the entry that comes first wins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvref.contract.errors import (
    BlockIdError,
    BlockStateError,
    HashConflictError,
    InvalidTypeError,
    InvalidValueError,
    KVRefError,
    NotHeldError,
    PausedHolderError,
    StaleBlockError,
    UnknownHashError,
)
from kvref_conformance.suites.bad_inputs import World, make_world
from kvref_conformance.suites.base import ConformanceSuite, fails_unchanged, rule, skip_without
from kvref_conformance.target import Target

__all__ = ["ORDER_CASES", "ErrorOrderSuite"]

#: (name, what it needs, the call, the error and rule of the first check it breaks). A case that
#: needs ``pause`` finds holder ``"p"`` paused.
OrderCase = tuple[str, tuple[str, ...], Callable[[World], Any], type[KVRefError], str]


def _stale(w: World, b: int) -> int:
    return int(w.pool.generation(b)) + 1


ORDER_CASES: list[OrderCase] = [
    # free: types, generation types, pairs, stale, then entry by entry (range, reserved, held), then duplicates
    (
        "free: a wrong type beats an id out of range",
        (),
        lambda w: w.pool.free([16, 1.5], holder="r"),
        InvalidTypeError,
        "ERR-503",
    ),
    (
        "free: unpaired generations beat a stale one",
        (),
        lambda w: w.pool.free(w.held[:2], holder="r", generations=[99]),
        InvalidValueError,
        "ERR-506",
    ),
    (
        "free: a stale generation beats an id out of range",
        (),
        lambda w: w.pool.free([w.held[0], 16], holder="r", generations=[_stale(w, w.held[0]), 0]),
        StaleBlockError,
        "POOL-112",
    ),
    (
        "free: list order, a block not held before an id out of range",
        (),
        lambda w: w.pool.free([w.never, 16], holder="r"),
        NotHeldError,
        "POOL-108",
    ),
    (
        "free: list order, an id out of range before a block not held",
        (),
        lambda w: w.pool.free([16, w.never], holder="r"),
        BlockIdError,
        "POOL-103",
    ),
    (
        "free: a block not held beats a duplicate beyond references",
        (),
        lambda w: w.pool.free([w.held[1], w.held[1], w.never], holder="r"),
        NotHeldError,
        "POOL-108",
    ),
    # acquire: types, paused, generation types, pairs, stale, then entry by entry (range, reserved, free)
    (
        "acquire: a paused holder beats an id out of range",
        ("pause",),
        lambda w: w.pool.acquire([16], holder="p"),
        PausedHolderError,
        "POOL-114",
    ),
    (
        "acquire: unpaired generations beat an id out of range",
        (),
        lambda w: w.pool.acquire([16], holder="r", generations=[1, 2]),
        InvalidValueError,
        "ERR-506",
    ),
    (
        "acquire: a stale generation beats a free block",
        (),
        lambda w: w.pool.acquire([w.held[0], w.never], holder="r", generations=[_stale(w, w.held[0]), 0]),
        StaleBlockError,
        "POOL-112",
    ),
    (
        "acquire: list order, a free block before an id out of range",
        (),
        lambda w: w.pool.acquire([w.never, 16], holder="r"),
        BlockStateError,
        "POOL-119",
    ),
    (
        "acquire: list order, an id out of range before a free block",
        (),
        lambda w: w.pool.acquire([16, w.never], holder="r"),
        BlockIdError,
        "POOL-103",
    ),
    # allocate: types, negative count, paused, then availability
    (
        "allocate: a negative count beats a paused holder",
        ("pause",),
        lambda w: w.pool.allocate(-1, holder="p"),
        InvalidValueError,
        "ERR-504",
    ),
    (
        "allocate: a paused holder beats asking for too many",
        ("pause",),
        lambda w: w.pool.allocate(1000, holder="p"),
        PausedHolderError,
        "POOL-114",
    ),
    # register: types, pairs, parent type, parent resident, a block twice, then position by position
    (
        "register: unpaired hashes beat an unknown parent",
        ("prefix-cache",),
        lambda w: w.pool.register(w.held[1:2], [7, 8], parent_hash=999),
        InvalidValueError,
        "ERR-506",
    ),
    (
        "register: an unknown parent beats a block listed twice",
        ("prefix-cache",),
        lambda w: w.pool.register([w.held[1], w.held[1]], [7, 8], parent_hash=999),
        UnknownHashError,
        "PFX-304",
    ),
    (
        "register: a block listed twice beats a free block",
        ("prefix-cache",),
        lambda w: w.pool.register([w.never, w.never], [7, 8]),
        HashConflictError,
        "PFX-303",
    ),
    (
        "register: list order, a free block before a registered one",
        ("prefix-cache",),
        lambda w: w.pool.register([w.never, w.held[0]], [7, 8]),
        BlockStateError,
        "PFX-302",
    ),
    (
        "register: list order, a registered block before a free one",
        ("prefix-cache",),
        lambda w: w.pool.register([w.held[0], w.never], [7, 8]),
        HashConflictError,
        "PFX-303",
    ),
    (
        "register: a registered block beats a parent conflict",
        ("prefix-cache",),
        lambda w: w.pool.register(w.held[:1], [2]),
        HashConflictError,
        "PFX-303",
    ),
    # match: types before paused
    (
        "match: a wrong type beats a paused holder",
        ("prefix-cache", "pause"),
        lambda w: w.pool.match("abc", holder="p"),
        InvalidTypeError,
        "ERR-503",
    ),
    # batched forms
    (
        "allocate_many: a negative count beats unpaired holders",
        ("batching",),
        lambda w: w.pool.allocate_many([1, -1], holders=["a"]),
        InvalidValueError,
        "ERR-504",
    ),
    (
        "free_many: the first holder's entries are checked first",
        ("batching",),
        lambda w: w.pool.free_many([[16], [w.never]], holders=["x", "r"]),
        BlockIdError,
        "POOL-103",
    ),
    (
        "free_many: one holder's entries in order, a block not held first",
        ("batching",),
        lambda w: w.pool.free_many([[w.never], [16]], holders=["r", "r"]),
        NotHeldError,
        "POOL-108",
    ),
]


class ErrorOrderSuite(ConformanceSuite):
    """ERR-509 for an implementation that declares ``error-order``: the first check broken wins."""

    @rule("ERR-509", "ERR-501")
    @pytest.mark.parametrize(
        ("name", "needs", "call", "error", "rule_id"), ORDER_CASES, ids=[c[0] for c in ORDER_CASES]
    )
    def test_the_first_check_broken_names_the_error(
        self,
        impl: Target,
        name: str,
        needs: tuple[str, ...],
        call: Callable[[World], Any],
        error: type[KVRefError],
        rule_id: str,
    ) -> None:
        for capability in ("error-order", *needs):
            skip_without(impl, capability)
        world = make_world(impl)
        if "pause" in needs:
            world.pool.pause("p")
        fails_unchanged(world.pool, lambda: call(world), error, rule_id)
