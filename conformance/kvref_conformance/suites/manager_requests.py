"""What a scheduler does to a request, for chapter 07's tests: make, admit and decode it, as vLLM's scheduler does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvref.contract.errors import InvalidValueError, KVRefError
from kvref.contract.manager import KVCacheBlocks
from kvref.contract.requests import Request, RequestStatus
from kvref_conformance.target import Target

__all__ = ["B", "admit", "decode", "new_manager", "prompt", "refused_unchanged"]

B = 4


def prompt(rid: str, tokens: list[int] | range, **extras: Any) -> Request:
    """A request of block size 4."""
    return Request(rid, list(tokens), block_size=B, algorithm="xxh3_64", **extras)


def admit(manager: Any, req: Request, *, lookahead: int = 0) -> KVCacheBlocks | None:
    """Schedule a waiting request's whole prompt as vLLM's scheduler does: hit, allocate, count, mark computed."""
    hits, computed = manager.get_computed_blocks(req)
    new: KVCacheBlocks | None = manager.allocate_slots(
        req,
        req.num_tokens - computed,
        computed,
        hits if computed else None,
        num_lookahead_tokens=lookahead,
        full_sequence_must_fit=True,
    )
    if new is not None:
        manager.record_prefix_cache_stats(req, computed)
        req.num_computed_tokens = req.num_tokens
        req.status = RequestStatus.RUNNING
    return new


def decode(manager: Any, req: Request, token: int, *, lookahead: int = 0) -> KVCacheBlocks | None:
    """Sample ``token`` and schedule it: one new token to compute."""
    req.append_output_token_ids([token])
    new: KVCacheBlocks | None = manager.allocate_slots(req, 1, num_lookahead_tokens=lookahead)
    if new is not None:
        req.num_computed_tokens += 1
    return new


def refused_unchanged(manager: Any, call: Callable[[], Any], rule_id: str) -> KVRefError:
    """``call`` raises InvalidValueError citing ``rule_id`` and changes nothing (ERR-501)."""
    before = (manager.snapshot(), manager.num_free_blocks)
    with pytest.raises(InvalidValueError) as info:
        call()
    assert info.value.rule == rule_id, f"[{rule_id}] raised citing {info.value.rule}: {info.value}"
    after = (manager.snapshot(), manager.num_free_blocks)
    assert after == before, f"[ERR-501] a refused call ({rule_id}) changed the manager's state"
    return info.value


def new_manager(impl: Target, num_blocks: int, **settings: Any) -> Any:
    """A manager of ``impl`` in blocks of 4 tokens, or a skip where it has none under lru (vLLM's free queue)."""
    for needed in ("request-manager", "policy-lru"):
        if not impl.has(needed):
            pytest.skip(f"{impl.name} lacks {needed!r}")
    return impl.create_manager(num_blocks, block_size=B, **settings)
