"""The SGLang event translator (peers/sglang_events.py) on SGLang-shaped events, without SGLang installed.

SGLang's recorder joins the pages of one chain into one ``BlockStored`` and consecutive removals
into one ``BlockRemoved``; the translator must give back one kvref event per page, hashed from
the page's tokens as RADIX-635 says, and must make a hash SGLang never stored visible.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kvref.contract.events import AllBlocksCleared, BlockRemoved
from kvref.contract.events import BlockStored as Stored
from kvref.contract.hashing import ROOT_HASH, BlockExtraKeys, hash_block
from kvref_conformance.peers.sglang_events import SglangEventTranslator, unknown

rule = pytest.mark.rule


@dataclass
class BlockStored:  # named as SGLang's event: the translator reads the type's name and these fields
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    cache_salt: str | None = None
    block_size: int = 1


@dataclass
class SglangRemoved:
    block_hashes: list[int] = field(default_factory=list)


SglangRemoved.__name__ = "BlockRemoved"  # SGLang's class name, which the translator reads


class NoEvents:
    """A stand-in for SGLang's cache: the translator takes its constructor's events once."""

    def take_events(self) -> list[object]:
        return []


def new_translator(page: int) -> SglangEventTranslator:
    return SglangEventTranslator(page, NoEvents())


def chain(tokens: list[int], page: int, salt: str | None = None) -> list[int]:
    """RADIX-635's hashes of ``tokens``' pages from a namespace's root (salted as RADIX-636 says)."""
    out: list[int] = []
    for start in range(0, len(tokens), page):
        extra = BlockExtraKeys(cache_salt=salt) if salt is not None and not out else None
        out.append(hash_block(out[-1] if out else ROOT_HASH, tokens[start : start + page], extra))
    return out


@rule("RADIX-635")
@pytest.mark.parametrize("page", [1, 2])
def test_a_joined_store_becomes_one_chained_event_per_page(page: int) -> None:
    tokens = list(range(10, 10 + 3 * page))
    got = new_translator(page).translate([BlockStored([111, 222, 333], None, tokens)])
    want = chain(tokens, page)
    assert got == [Stored(h, p) for h, p in zip(want, [None, *want[:-1]], strict=True)], (
        f"a store of 3 joined pages of {page} translated to {got}; RADIX-635 wants {want} chained from None"
    )


@rule("RADIX-635", "RADIX-636")
def test_a_store_under_a_known_parent_chains_on_its_kvref_hash_and_a_salt_only_starts_a_chain() -> None:
    translator = new_translator(1)
    translator.translate([BlockStored([1], None, [5], cache_salt="'a'")])
    got = translator.translate([BlockStored([2], 1, [6], cache_salt="'a'")])
    want = chain([5, 6], 1, "'a'")
    assert got == [Stored(want[1], want[0])], (
        f"a page stored under SGLang's hash 1 translated to {got}; RADIX-635 chains it as {want[1]} on {want[0]}"
    )


@rule("RADIX-634")
def test_removals_name_the_stored_pages_and_an_unknown_hash_stays_visible() -> None:
    translator = new_translator(1)
    translator.translate([BlockStored([1, 2], None, [5, 6])])
    got = translator.translate([SglangRemoved([2, 1, 99]), type("AllBlocksCleared", (), {})()])
    want = chain([5, 6], 1)
    assert got == [BlockRemoved(want[1]), BlockRemoved(want[0]), BlockRemoved(unknown(99)), AllBlocksCleared()], (
        f"removing SGLang's pages 2, 1 and a never-stored 99 translated to {got}"
    )
    assert unknown(99) < 0, "an unknown hash must never equal a chapter-02 hash, which is never negative"


@rule("RADIX-634")
def test_a_store_whose_hashes_and_pages_disagree_is_passed_on_untranslated() -> None:
    odd = BlockStored([1, 2], None, [5, 6, 7])  # three pages of 1 under two hashes
    got = new_translator(1).translate([odd])
    assert got[-1] is odd, f"a store of 3 pages under 2 hashes translated to {got}; it must stay visible as SGLang's"
