"""What a request-level manager speaks (spec chapter 07): its protocol, block lists, statistics, events.

:class:`KVCacheManager` is the surface vLLM's scheduler calls (``get_computed_blocks``,
``allocate_slots``, ``free``, ...), with kvref's strictness (REQ-703, REQ-712). The oracle
(:class:`kvref.oracle.manager.RequestManager`) implements it over any chapter 03 ``PrefixCache``;
a peer adapter implements it over an engine's own manager.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from kvref.contract.errors import ConfigError, InvalidValueError
from kvref.contract.events import AllBlocksCleared, BlockRemoved
from kvref.contract.hashing import BlockExtraKeys, hash_group_key
from kvref.contract.requests import Request

__all__ = [
    "FULL_ATTENTION",
    "NULL_BLOCK",
    "CacheGroup",
    "LAST_BLOCK_MODES",
    "group_key",
    "KVCacheBlocks",
    "KVCacheManager",
    "ManagerEvent",
    "RequestBlockStored",
    "RequestPrefixStats",
]

#: How a prompt of exactly ``k`` whole blocks is matched (REQ-701, REQ-705).
LAST_BLOCK_MODES = {
    "recompute": "match at most floor((n - 1) / B) blocks and allocate the last block again (vLLM)",
    "share": "match up to all k blocks and recompute only the last token, into the shared block (Megatron-Core)",
}


#: The block that stands in a sliding-window table for a block outside the window (REQ-730): the
#: pool's reserved block 0, vLLM's null block. It is never held, freed or registered.
NULL_BLOCK = 0


@dataclass(frozen=True)
class CacheGroup:
    """One KV cache group of a manager (REQ-730, REQ-757): full attention, a sliding window of
    ``sliding_window`` tokens, or mamba (a linear-attention state per request, vLLM's ``MambaManager``
    with ``mamba_cache_mode="all"``).

    Every group of a manager has the manager's block size and draws its blocks from the manager's one
    pool, or from a pool of its own (REQ-735).
    """

    kind: str = "full"
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.kind in ("full", "mamba") and self.sliding_window is None:
            return
        if self.kind != "sliding-window" or type(self.sliding_window) is not int or self.sliding_window < 2:
            raise ConfigError(
                "REQ-730",
                f"CacheGroup: {self.kind!r} with window {self.sliding_window!r}: a group is 'full', 'mamba' or "
                "'sliding-window' with an int window >= 2",
            )

    @classmethod
    def window(cls, tokens: int) -> CacheGroup:
        """A sliding-window group attending to the last ``tokens`` tokens."""
        return cls("sliding-window", tokens)

    @classmethod
    def mamba(cls) -> CacheGroup:
        """A mamba group: one state block per position, of which a request keeps the last (REQ-757)."""
        return cls("mamba")

    @property
    def window_tokens(self) -> int | None:
        """``W`` such that the first ``n - W + 1`` of ``n`` computed tokens are skipped (REQ-730, REQ-757):
        None for full attention (none is), the window of a sliding window, 2 for mamba (only the state
        after the last computed token is read)."""
        if self.kind == "mamba":
            return 2
        return self.sliding_window


#: The one group of a plain decoder: full attention.
FULL_ATTENTION = CacheGroup()


def group_key(block_hash: int, group: int) -> int:
    """The key block ``block_hash`` is cached under in group ``group`` (REQ-733): the hash itself in
    group 0, :func:`~kvref.contract.hashing.hash_group_key` of it and the group's index in any other,
    so that a block of one group never serves another, nor is any group's key a block's hash."""
    return block_hash if group == 0 else hash_group_key(block_hash, group)


@dataclass(frozen=True)
class KVCacheBlocks:
    """Block ids per KV cache group, in token order (REQ-719): what the manager and the scheduler exchange."""

    blocks: tuple[tuple[int, ...], ...]

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        """Concatenate group by group (REQ-719)."""
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented
        if len(other.blocks) != len(self.blocks):
            raise InvalidValueError(
                "REQ-719", f"KVCacheBlocks +: {len(self.blocks)} groups and {len(other.blocks)} groups"
            )
        return KVCacheBlocks(tuple(a + b for a, b in zip(self.blocks, other.blocks, strict=True)))

    def new_empty(self) -> KVCacheBlocks:
        """As many groups as this one, each empty (REQ-719)."""
        return KVCacheBlocks(tuple(() for _ in self.blocks))

    def get_block_ids(self) -> tuple[list[int], ...]:
        """One list of ids per group."""
        return tuple(list(group) for group in self.blocks)

    @property
    def num_blocks(self) -> int:
        """Blocks in all groups together."""
        return sum(len(group) for group in self.blocks)

    @classmethod
    def empty(cls, num_groups: int = 1) -> KVCacheBlocks:
        """``num_groups`` empty groups."""
        return cls(tuple(() for _ in range(num_groups)))


@dataclass(frozen=True)
class RequestPrefixStats:
    """Statistics counted in tokens since the last ``make_prefix_cache_stats`` (REQ-716).

    ``requests``/``queries``/``hits``: requests never preempted, their tokens and their computed
    tokens; the ``preempted_`` fields the same for requests preempted before; ``reset``: whether
    ``reset_prefix_cache`` succeeded in the period.
    """

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    reset: bool = False

    @property
    def hit_rate(self) -> float:
        """``hits / queries`` of requests never preempted, 0.0 before the first."""
        return self.hits / self.queries if self.queries else 0.0


@dataclass(frozen=True)
class RequestBlockStored:
    """A hash became resident (REQ-717): with its parent, tokens, block size and extra keys.

    ``parent_hash`` is None for a request's first block. A consumer holding every event can
    rebuild each chain from the root.
    """

    block_hash: int
    parent_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    extra_keys: BlockExtraKeys
    group: int = 0


#: The manager's events (REQ-717): chapter 03's removed and cleared events, stored with tokens.
ManagerEvent = RequestBlockStored | BlockRemoved | AllBlocksCleared


@runtime_checkable
class KVCacheManager(Protocol):
    """The request-level manager (chapter 07), as vLLM's scheduler calls it."""

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        ...

    @property
    def max_model_len(self) -> int:
        """The most tokens a request's blocks may cover (REQ-720)."""
        ...

    @property
    def usage(self) -> float:
        """The share of usable blocks in use (REQ-723)."""
        ...

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation could take now: free plus cached and unreferenced."""
        ...

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The request's cached prefix and the tokens it covers; pins nothing (REQ-704..REQ-707)."""
        ...

    def new_step_starts(self) -> None:
        """A scheduler step begins: blocks a mamba group cached before it become usable hits (REQ-759)."""
        ...

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_draft_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ) -> KVCacheBlocks | None:
        """Pin the hits, allocate, cache full blocks; None and no change when it does not fit (REQ-708..)."""
        ...

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Count an admitted request and its hit tokens (REQ-716)."""
        ...

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the blocks the first ``num_computed_tokens`` tokens fill (REQ-711)."""
        ...

    def free(self, request: Request) -> None:
        """Release the request's blocks tail first (REQ-713)."""
        ...

    def preempt(self, request: Request) -> None:
        """Free the request and mark it preempted, to recompute on resume (REQ-714)."""
        ...

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block, or return False while a block is in use (REQ-715)."""
        ...

    def make_prefix_cache_stats(self) -> RequestPrefixStats | None:
        """The statistics since the last call, then new ones (REQ-716)."""
        ...

    def take_events(self) -> list[ManagerEvent]:
        """The events since the last call, oldest first (REQ-717)."""
        ...

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's blocks per group, in token order (REQ-719)."""
        ...

    def get_unhashed_block_ids(self, blocks: KVCacheBlocks) -> list[int]:
        """The blocks of ``blocks`` not registered under a hash (REQ-719)."""
        ...

    def get_num_common_prefix_blocks(self, request_ids: Sequence[str], *, num_running: int | None = None) -> list[int]:
        """Leading blocks every named request holds, per group (REQ-718)."""
        ...

    def block_hash(self, block_id: int, *, group: int = 0) -> int | None:
        """The key ``block_id`` is registered under in the pool of group ``group``, or None (REQ-735)."""
        ...

    def capabilities(self) -> frozenset[str]:
        """Capability names (chapter 07's among them)."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """Every observable part of the state, for checking that a refused call changed nothing."""
        ...
