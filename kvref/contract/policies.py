"""Eviction policy names (spec chapter 04, EVICT-4xx)."""

from __future__ import annotations

from enum import StrEnum

from kvref.contract.errors import InvalidTypeError, InvalidValueError

__all__ = ["EvictionPolicy", "as_policy"]


class EvictionPolicy(StrEnum):
    """Which cached block leaves first when room is needed.

    ``LRU`` (EVICT-401): the block released longest ago; within one ``free`` call, earlier
    positions count as released earlier, so a caller passing a request's blocks tail first has the
    tail evicted before the head. ``LRU_LEAF`` (EVICT-403): like ``LRU`` but only among blocks
    whose removal keeps the set of resident hashes prefix-closed. ``REF_ZERO`` (EVICT-405): a hashed
    block leaves the cache the moment its last reference goes. ``FIFO`` (EVICT-406): the block
    registered longest ago, whatever its later use. ``LRU_LEAF_ACCESS`` (EVICT-411): the leaves of
    ``LRU_LEAF`` ordered by last *access* (the ``allocate`` that handed a block out, the ``acquire``
    or ``match`` that pinned it) instead of last release, as Megatron-Core's ``LRU`` stamps them.
    """

    LRU = "lru"
    LRU_LEAF = "lru-leaf"
    REF_ZERO = "ref-zero"
    FIFO = "fifo"
    LRU_LEAF_ACCESS = "lru-leaf-access"

    @property
    def prefix_closed(self) -> bool:
        """Whether the policy promises a prefix-closed set of resident hashes (EVICT-404)."""
        return self is EvictionPolicy.LRU_LEAF or self is EvictionPolicy.LRU_LEAF_ACCESS

    @property
    def by_access(self) -> bool:
        """Whether eviction reads the order of last access rather than of release (EVICT-411)."""
        return self is EvictionPolicy.LRU_LEAF_ACCESS


def as_policy(value: object) -> EvictionPolicy:
    """Return ``value`` as an EvictionPolicy, accepting the enum or its string name."""
    if isinstance(value, EvictionPolicy):
        return value
    if not isinstance(value, str):
        raise InvalidTypeError("EVICT-407", f"policy must be a str, got {type(value).__name__}")
    try:
        return EvictionPolicy(value)
    except ValueError:
        names = ", ".join(p.value for p in EvictionPolicy)
        raise InvalidValueError("EVICT-407", f"unknown eviction policy {value!r}; known: {names}") from None
