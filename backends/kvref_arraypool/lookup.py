"""The array core's prefix lookups: lookup, match, reset and events (PFX-307..PFX-321).

A lookup is a constant number of array operations: find every hash's entry, compare each entry's
parent with the hash before it, cut at the first miss, and return the oldest copy of each hit.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, SupportsIndex

import numpy as np

from kvref.contract.errors import CacheInUseError
from kvref.contract.events import AllBlocksCleared, KVEvent
from kvref.contract.validate import IntsLike, as_hash, as_holder, request_prefix_limit
from kvref_arraypool.host_flags import any_true, positions
from kvref_arraypool.inputs import hash_array
from kvref_arraypool.ops import Array
from kvref_arraypool.state import NOBODY, SHARED, ArrayPoolState

__all__ = ["PrefixLookup"]


class PrefixLookup(ArrayPoolState):
    """``lookup``, ``match`` (and ``match_ids``), ``match_request``, ``reset`` and ``take_events``."""

    def _lookup(self, hs: np.ndarray, parent: int) -> Array:
        """Blocks of the longest resident prefix of a chain (oldest copy of each hash); pure."""
        ops = self.ops
        m = len(hs)
        if m == 0:
            return ops.zeros(0)
        prev = ops.asarray(np.concatenate([np.array([parent], dtype=np.int64), hs[:-1]]))
        safe, ok = self._chained(self._entries_of(ops.asarray(hs)), prev)
        missed = positions(~ops.to_host(ok))  # one read: where the chain first misses
        length = int(missed[0]) if len(missed) else m
        return self._ehead[safe[:length]]

    def _lookup_to_pin(self, hs: np.ndarray, parent: int, hid: int) -> tuple[Array, np.ndarray] | None:
        """:meth:`_lookup` for a match on a device, in one host read with the pin's own flags.

        Returns the hit and, per hit, whether it is cached, held alone by a holder other than
        ``hid`` and shared (:meth:`_pin_distinct`'s flags; a chain's hits are distinct blocks). None
        where a hash's probe ran long (:meth:`HashTable.find_near`): the caller then looks up and
        pins the exact way.
        """
        ops = self.ops
        m = len(hs)
        entries, far = self._index.find_near(ops.asarray(hs))
        prev = ops.asarray(np.concatenate([np.array([parent], dtype=np.int64), hs[:-1]]))
        safe, ok = self._chained(entries, prev)
        heads = self._ehead[ops.where(ok, safe, 0)]
        owner = self._owner[ops.where(ok, heads, 0)]
        flags = ops.to_host(ops.concat([far, ok, owner == NOBODY, (owner >= 0) & (owner != hid), owner == SHARED]))
        if any_true(flags[:m]):
            return None
        missed = positions(~flags[m : 2 * m])
        k = int(missed[0]) if len(missed) else m
        pin = np.stack([flags[start : start + k] for start in (2 * m, 3 * m, 4 * m)])
        return heads[:k], pin

    def lookup(self, block_hashes: IntsLike, *, parent_hash: SupportsIndex | None = None) -> list[int]:
        """Blocks of the longest resident prefix of the chain; changes nothing (PFX-307, PFX-308, PFX-321).

        Among several copies of a hash the oldest registered is returned.
        """
        hs = hash_array(block_hashes, op="lookup")
        parent = -1 if parent_hash is None else as_hash(parent_hash, op="lookup", arg="parent_hash")
        return self.ops.tolist(self._lookup(hs, parent))

    def match(
        self, block_hashes: IntsLike, *, holder: Hashable = None, parent_hash: SupportsIndex | None = None
    ) -> list[int]:
        """``lookup``, acquire the hit for ``holder`` and count it in the stats (PFX-309, PFX-318)."""
        return self.ops.tolist(self._match(block_hashes, holder, parent_hash))

    def match_ids(
        self, block_hashes: IntsLike, *, holder: Hashable = None, parent_hash: SupportsIndex | None = None
    ) -> Array:
        """``match``, returning the hit as a fresh device array (int64) instead of a list."""
        return self.ops.export(self._match(block_hashes, holder, parent_hash))

    def _match(self, block_hashes: IntsLike, holder: Hashable, parent_hash: SupportsIndex | None) -> Array:
        hs = hash_array(block_hashes, op="match")
        holder = as_holder(holder, op="match")
        parent = -1 if parent_hash is None else as_hash(parent_hash, op="match", arg="parent_hash")
        self._refuse_if_paused(holder, len(hs), "match")
        read = self._lookup_to_pin(hs, parent, self._hid_to_be(holder)) if len(hs) else None  # one host read
        if read is not None:
            hit, (unheld, other, joined) = read
            if len(hit):
                hid = self._hid(holder)
                self._stamp_access(hit)
                self._pin_distinct(hit, hid, unheld, other, joined)
                self._add_held(holder, len(hit))
            self._count_match(len(hs), len(hit))
            return hit
        hit = self._lookup(hs, parent)  # some hash lies far from its home: the exact lookup
        k = len(hit)
        if k:
            self._pin(hit, self._hid(holder))
            self._add_held(holder, k)
        self._count_match(len(hs), k)
        return hit

    def _count_match(self, queried: int, hits: int) -> None:
        """One match of ``queried`` hashes with ``hits`` hits in the stats (PFX-318)."""
        self._requests += 1
        self._queries += queried
        self._hits += hits

    def match_request(
        self,
        block_hashes: IntsLike,
        *,
        num_tokens: SupportsIndex,
        block_size: SupportsIndex,
        holder: Hashable = None,
    ) -> list[int]:
        """``match`` for a request of ``num_tokens`` tokens: its last token is never a hit (REQ-701)."""
        hs = hash_array(block_hashes, op="match_request")
        limit = request_prefix_limit(len(hs), num_tokens, block_size)
        return self.match(hs[:limit], holder=holder)

    def hash_blocks(
        self,
        token_ids: IntsLike,
        block_size: int,
        *,
        adapter: str | int | None = None,
        cache_salt: str | None = None,
        multimodal: Sequence[Any] = (),
    ) -> list[int]:
        """kvref's own hashing on the host (:func:`kvref.contract.hashing.hash_token_blocks`, HASH-201..211)."""
        from kvref.contract.hashing import hash_token_blocks

        return hash_token_blocks(token_ids, block_size, adapter=adapter, cache_salt=cache_salt, multimodal=multimodal)

    def resident_hashes(self) -> frozenset[int]:
        """Hashes with at least one cached copy, in use or evictable (PFX-305)."""
        keys, entries = self._index.items()
        return frozenset(self.ops.tolist(keys[self._ecopies[entries] > 0]))

    def reset(self) -> None:
        """Drop every cached block; refused with CacheInUseError while a block is in use (PFX-313)."""
        in_use = self.num_in_use
        if in_use:
            raise CacheInUseError("PFX-313", f"reset: {in_use} block(s) in use; release every reference first")
        self._drop_cache()

    def clear(self) -> None:
        """Drop every reference, pause and registration, blocks in use included (POOL-124).

        Every usable block is free again, in a new pool's order; no holder holds or is paused; no hash
        is resident (``AllBlocksCleared`` with events on; counted as a reset). Generations keep their
        counts (POOL-111), so a handle from before the clear is stale after it.
        """
        self._drop_cache()
        for array, empty in ((self._ref, 0), (self._owner, NOBODY), (self._bhash, -1), (self._bentry, -1)):
            array[:] = empty
        self._regstamp[:] = -1
        self._shared.clear()
        self._refill_stack()
        self._hids.clear()
        self._holder_of.clear()
        self._spare_hids.clear()
        self._held.clear()
        self._paused.clear()

    def _drop_cache(self) -> None:
        """Forget every registration, free the cached blocks, count the reset, emit all-cleared."""
        cached = self._lru_order.oldest(self._ncached) if self._ncached else self.ops.zeros(0)
        hashed = self.ops.nonzero(self._bhash >= 0)
        for array in (self._bhash, self._bentry, self._regstamp, self._evstamp):
            self.ops.fill_at(array, hashed, -1)
        self._push_free(cached)
        self._ncached = 0
        self._lru_order.clear()
        self._fifo_order.clear()
        self._index.clear()
        for array in (self._ehash, self._eparent, self._epentry, self._ehead):
            array[:] = -1
        self._ecopies[:] = 0
        self._echildren[:] = 0
        self._estack[:] = self.ops.arange(self._n_entries)
        self._nefree = self._n_entries
        self._resets += 1
        if self._events_on:
            self._events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        """Events since the last call, oldest first, and forget them (PFX-315)."""
        events, self._events = self._events, []
        return events
