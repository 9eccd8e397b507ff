"""Chapter 02, block hashing: full blocks, chaining, canonical bytes, tagged extra keys."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvref.contract.errors import InvalidTypeError, InvalidValueError
from kvref.contract.hashing import (
    ALGORITHMS,
    ROOT_HASH,
    BlockExtraKeys,
    BlockHasher,
    MultimodalItem,
    block_extra_keys,
    encode_block,
    hash_block,
    hash_token_blocks,
)

rule = pytest.mark.rule
tokens_st = st.lists(st.integers(0, 2**31), min_size=0, max_size=80)


@rule("HASH-201")
def test_only_full_blocks_get_a_hash() -> None:
    assert len(hash_token_blocks(list(range(47)), 16)) == 2, "47 tokens in blocks of 16: two full blocks"
    assert hash_token_blocks(list(range(15)), 16) == []
    with pytest.raises(InvalidValueError):
        hash_block(ROOT_HASH, [])


@rule("HASH-201")
@given(tokens=tokens_st, cut=st.integers(0, 80))
def test_hashing_is_the_same_however_tokens_arrive(tokens: list[int], cut: int) -> None:
    hasher = BlockHasher(4)
    got = hasher.extend(tokens[:cut]) + hasher.extend(tokens[cut:])
    assert got == hash_token_blocks(tokens, 4)
    assert hasher.hashes == got


@rule("HASH-202")
def test_hashes_are_chained_from_the_fixed_root() -> None:
    toks = list(range(32))
    h0, h1 = hash_token_blocks(toks, 16)
    assert h0 == hash_block(ROOT_HASH, toks[:16])
    assert h1 == hash_block(h0, toks[16:]), "block 1 must be hashed with block 0's hash as parent"
    assert hash_token_blocks([99, *toks[1:]], 16)[1] != h1, "a change in block 0 must change block 1's hash"


@rule("HASH-203")
def test_the_hashed_bytes_are_canonical_cbor_of_parent_tokens_and_tagged_extras() -> None:
    extra = BlockExtraKeys(adapter="lora-a", cache_salt="s")
    data = encode_block(5, [1, 2, 3], extra)
    assert cbor2.loads(data) == [5, [1, 2, 3], {1: "lora-a", 2: "s"}]
    assert data == cbor2.dumps([5, [1, 2, 3], {2: "s", 1: "lora-a"}], canonical=True)
    assert encode_block(5, [1, 2, 3]) == cbor2.dumps([5, [1, 2, 3], {}], canonical=True)


@rule("HASH-203")
@given(
    parent=st.integers(0, 2**63 - 1),
    tokens=st.lists(st.integers(0, 2**40), min_size=1, max_size=20),
    adapter=st.one_of(st.none(), st.text(max_size=8), st.integers(0, 2**40)),
    salt=st.one_of(st.none(), st.text(max_size=8)),
    mm=st.lists(st.tuples(st.text(min_size=1, max_size=6), st.integers(-(2**20), 2**20)), max_size=3),
)
def test_the_encoding_is_core_deterministic_cbor(
    parent: int, tokens: list[int], adapter: str | int | None, salt: str | None, mm: list[tuple[str, int]]
) -> None:
    extra = BlockExtraKeys(adapter=adapter, cache_salt=salt, multimodal=tuple(mm))
    want = cbor2.dumps([parent, tokens, extra.to_cbor_map()], canonical=True)
    assert encode_block(parent, tokens, extra) == want


@rule("HASH-203")
@pytest.mark.parametrize("bad", [[-1], [1.0], ["a"], [True], None, "abc"])
def test_token_ids_must_be_non_negative_integers(bad: object) -> None:
    with pytest.raises((InvalidTypeError, InvalidValueError)):
        hash_block(ROOT_HASH, bad)  # type: ignore[arg-type]


@rule("HASH-204")
def test_the_cache_salt_enters_the_first_block_only() -> None:
    assert block_extra_keys(0, 16, cache_salt="tenant").cache_salt == "tenant"
    assert block_extra_keys(1, 16, cache_salt="tenant").cache_salt is None
    salted = hash_token_blocks(list(range(32)), 16, cache_salt="tenant")
    plain = hash_token_blocks(list(range(32)), 16)
    assert salted[0] != plain[0] and salted[1] != plain[1], "the salt isolates the whole chain via block 0"
    assert salted[1] == hash_block(salted[0], list(range(16, 32))), "block 1 carries no salt of its own"


@rule("HASH-205")
def test_an_adapter_named_like_a_salt_never_collides_with_it() -> None:
    toks = list(range(16))
    as_adapter = hash_token_blocks(toks, 16, adapter="x")
    as_salt = hash_token_blocks(toks, 16, cache_salt="x")
    as_mm = hash_token_blocks(toks, 16, multimodal=[MultimodalItem("x", 0, 4)])
    assert len({as_adapter[0], as_salt[0], as_mm[0]}) == 3, "untagged extra keys collide across fields"


@rule("HASH-205")
@given(
    a=st.one_of(st.none(), st.text(max_size=4)),
    s=st.one_of(st.none(), st.text(max_size=4)),
    b=st.one_of(st.none(), st.text(max_size=4)),
    t=st.one_of(st.none(), st.text(max_size=4)),
)
def test_different_extra_keys_never_encode_alike(a: str | None, s: str | None, b: str | None, t: str | None) -> None:
    x, y = BlockExtraKeys(adapter=a, cache_salt=s), BlockExtraKeys(adapter=b, cache_salt=t)
    if (a, s) != (b, t):
        assert encode_block(1, [1], x) != encode_block(1, [1], y), f"{x} and {y} encode alike"


@rule("HASH-210")
def test_multimodal_items_enter_each_overlapping_block_with_their_offset() -> None:
    item = MultimodalItem("img-1", start=12, length=10)  # tokens 12..21
    assert block_extra_keys(0, 16, multimodal=[item]).multimodal == (("img-1", 12),)
    assert block_extra_keys(1, 16, multimodal=[item]).multimodal == (("img-1", -4),)
    assert block_extra_keys(2, 16, multimodal=[item]).multimodal == ()
    moved = MultimodalItem("img-1", start=13, length=9)
    assert hash_token_blocks(list(range(32)), 16, multimodal=[item]) != hash_token_blocks(
        list(range(32)), 16, multimodal=[moved]
    ), "the same image at another offset must hash differently"


@rule("HASH-211")
def test_the_adapter_enters_every_block() -> None:
    for i in range(3):
        assert block_extra_keys(i, 16, adapter="lora").adapter == "lora"
    base = hash_token_blocks(list(range(48)), 16)
    lora = hash_token_blocks(list(range(48)), 16, adapter="lora")
    assert all(x != y for x, y in zip(base, lora, strict=True))


@rule("HASH-206")
def test_the_default_hash_is_stable_across_processes_and_hash_seeds() -> None:
    code = "from kvref.contract.hashing import hash_token_blocks as h; print(h(list(range(40)), 16, cache_salt='s'))"
    outputs = set()
    for seed in ("0", "1", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        outputs.add(out.stdout.strip())
    assert len(outputs) == 1, f"hashes differ across processes: {outputs}"
    assert outputs.pop() == str(hash_token_blocks(list(range(40)), 16, cache_salt="s"))


@rule("HASH-206")
def test_the_default_hash_has_a_pinned_value() -> None:
    # A change here breaks every stored hash and event consumer: it needs a new root version.
    assert ROOT_HASH == 0x2A85FDA212BF0E9D, f"ROOT_HASH changed to {ROOT_HASH:#x}"
    assert hash_block(ROOT_HASH, [1, 2, 3, 4]) == 0x15C655DA6C5AFA57
    assert hash_block(ROOT_HASH, [1, 2, 3, 4], algorithm="xxh3_64") == 0x4A6524291C0580C4


@rule("HASH-207")
@given(tokens=st.lists(st.integers(0, 2**40), min_size=1, max_size=16), algo=st.sampled_from(sorted(ALGORITHMS)))
def test_every_hash_lies_in_the_63_bit_range(tokens: list[int], algo: str) -> None:
    h = hash_block(ROOT_HASH, tokens, algorithm=algo)
    assert 0 <= h < 2**63


@rule("HASH-208")
def test_xxh3_is_offered_and_differs_from_sha256() -> None:
    toks = list(range(16))
    assert hash_token_blocks(toks, 16, algorithm="xxh3_64") != hash_token_blocks(toks, 16)


@rule("HASH-209")
def test_an_unknown_hash_function_name_raises_and_lists_the_known_ones() -> None:
    with pytest.raises(InvalidValueError) as info:
        hash_block(ROOT_HASH, [1], algorithm="md5")
    assert "sha256" in str(info.value) and info.value.rule == "HASH-209"
    with pytest.raises(InvalidValueError):
        BlockHasher(16, algorithm="builtin")


@rule("HASH-210")
def test_multimodal_items_given_as_an_iterator_are_not_lost() -> None:
    items = [MultimodalItem("img-A", 0, 4)]
    assert hash_token_blocks(list(range(8)), 4, multimodal=iter(items)) == hash_token_blocks(
        list(range(8)), 4, multimodal=items
    )
    assert hash_token_blocks(list(range(8)), 4, multimodal=items) != hash_token_blocks(list(range(8)), 4)


@rule("HASH-210")
def test_the_order_in_which_items_are_listed_does_not_matter() -> None:
    a, b = MultimodalItem("img-A", 0, 2), MultimodalItem("img-B", 2, 2)
    assert hash_token_blocks(list(range(8)), 4, multimodal=[a, b]) == hash_token_blocks(
        list(range(8)), 4, multimodal=[b, a]
    )


@rule("HASH-203")
def test_token_arrays_are_accepted_like_lists() -> None:
    import numpy as np

    assert hash_token_blocks(np.arange(8), 4) == hash_token_blocks(list(range(8)), 4)


@rule("HASH-205")
@pytest.mark.parametrize(
    "make",
    [
        lambda: BlockExtraKeys(adapter=True),
        lambda: BlockExtraKeys(adapter=1.0),  # type: ignore[arg-type]
        lambda: BlockExtraKeys(cache_salt=5),  # type: ignore[arg-type]
        lambda: BlockExtraKeys(multimodal=(("x", 1.5),)),  # type: ignore[arg-type]
        lambda: hash_block(ROOT_HASH, [1], {"adapter": "x"}),  # type: ignore[arg-type]
        lambda: hash_token_blocks([1, 2], 1, multimodal=None),  # type: ignore[arg-type]
        lambda: hash_token_blocks([1, 2], 1, multimodal=MultimodalItem("x", 0, 1)),  # type: ignore[arg-type]
        lambda: MultimodalItem(3, 0, 1),  # type: ignore[arg-type]
    ],
)
def test_extra_keys_of_the_wrong_type_are_refused(make: Any) -> None:
    with pytest.raises(InvalidTypeError):
        make()


@rule("HASH-209")
@pytest.mark.parametrize("algorithm", [[], None, 3])
def test_an_algorithm_that_is_not_a_name_is_refused_as_unknown(algorithm: Any) -> None:
    with pytest.raises(InvalidValueError):
        hash_block(ROOT_HASH, [1], algorithm=algorithm)
    with pytest.raises(InvalidValueError):
        BlockHasher(4, algorithm=algorithm)
