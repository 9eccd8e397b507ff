"""The oracle: a strict, plain, pure-Python block pool with a hash prefix cache (chapters 00-05).

:class:`OracleBlockPool` implements every rule of spec chapters 00-05 and is what other
implementations are compared with. It checks every precondition before it changes anything
(ERR-501), keeps explicit state that :meth:`~OracleBlockPool.check_invariants` can read, and stays
fast: the hot paths (``allocate`` from the free stack, ``free``, ``acquire``, ``lookup``) are a
few list and dict operations per block.

It is composed of one mixin per concern, each in its own module over the state declared in
:mod:`kvref.oracle.blockpool.state`: reference counting (:mod:`.references`), the prefix index
(:mod:`.prefix`), eviction orders (:mod:`.eviction`), batched calls (:mod:`.batched`), the fused
replay (:mod:`.replaying`) and invariants (:mod:`.invariants`); paused holders and the pool's
shape come from :mod:`kvref.contract`.
"""

from __future__ import annotations

from typing import Any

from kvref.contract.containment import contain_faults
from kvref.contract.protocol import STANDARD_CAPABILITIES
from kvref.oracle.blockpool.batched import BatchedCalls
from kvref.oracle.blockpool.eviction import Eviction
from kvref.oracle.blockpool.invariants import InvariantChecks
from kvref.oracle.blockpool.prefix import PrefixIndex
from kvref.oracle.blockpool.references import ReferenceCounting
from kvref.oracle.blockpool.replaying import FusedReplay

__all__ = ["OracleBlockPool"]


@contain_faults
class OracleBlockPool(ReferenceCounting, PrefixIndex, Eviction, BatchedCalls, FusedReplay, InvariantChecks):
    """Block pool and hash prefix cache, the reference semantics of kvref (chapters 00-05).

    ``OracleBlockPool(num_blocks, *, policy="lru", reserved_ids=(0,), paused_limit=0,
    enable_events=False)``: ``num_blocks`` blocks, of which ``reserved_ids`` (the null block by
    default) are never handed out (POOL-102); ``policy`` is one of ``lru``, ``lru-leaf``,
    ``ref-zero``, ``fifo``, ``lru-leaf-access`` (chapter 04); ``paused_limit`` is the soft limit on references held by
    paused holders (POOL-113); ``enable_events`` turns on KV events (PFX-315).
    """

    name = "oracle"

    def capabilities(self) -> frozenset[str]:
        """Every capability of the protocol: the whole spec, and the fused replay (TRACE-1019)."""
        return STANDARD_CAPABILITIES | {"replay"}

    @property
    def events_enabled(self) -> bool:
        """Whether this pool records KV events (``enable_events``, PFX-315); the capability says it can."""
        return self._events_on

    def snapshot(self) -> dict[str, Any]:
        """A deep, comparable copy of the whole state, eviction order included (ERR-501)."""
        return {
            "free": list(self._free),
            "ref": list(self._ref),
            "gen": list(self._gen),
            "holders": [dict(h) if h else None for h in self._holders],
            "hash": list(self._hash),
            "held": dict(self._held),
            "paused": set(self._paused),
            "copies": {h: list(c) for h, c in self._copies.items()},
            "parent": dict(self._parent),
            "children": dict(self._children),
            "evictable": list(self._evictable),
            "access": sorted(self._evictable, key=self._access.__getitem__) if self._policy.by_access else [],
            "registered": list(self._registered),
            "events": list(self._events),
            "stats": self.stats,
        }

    def __repr__(self) -> str:
        return (
            f"OracleBlockPool(num_blocks={self._n}, policy={self._policy.value!r}, "
            f"free={self.num_free}, in_use={self.num_in_use}, cached={self.num_cached})"
        )
