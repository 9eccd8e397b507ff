"""A request's hashes and shape (REQ-702): the contract's Request class."""

from __future__ import annotations

import pytest

from kvref.contract.errors import InvalidTypeError, InvalidValueError
from kvref.contract.hashing import hash_token_blocks
from kvref.contract.requests import Request


@pytest.mark.rule("REQ-702")
def test_hashes_do_not_depend_on_how_the_tokens_arrived() -> None:
    whole = Request("a", list(range(11)), block_size=4, cache_salt="s")
    parts = Request("b", [0, 1, 2], block_size=4, cache_salt="s")
    for t in range(3, 11):
        parts.append_output_token_ids([t])
    assert parts.block_hashes == whole.block_hashes == hash_token_blocks(list(range(11)), 4, cache_salt="s"), (
        "[REQ-702] the hashes of 11 tokens appended one by one differ from those of the same prompt"
    )
    assert (parts.num_tokens, parts.num_prompt_tokens, parts.block_token_ids(1)) == (11, 3, (4, 5, 6, 7))


@pytest.mark.rule("REQ-702")
def test_a_request_without_tokens_or_with_a_bad_id_is_refused() -> None:
    with pytest.raises(InvalidValueError):
        Request("a", [], block_size=4)
    with pytest.raises(InvalidTypeError):
        Request(7, [1], block_size=4)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError):
        Request("a", [1, -2], block_size=4)
    with pytest.raises(InvalidValueError):
        Request("a", [1], block_size=0)
