"""Reading the manager's tables: the common prefix of scheduled requests (REQ-718) and REQ-721's invariants."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from kvref.contract.errors import InvariantViolation
from kvref.contract.manager import NULL_BLOCK
from kvref.contract.protocol import PrefixCache
from kvref.contract.requests import Request
from kvref.oracle.manager.groups import GroupTables

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
            if block == NULL_BLOCK or ref_count(block) != num_running:
                break
            count += 1
        return count
    count = 0
    for i, block in enumerate(first):
        if block == NULL_BLOCK or any(len(t) <= i or t[i] != block for t in tables[1:]):
            break  # the null block is never held (REQ-730), so never shared
        count += 1
    return count


def verify_tables(
    pool: PrefixCache, groups: Sequence[GroupTables], requests: Mapping[str, Request], max_model_len: int
) -> None:
    """Raise :class:`InvariantViolation` for the first table that breaks REQ-721 (or REQ-710, REQ-720, REQ-730)."""
    held: Counter[str] = Counter()
    for block in range(pool.num_blocks):
        for holder, count in pool.holders(block).items():
            if isinstance(holder, str):
                held[holder] += count
    listed: Counter[str] = Counter()
    for g in groups:
        for rid, table in g.tables.items():
            listed[rid] += sum(1 for b in table if b != NULL_BLOCK)
            _verify_table(pool, g, rid, table, requests[rid], max_model_len)
    for rid in set(held) | set(listed):
        if held[rid] != listed[rid]:
            raise InvariantViolation(
                "REQ-721", f"request {rid!r} holds {held[rid]} references in the pool, its tables {listed[rid]} blocks"
            )


def _verify_table(pool: PrefixCache, g: GroupTables, rid: str, table: list[int], req: Request, limit: int) -> None:
    size = g.block_size
    nulls = next((i for i, b in enumerate(table) if b != NULL_BLOCK), len(table))
    if any(b == NULL_BLOCK for b in table[nulls:]) or (nulls and g.is_full):
        raise InvariantViolation("REQ-730", f"request {rid!r}, group {g.index}: null blocks {table} not only leading")
    if nulls > g.skipped_blocks(req.num_computed_tokens):
        raise InvariantViolation(
            "REQ-730",
            f"request {rid!r}, group {g.index}: {nulls} null blocks in {table}, but {req.num_computed_tokens} computed "
            f"tokens leave only {g.skipped_blocks(req.num_computed_tokens)} blocks behind the window",
        )
    real = table[nulls:]
    if len(set(real)) != len(real):
        raise InvariantViolation("REQ-721", f"request {rid!r}, group {g.index}: its table {table} names a block twice")
    for block in real:
        if pool.holders(block).get(rid, 0) != 1:
            raise InvariantViolation(
                "REQ-721",
                f"request {rid!r}, group {g.index}: its table has block {block}, which the pool says it holds "
                f"{pool.holders(block).get(rid, 0)} times",
            )
    if req.num_computed_tokens > len(table) * size:
        raise InvariantViolation(
            "REQ-721", f"request {rid!r}: {req.num_computed_tokens} computed tokens, {len(table)} blocks of {size}"
        )
    if len(table) > -(-limit // size):
        raise InvariantViolation("REQ-720", f"request {rid!r}: {len(table)} blocks exceed max_model_len {limit}")
    if "prefix-cache" not in pool.capabilities():
        return
    cached = g.num_cached[rid]
    keys = g.keys(req)
    if cached > min(len(table), max(len(keys), nulls)):
        raise InvariantViolation(
            "REQ-710",
            f"request {rid!r}, group {g.index}: {cached} blocks counted cached, {len(keys)} full blocks exist",
        )
    # Below, i < cached implies i < len(keys): otherwise cached <= max(len(keys), nulls) <= i.
    for i in range(nulls, len(table)):
        got = pool.block_hash(table[i])
        if i < cached and got != keys[i]:
            raise InvariantViolation(
                "REQ-721",
                f"request {rid!r}, group {g.index}: block {i} (id {table[i]}) is registered under {got}, "
                f"the request's key there is {keys[i]}",
            )
        if i >= cached and got is not None:
            raise InvariantViolation(
                "REQ-710",
                f"request {rid!r}, group {g.index}: block {i} (id {table[i]}) is registered under {got} beyond "
                f"the {cached} blocks the manager cached: a lookahead or partial block was cached",
            )
