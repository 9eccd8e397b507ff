"""The manager's argument checks that need the pool: counts of tokens and the hits a scheduler hands back (REQ-712)."""

from __future__ import annotations

from kvref.contract.errors import InvalidTypeError, InvalidValueError
from kvref.contract.manager import KVCacheBlocks
from kvref.contract.protocol import PrefixCache
from kvref.contract.requests import Request
from kvref.contract.validate import as_int

__all__ = ["checked_hits", "token_count"]


def token_count(value: object, op: str, arg: str) -> int:
    """A non-negative count of tokens, or the REQ-712 error naming ``op`` and ``arg``."""
    count = as_int(value, op=op, arg=arg, rule="REQ-712")
    if count < 0:
        raise InvalidValueError("REQ-712", f"{op}: {arg} must be >= 0, got {count}")
    return count


def checked_hits(
    pool: PrefixCache,
    req: Request,
    new_computed_blocks: object,
    num_new_computed: int,
    *,
    holds: bool,
    bound: int,
    op: str,
) -> list[int]:
    """The hits of ``new_computed_blocks`` if they are what ``get_computed_blocks`` finds for ``req`` (REQ-712).

    They must be one group of blocks cached under the request's leading hashes, at most ``bound``
    of them (REQ-701, REQ-705), given to a request that holds nothing yet (``holds`` false), and
    ``num_new_computed`` must be the tokens they cover.
    """
    if new_computed_blocks is None:
        hits: list[int] = []
    elif not isinstance(new_computed_blocks, KVCacheBlocks) or len(new_computed_blocks.blocks) != 1:
        raise InvalidTypeError("REQ-712", f"{op}: new_computed_blocks must be a KVCacheBlocks of one group")
    else:
        hits = list(new_computed_blocks.blocks[0])
    rid, size, n = req.request_id, req.block_size, req.num_tokens
    if hits and holds:
        raise InvalidValueError("REQ-712", f"{op}: request {rid!r} already holds blocks; hits join only an empty table")
    if len(hits) > bound:
        raise InvalidValueError(
            "REQ-701", f"{op}: {len(hits)} hits for {n} tokens in blocks of {size}; at most {bound} may hit"
        )
    hashes = req.block_hashes
    for i, block in enumerate(hits):
        got = pool.block_hash(block)
        if got is None or got != hashes[i]:
            raise InvalidValueError(
                "REQ-712", f"{op}: hit {i} (block {block}) is not cached under request {rid!r}'s hash for block {i}"
            )
    want = min(len(hits) * size, n - 1) if hits else 0
    if num_new_computed != want:
        raise InvalidValueError(
            "REQ-712", f"{op}: num_new_computed_tokens={num_new_computed}, the {len(hits)} hits cover {want} tokens"
        )
    return hits
