"""kvref's event index answers chains per cache (PFX-328) and refuses what no conforming cache sends,
naming the rule and changing nothing (PFX-324, ERR-503)."""

from __future__ import annotations

from typing import Any

import pytest

from kvref.contract.errors import BlockStateError, InvalidTypeError, KVRefError
from kvref.contract.event_index import EventIndex, IndexedBlock
from kvref.oracle.event_index import OracleEventIndex

A = IndexedBlock(11, (0, 1))
B = IndexedBlock(12, (2, 3))


def index_holding_a_chain() -> OracleEventIndex:
    index = OracleEventIndex()
    index.store(0, [A, B], None)
    return index


@pytest.mark.rule("PFX-328")
def test_kvrefs_event_index_speaks_the_protocol() -> None:
    assert isinstance(OracleEventIndex(), EventIndex)


@pytest.mark.rule("PFX-328")
def test_a_chain_is_answered_per_cache_up_to_its_first_missing_block() -> None:
    index = index_holding_a_chain()
    index.store(1, [A], None)
    assert index.match([A, B]) == {0: 2, 1: 1}
    index.remove(0, [A.hash])
    assert index.match([A, B]) == {1: 1}, "a cache without the first block is left out"
    assert index.held(0) == {B.hash: 1}, "a removed parent leaves its child held"


@pytest.mark.rule("PFX-324", "ERR-501", "ERR-503")
@pytest.mark.parametrize(
    ("call", "error", "rule_id"),
    [
        (lambda index: index.store(0, [IndexedBlock(13, (4, 5))], 99), BlockStateError, "PFX-324"),
        (lambda index: index.store(1, [IndexedBlock(13, (4, 5))], A.hash), BlockStateError, "PFX-324"),
        (lambda index: index.remove(0, [A.hash, A.hash]), BlockStateError, "PFX-324"),
        (lambda index: index.remove(0, [B.hash, 99]), BlockStateError, "PFX-324"),
        (lambda index: index.remove(2, [A.hash]), BlockStateError, "PFX-324"),
        (lambda index: index.store("0", [A], None), InvalidTypeError, "ERR-503"),
        (lambda index: index.store(0, [(A.hash, [0, 1])], None), InvalidTypeError, "ERR-503"),
        (lambda index: index.store(0, [(A.hash, (0, "1"))], None), InvalidTypeError, "ERR-503"),
        (lambda index: index.store(0, A, None), InvalidTypeError, "ERR-503"),
        (lambda index: index.remove(0, A.hash), InvalidTypeError, "ERR-503"),
        (lambda index: index.match(None), InvalidTypeError, "ERR-503"),
        (lambda index: index.clear(None), InvalidTypeError, "ERR-503"),
    ],
    ids=[
        "store under a parent not held",
        "store under a parent another cache holds",
        "remove more copies than held",
        "remove a held block beside one not held",
        "remove from a cache never named",
        "cache not an int",
        "tokens not a tuple",
        "a token not an int",
        "blocks not a list",
        "hashes not a list",
        "match of None",
        "clear of None",
    ],
)
def test_an_event_no_conforming_cache_sends_is_refused_and_changes_nothing(
    call: Any, error: type[KVRefError], rule_id: str
) -> None:
    index = index_holding_a_chain()
    before = ({c: index.held(c) for c in index.caches()}, index.match([A, B]))
    with pytest.raises(error) as raised:
        call(index)
    assert raised.value.rule == rule_id
    assert ({c: index.held(c) for c in index.caches()}, index.match([A, B])) == before
