"""The manager's checks: its KV cache groups (REQ-730, REQ-757) and the hits a scheduler hands back (REQ-712)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

from kvref.contract.errors import ConfigError, InvalidTypeError, InvalidValueError
from kvref.contract.manager import NULL_BLOCK, CacheGroup, KVCacheBlocks
from kvref.contract.protocol import PrefixCache
from kvref.contract.requests import Request
from kvref.oracle.manager.groups import GroupTables

__all__ = ["checked_hits", "checked_setup"]


def checked_setup(
    pool: PrefixCache | Sequence[PrefixCache],
    groups: object,
    *,
    enable_caching: bool,
    enable_kv_cache_events: bool,
    use_eagle: bool,
    last_block: str,
) -> tuple[tuple[CacheGroup, ...], list[PrefixCache]]:
    """The groups, and the pool each draws from, of a new manager; ConfigError naming the rule otherwise.

    ``groups`` is one or more CacheGroup (REQ-730). ``pool`` is one pool for every group, or a
    sequence of one pool per group (REQ-735). A sliding-window or mamba group needs its pool's block 0
    reserved (the null block) and neither EAGLE nor ``last_block="share"`` (REQ-730, REQ-757). Each
    pool holds nothing yet (REQ-721), is a prefix cache when caching (REQ-704) and records events
    when the manager reports them (REQ-717).
    """
    op = "RequestManager"
    specs = tuple(groups) if isinstance(groups, Iterable) and not isinstance(groups, (str, bytes)) else ()
    if not specs or not all(isinstance(g, CacheGroup) for g in specs):
        raise ConfigError("REQ-730", f"{op}: groups must be one or more CacheGroup")
    pools: list[PrefixCache] = list(pool) if isinstance(pool, (list, tuple)) else [cast(PrefixCache, pool)] * len(specs)
    if len(pools) != len(specs):
        raise ConfigError("REQ-735", f"{op}: {len(pools)} pools for {len(specs)} groups; give one pool per group")
    for spec, group_pool in zip(specs, pools, strict=True):
        if spec.window_tokens is not None and NULL_BLOCK not in group_pool.reserved_ids:
            raise ConfigError(
                "REQ-730", f"{op}: a sliding-window or mamba group needs block 0 reserved in its pool (the null block)"
            )
    if any(g.window_tokens is not None for g in specs) and (use_eagle or last_block != "recompute"):
        raise ConfigError(
            "REQ-730", f"{op}: EAGLE and last_block='share' are not specified with a sliding-window or mamba group"
        )
    for each in {id(p): p for p in pools}.values():
        if enable_caching and "prefix-cache" not in each.capabilities():
            raise ConfigError("REQ-704", f"{op}: caching needs a pool with the prefix-cache capability")
        if enable_kv_cache_events and not (enable_caching and "events" in each.capabilities()):
            raise ConfigError("REQ-717", f"{op}: events need caching and a pool with events on")
        if enable_kv_cache_events and getattr(each, "events_enabled", True) is False:
            raise ConfigError(
                "REQ-717", f"{op}: events are asked for but the pool records none; make it with enable_events=True"
            )
        if each.num_in_use:
            raise ConfigError("REQ-721", f"{op}: the pool already has {each.num_in_use} blocks in use")
    return specs, pools


def checked_hits(
    req: Request,
    new_computed_blocks: object,
    num_new_computed: int,
    *,
    groups: Sequence[GroupTables],
    holds: bool,
    bound: int,
    op: str,
) -> list[list[int]]:
    """The hits of ``new_computed_blocks``, one list per group, if they are what ``get_computed_blocks``
    finds for ``req`` (REQ-712).

    They must be one list per group, all of one length, at most ``bound`` (REQ-701, REQ-705), each
    block cached under its group's key for its position (a sliding window's null block aside),
    given to a request that holds nothing yet (``holds`` false), and ``num_new_computed`` must be
    the tokens they cover.
    """
    if new_computed_blocks is None:
        if num_new_computed:
            raise InvalidValueError(
                "REQ-712", f"{op}: num_new_computed_tokens={num_new_computed} with no new_computed_blocks"
            )
        return [[] for _ in groups]
    if not isinstance(new_computed_blocks, KVCacheBlocks) or len(new_computed_blocks.blocks) != len(groups):
        raise InvalidTypeError(
            "REQ-712", f"{op}: new_computed_blocks must be a KVCacheBlocks of {len(groups)} group(s)"
        )
    hits = [list(group) for group in new_computed_blocks.blocks]
    rid, size, n = req.request_id, req.block_size, req.num_tokens
    length = len(hits[0])
    if any(len(h) != length for h in hits):
        raise InvalidValueError("REQ-712", f"{op}: the groups' hits differ in length: {[len(h) for h in hits]}")
    if length and holds:
        raise InvalidValueError("REQ-712", f"{op}: request {rid!r} already holds blocks; hits join only an empty table")
    if length > bound:
        raise InvalidValueError(
            "REQ-701", f"{op}: {length} hits for {n} tokens in blocks of {size}; at most {bound} may hit"
        )
    for g, group_hits in zip(groups, hits, strict=True):
        if not g.is_hit_honest(g.keys(req), group_hits):
            raise InvalidValueError(
                "REQ-712", f"{op}: group {g.index}'s hits {group_hits} are not cached under request {rid!r}'s keys"
            )
    want = min(length * size, n - 1) if length else 0
    if num_new_computed != want:
        raise InvalidValueError(
            "REQ-712", f"{op}: num_new_computed_tokens={num_new_computed}, the {length} hits cover {want} tokens"
        )
    return hits
