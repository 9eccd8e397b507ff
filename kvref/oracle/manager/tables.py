"""Reading the manager's tables: the common prefix of scheduled requests (REQ-718) and REQ-721's invariants."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from kvref.contract.errors import InvariantViolation
from kvref.contract.protocol import PrefixCache
from kvref.contract.requests import Request

__all__ = ["common_prefix_blocks", "verify_tables"]


def common_prefix_blocks(
    tables: Sequence[Sequence[int]], ref_count: Callable[[int], int], num_running: int | None
) -> int:
    """Leading positions where every table holds the same block (REQ-718).

    With ``num_running`` (vLLM's count before 0.32): the leading blocks of the first table whose
    reference count equals ``num_running``, whatever the other tables hold.
    """
    if not tables:
        return 0
    first = tables[0]
    if num_running is not None:
        count = 0
        for block in first:
            if ref_count(block) != num_running:
                break
            count += 1
        return count
    count = 0
    for i, block in enumerate(first):
        if any(len(t) <= i or t[i] != block for t in tables[1:]):
            break
        count += 1
    return count


def verify_tables(
    pool: PrefixCache,
    tables: Mapping[str, list[int]],
    num_cached: Mapping[str, int],
    requests: Mapping[str, Request],
    max_model_len: int,
) -> None:
    """Raise :class:`InvariantViolation` for the first table that breaks REQ-721."""
    caching = "prefix-cache" in pool.capabilities()
    held: Counter[str] = Counter()
    for block in range(pool.num_blocks):
        for holder, count in pool.holders(block).items():
            if isinstance(holder, str):
                held[holder] += count
    for rid, table in tables.items():
        req = requests[rid]
        size = req.block_size
        if len(set(table)) != len(table):
            raise InvariantViolation("REQ-721", f"request {rid!r}: its table {table} names a block twice")
        for block in table:
            if pool.holders(block).get(rid, 0) != 1:
                raise InvariantViolation(
                    "REQ-721",
                    f"request {rid!r}: its table has block {block}, which the pool says it holds "
                    f"{pool.holders(block).get(rid, 0)} times",
                )
        if held[rid] != len(table):
            raise InvariantViolation(
                "REQ-721", f"request {rid!r} holds {held[rid]} references in the pool, its table {len(table)} blocks"
            )
        if req.num_computed_tokens > len(table) * size:
            raise InvariantViolation(
                "REQ-721", f"request {rid!r}: {req.num_computed_tokens} computed tokens, {len(table)} blocks of {size}"
            )
        if len(table) > -(-max_model_len // size):
            raise InvariantViolation(
                "REQ-720", f"request {rid!r}: {len(table)} blocks exceed max_model_len {max_model_len}"
            )
        if not caching:
            continue
        cached = num_cached[rid]
        hashes = req.block_hashes
        for i, block in enumerate(table):
            got = pool.block_hash(block)
            if i < cached and (i >= len(hashes) or got != hashes[i]):
                raise InvariantViolation(
                    "REQ-721",
                    f"request {rid!r}: block {i} (id {block}) is registered under {got}, "
                    f"the request's hash there is {hashes[i] if i < len(hashes) else 'none (beyond its tokens)'}",
                )
            if i >= cached and got is not None:
                raise InvariantViolation(
                    "REQ-710",
                    f"request {rid!r}: block {i} (id {block}) is registered under {got} beyond the "
                    f"{cached} blocks the manager cached: a lookahead or partial block was cached",
                )
    stray = {rid for rid in held if rid not in tables}
    if stray:
        raise InvariantViolation("REQ-721", f"requests {sorted(stray)} hold blocks in the pool but have no table")
