"""The array core: a block pool and hash prefix cache with all state in device arrays (chapters 00-05, 09).

:class:`ArrayBlockPool` implements the same protocol and rules as the oracle
(:class:`kvref.oracle.OracleBlockPool`), over int64 arrays owned by an
:class:`~kvref_arraypool.ops.ArrayOps` (NumPy, CuPy or torch). There is no per-block Python
object and no Python loop over blocks on any path that succeeds: each call is a constant number
of array operations over its batch (plus a few per probe step of the hash tables and per
pointer-doubling round of lru-leaf eviction). Bad input is *detected* with array operations; only
then do the explainers of :mod:`kvref.contract.checks` walk the batch to name the first offending
entry exactly as the oracle does, so the error class, rule and message agree with the oracle's
(ERR-501, ERR-502, ERR-509).

It is composed of one mixin per concern over the arrays declared in
:mod:`kvref_arraypool.state`: reference counting (:mod:`.references`) and pinning
on it (:mod:`.pinning`), batched calls (:mod:`.batched`), registrations (:mod:`.registration`),
lookups (:mod:`.lookup`), eviction orders (:mod:`.eviction`) and invariants
(:mod:`.invariants`). Every method runs between CUDA-graph captures (CONF-908): allocation
sizes, error checks and eviction depend on values read back to the host.
"""

from __future__ import annotations

from typing import Any

from kvref.contract.containment import contain_faults
from kvref.contract.policies import EvictionPolicy
from kvref.contract.protocol import STANDARD_CAPABILITIES
from kvref_arraypool.batched import BatchedCalls
from kvref_arraypool.eviction import Eviction
from kvref_arraypool.invariants import InvariantChecks
from kvref_arraypool.lookup import PrefixLookup
from kvref_arraypool.pinning import Pinning
from kvref_arraypool.registration import Registration

__all__ = ["ArrayBlockPool"]

_FIFO = EvictionPolicy.FIFO


@contain_faults
class ArrayBlockPool(Pinning, BatchedCalls, Registration, PrefixLookup, Eviction, InvariantChecks):
    """Block pool and hash prefix cache over device arrays; the oracle's semantics (chapters 00-05).

    ``ArrayBlockPool(num_blocks, *, ops, policy="lru", reserved_ids=(0,), paused_limit=0,
    enable_events=False, name="array")``: ``ops`` chooses the array library and device; the other
    arguments are the oracle's. Block ids are handed out in the oracle's order, so the pool also
    passes the ``exact-order`` profile.
    """

    def capabilities(self) -> frozenset[str]:
        """Every capability of the protocol but the fused replay (TRACE-1019): replay goes step by step.

        On a CUDA device also ``cuda-graph``: :meth:`graph_arrays` may be read by captured graphs.
        """
        return STANDARD_CAPABILITIES | {"cuda-graph"} if self.ops.is_device else STANDARD_CAPABILITIES

    @property
    def events_enabled(self) -> bool:
        """Whether this pool records KV events (``enable_events``, PFX-315); the capability says it can."""
        return self._events_on

    def graph_arrays(self) -> dict[str, Any]:
        """The arrays a captured CUDA graph may read, by the names of spec 09's table (CONF-908).

        Each keeps its address for the pool's lifetime (``ops.address``); their contents change
        with every operation, so a graph replayed between operations reads the current state.
        ``stack[:num_free]`` is the free stack; ``num_free`` itself is a host counter.
        """
        arrays = {
            "ref": self._ref,
            "gen": self._gen,
            "bhash": self._bhash,
            "stack": self._stack,
            "index.keys": self._index.keys,
            "index.values": self._index.values,
            "ehash": self._ehash,
            "ehead": self._ehead,
            "eparent": self._eparent,
        }
        return {name: self.ops.export(array) for name, array in arrays.items()}

    def eviction_order(self) -> list[int]:
        """Cached blocks in release order (lru order), oldest first."""
        return self.ops.tolist(self._lru_order.oldest(self._ncached)) if self._ncached else []

    def _access_order(self) -> list[int]:
        """The cached blocks, least recently accessed first (EVICT-411): what a snapshot compares."""
        if not self._ncached:
            return []
        cached = self._lru_order.oldest(self._ncached)
        return self.ops.tolist(cached[self.ops.argsort(self._access[cached])])

    def snapshot(self) -> dict[str, Any]:
        """A deep, comparable copy of the whole observable state, eviction orders included (ERR-501)."""
        ops = self.ops
        keys, values = self._shared.items()
        order = ops.argsort(keys)
        index_keys, index_entries = self._index.items()
        iorder = ops.argsort(index_keys)
        index_keys, index_entries = index_keys[iorder], index_entries[iorder]
        fifo = self._fifo_order.oldest(self._n) if self._policy is _FIFO else ops.zeros(0)
        return {
            "free": ops.tolist(self._stack[: self._nfree]),
            "ref": ops.tolist(self._ref),
            "gen": ops.tolist(self._gen),
            "owner": ops.tolist(self._owner),
            "shared": list(zip(ops.tolist(keys[order]), ops.tolist(values[order]), strict=True)),
            "hash": ops.tolist(self._bhash),
            "held": dict(self._held),
            "paused": set(self._paused),
            "entries": {
                "hash": ops.tolist(index_keys),
                "copies": ops.tolist(self._ecopies[index_entries]),
                "parent": ops.tolist(self._eparent[index_entries]),
                "children": ops.tolist(self._echildren[index_entries]),
                "head": ops.tolist(self._ehead[index_entries]),
            },
            "evictable": self.eviction_order(),
            "access": self._access_order() if self._policy.by_access else [],
            "registered": ops.tolist(fifo),
            "events": list(self._events),
            "stats": self.stats,
            "counts": (self._nfree, self._ncached),
        }

    def __repr__(self) -> str:
        return (
            f"ArrayBlockPool(name={self.name!r}, device={self.device!r}, num_blocks={self._n}, "
            f"policy={self._policy.value!r}, free={self.num_free}, in_use={self.num_in_use}, cached={self.num_cached})"
        )
