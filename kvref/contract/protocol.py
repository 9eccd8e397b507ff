"""The abstract protocol every implementation speaks (spec chapters 00-05).

:class:`BlockPool` is the block allocator with reference counts (chapter 01); :class:`PrefixCache`
adds hash registration, lookup, eviction, events and statistics (chapters 03-04). Optional
features are separate runtime-checkable protocols (:class:`SupportsBatching`,
:class:`SupportsPause`, :class:`SupportsInvariants`, :class:`SupportsSnapshot`), and an
implementation declares what it has in :data:`CAPABILITIES` terms, so a test suite can skip by
capability, never by implementation name.

Block ids are ints in ``[0, num_blocks)``; which free id ``allocate`` returns is
implementation-defined (POOL-115). A *holder* is any hashable value naming who holds a reference
(a request id); ``None`` is a holder like any other, so callers that do not care about holders
still get strict reference counting.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, SupportsIndex, runtime_checkable

from kvref.contract.capabilities import (
    ARRAY_CAPABILITIES,
    CAPABILITIES,
    DATA_CAPABILITIES,
    SLOT_CAPABILITIES,
    STANDARD_CAPABILITIES,
    TIER_CAPABILITIES,
)
from kvref.contract.events import KVEvent, PrefixCacheStats
from kvref.contract.policies import EvictionPolicy
from kvref.contract.validate import IntsLike

__all__ = [
    "Backend",
    "CAPABILITIES",
    "BlockPool",
    "BlockState",
    "Holder",
    "PrefixCache",
    "SupportsBatching",
    "SupportsClear",
    "SupportsEvict",
    "SupportsHashing",
    "SupportsRequestPrefix",
    "SupportsInvariants",
    "SupportsPause",
    "SupportsReplay",
    "SupportsSnapshot",
    "ReplayedBatch",
    "SLOT_CAPABILITIES",
    "ARRAY_CAPABILITIES",
    "STANDARD_CAPABILITIES",
    "DATA_CAPABILITIES",
    "TIER_CAPABILITIES",
]

Holder = Hashable


class BlockState(StrEnum):
    """The state of one block (STATE-001): exactly one of these at any time."""

    RESERVED = "reserved"
    FREE = "free"
    IN_USE = "in-use"
    CACHED = "cached"


@runtime_checkable
class BlockPool(Protocol):
    """A pool of ``num_blocks`` KV blocks with per-holder reference counts (chapter 01)."""

    @property
    def num_blocks(self) -> int:
        """All blocks, reserved ones included."""
        ...

    @property
    def reserved_ids(self) -> tuple[int, ...]:
        """Blocks that are never handed out (POOL-102)."""
        ...

    @property
    def num_usable(self) -> int:
        """``num_blocks - len(reserved_ids)`` (STATE-003)."""
        ...

    @property
    def num_free(self) -> int:
        """Blocks neither in use nor cached."""
        ...

    @property
    def num_in_use(self) -> int:
        """Blocks with at least one reference."""
        ...

    @property
    def num_available(self) -> int:
        """The largest ``n`` for which ``allocate(n)`` succeeds now (POOL-106)."""
        ...

    def allocate(self, count: SupportsIndex, *, holder: Holder = None) -> list[int]:
        """Take ``count`` blocks for ``holder``, all or none (POOL-104, POOL-105)."""
        ...

    def free(
        self,
        block_ids: IntsLike,
        *,
        holder: Holder = None,
        generations: IntsLike | None = None,
    ) -> None:
        """Drop one of ``holder``'s references per occurrence in ``block_ids`` (POOL-107..109)."""
        ...

    def acquire(
        self,
        block_ids: IntsLike,
        *,
        holder: Holder = None,
        generations: IntsLike | None = None,
    ) -> None:
        """Add one reference per occurrence for ``holder`` to blocks in use or cached (POOL-110)."""
        ...

    def ref_count(self, block_id: SupportsIndex) -> int:
        """References on ``block_id`` from all holders."""
        ...

    def holders(self, block_id: SupportsIndex) -> dict[Holder, int]:
        """References on ``block_id`` per holder (STATE-004)."""
        ...

    def generation(self, block_id: SupportsIndex) -> int:
        """How many times ``block_id`` has been allocated (POOL-111)."""
        ...

    def block_state(self, block_id: SupportsIndex) -> BlockState:
        """The state of ``block_id`` (STATE-001)."""
        ...

    def capabilities(self) -> frozenset[str]:
        """The capability names (keys of :data:`CAPABILITIES`) this implementation has."""
        ...


@runtime_checkable
class PrefixCache(BlockPool, Protocol):
    """A block pool whose full blocks can be found again by their hash (chapters 03-04)."""

    @property
    def policy(self) -> EvictionPolicy:
        """The eviction policy (chapter 04)."""
        ...

    @property
    def num_cached(self) -> int:
        """Blocks that are hashed, unreferenced and evictable."""
        ...

    def register(
        self, block_ids: IntsLike, block_hashes: IntsLike, *, parent_hash: SupportsIndex | None = None
    ) -> None:
        """Cache in-use blocks under a chain of hashes starting after ``parent_hash`` (PFX-301..)."""
        ...

    def lookup(self, block_hashes: IntsLike, *, parent_hash: SupportsIndex | None = None) -> list[int]:
        """Blocks of the longest resident prefix of a hash chain after ``parent_hash``; changes nothing (PFX-307)."""
        ...

    def match(self, block_hashes: IntsLike, *, holder: Holder = None) -> list[int]:
        """``lookup``, then acquire the hit for ``holder`` and count it in the stats (PFX-309)."""
        ...

    def block_hash(self, block_id: SupportsIndex) -> int | None:
        """The hash ``block_id`` is registered under, or None."""
        ...

    def resident_hashes(self) -> frozenset[int]:
        """Hashes with at least one cached copy (PFX-305)."""
        ...

    def reset(self) -> None:
        """Drop every cached block; only when no block is in use (PFX-313)."""
        ...

    def take_events(self) -> list[KVEvent]:
        """Events since the last call, oldest first; empty when events are off (PFX-315)."""
        ...

    @property
    def stats(self) -> PrefixCacheStats:
        """Cumulative hit statistics (PFX-318)."""
        ...


@runtime_checkable
class SupportsBatching(Protocol):
    """A whole scheduler step in one call; meaning = the single operations in order (POOL-116)."""

    def allocate_many(self, counts: IntsLike, *, holders: Sequence[Holder]) -> list[list[int]]:
        """Admit the longest prefix of the batch that fits; return one id list per admitted entry."""
        ...

    def free_many(self, block_lists: Sequence[IntsLike], *, holders: Sequence[Holder]) -> None:
        """Free each list for its holder, atomically as a whole (POOL-117)."""
        ...

    def match_many(self, hash_lists: Sequence[IntsLike], *, holders: Sequence[Holder]) -> list[list[int]]:
        """``match`` each hash chain for its holder, in order (PFX-320)."""
        ...


@runtime_checkable
class SupportsEvict(Protocol):
    """Eviction on its own, ahead of an allocation: Megatron-Core's ``evict_lru_blocks`` (EVICT-412)."""

    def evict(self, count: SupportsIndex) -> bool:
        """Evict what an allocation lacking ``count`` free blocks would; False, evicting nothing, if it cannot."""
        ...


@runtime_checkable
class SupportsClear(Protocol):
    """The full reset of an engine that starts over: Megatron-Core's ``KVBlockAllocator.reset`` (POOL-124)."""

    def clear(self) -> None:
        """Drop every reference, pause and registration, blocks in use included; generations stay."""
        ...


@runtime_checkable
class SupportsPause(Protocol):
    """Paused holders and their soft limit (POOL-112..POOL-114)."""

    @property
    def paused_limit(self) -> int:
        """The soft limit on references held by paused holders."""
        ...

    @property
    def paused_used(self) -> int:
        """References held by paused holders."""
        ...

    @property
    def paused_excess(self) -> int:
        """``max(0, paused_used - paused_limit)``: what the caller must give back."""
        ...

    def pause(self, holder: Holder) -> None:
        """Mark ``holder`` paused."""
        ...

    def resume(self, holder: Holder) -> None:
        """Mark a paused ``holder`` active again."""
        ...


@runtime_checkable
class SupportsHashing(Protocol):
    """An implementation that hashes tokens itself, as vLLM does (chapter 02)."""

    def hash_blocks(
        self,
        token_ids: IntsLike,
        block_size: int,
        *,
        adapter: str | int | None = None,
        cache_salt: str | None = None,
        multimodal: Sequence[Any] = (),
    ) -> list[int]:
        """Hashes of the full blocks of a request's tokens (HASH-201..HASH-211)."""
        ...


@runtime_checkable
class SupportsRequestPrefix(Protocol):
    """The request-level prefix match of vLLM's ``get_computed_blocks`` (REQ-701)."""

    def match_request(
        self, block_hashes: IntsLike, *, num_tokens: int, block_size: int, holder: Holder = None
    ) -> list[int]:
        """``match`` limited to the blocks that leave the request's last token uncomputed."""
        ...


@dataclass(frozen=True)
class ReplayedBatch:
    """What :meth:`SupportsReplay.replay_requests` reports (TRACE-1019).

    ``hits[i]``: how many leading blocks of request ``i`` were cached when it arrived (TRACE-1011).
    ``peak_occupied``: the most blocks in use or cached (``num_usable - num_free``) while a
    request of the batch held all its blocks; 0 for an empty batch.
    """

    hits: list[int]
    peak_occupied: int


@runtime_checkable
class SupportsReplay(Protocol):
    """Trace replay in one call, on the implementation's own prefix cache (TRACE-1019)."""

    def replay_requests(self, block_lists: Sequence[IntsLike]) -> ReplayedBatch:
        """Replay each request of ``block_lists`` in order, exactly as TRACE-1014 does it stepwise.

        For request ``ids``, with a holder that holds nothing else: ``match(ids)``; allocate the
        misses, as many as fit (TRACE-1015); register them chained after the hit; release every
        block tail first. The pool ends in exactly the state those calls leave, stats and events
        included. The batch must be a prefix tree agreeing with the resident chains (TRACE-1006,
        PFX-306); a batch that is not is refused whole, before anything changes (ERR-501).
        """
        ...


@runtime_checkable
class SupportsInvariants(Protocol):
    """Self-check of every invariant the spec states (STATE-001..STATE-007)."""

    def check_invariants(self) -> None:
        """Raise :class:`~kvref.contract.errors.InvariantViolation` naming the first broken rule."""
        ...


@runtime_checkable
class SupportsSnapshot(Protocol):
    """Whole observable state, for checking that a failed call changed nothing (ERR-501)."""

    def snapshot(self) -> dict[str, Any]:
        """A deep, comparable copy of every observable part of the state."""
        ...


@runtime_checkable
class Backend(Protocol):
    """A named implementation, found through the ``kvref.backends`` entry points (chapter 09).

    ``availability()`` returns None when the backend can run here, else the reason it cannot;
    ``create`` builds a pool. Loading the entry point must be cheap: heavy imports happen in
    ``availability`` or ``create``.
    """

    name: str

    def version(self) -> str:
        """The implementation's version string."""
        ...

    def availability(self) -> str | None:
        """None if usable here, else why not (missing package, no device, ...)."""
        ...

    def device(self, requested: str | None = None) -> str:
        """The device a pool would live on for ``requested`` (None: the backend's default)."""
        ...

    def capabilities(self) -> frozenset[str]:
        """Capability names (keys of :data:`CAPABILITIES`)."""
        ...

    def create(
        self,
        num_blocks: SupportsIndex,
        *,
        policy: str = "lru",
        device: str | None = None,
        reserved_ids: IntsLike = (0,),
        paused_limit: int = 0,
        enable_events: bool = False,
    ) -> PrefixCache:
        """A new pool with ``num_blocks`` blocks under ``policy`` on ``device``."""
        ...
