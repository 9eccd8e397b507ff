"""The oracle's hash prefix cache: register, lookup, match, reset, events (chapter 03).

The index is ``_copies`` (hash -> its blocks, oldest first), ``_parent`` and ``_children``
(:mod:`kvref.oracle.blockpool.state`). ``register`` checks the whole call before it changes
anything: a plain pass finds whether anything is wrong, and
:func:`kvref.contract.checks.explain_register` names the first thing (ERR-509).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any, SupportsIndex

from kvref.contract.checks import explain_register
from kvref.contract.errors import CacheInUseError, PausedHolderError
from kvref.contract.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvref.contract.policies import EvictionPolicy
from kvref.contract.validate import IntsLike, as_hash, as_hash_list, as_holder, register_arguments, request_prefix_limit
from kvref.oracle.blockpool.state import PoolState

__all__ = ["PrefixIndex"]

_FIFO = EvictionPolicy.FIFO


class PrefixIndex(PoolState):
    """``register``, ``lookup``, ``match``, ``reset`` and KV events over the oracle's state (PFX-301..PFX-321)."""

    def register(
        self,
        block_ids: IntsLike,
        block_hashes: IntsLike,
        *,
        parent_hash: SupportsIndex | None = None,
    ) -> None:
        """Cache in-use blocks: ``block_ids[i]`` under ``block_hashes[i]``, chained (PFX-301).

        ``block_hashes[0]``'s parent is ``parent_hash`` (None: the chain's root); each later
        hash's parent is the hash before it. Blocks must be in use (PFX-302) and unhashed
        (PFX-303); the parent must be resident (PFX-304); a resident hash keeps its parent
        (PFX-306). A hash that gains its first copy is reported as stored (PFX-317).
        """
        ids, hs, parent = register_arguments(
            block_ids, block_hashes, parent_hash, parent_resident=self._copies.__contains__
        )
        n, reserved, ref, hashes, parents, children = (
            self._n,
            self._is_reserved,
            self._ref,
            self._hash,
            self._parent,
            self._children,
        )
        prev = parent
        pending: dict[int, int | None] = {}  # hashes this call makes resident -> their parent
        for b, h in zip(ids, hs, strict=True):
            known = parents if h in parents else pending
            if (
                b < 0
                or b >= n
                or reserved[b]
                or ref[b] == 0
                or hashes[b] is not None
                or h == prev
                or (known[h] != prev if h in known else h in children)  # a cycle risk is looked at closely
            ):
                explain_register(self, ids, hs, parent, "register")
                break  # a cycle risk that closes no cycle: the whole call was checked, and it is fine
            pending.setdefault(h, prev)
            prev = h
        prev = parent
        for b, h in zip(ids, hs, strict=True):
            self._hash[b] = h
            self._hashed_in_use.add(b)
            copies = self._copies.get(h)
            if copies is None:
                self._copies[h] = [b]
                self._parent[h] = prev
                if prev is not None:
                    self._children[prev] = self._children.get(prev, 0) + 1
                if self._events_on:
                    self._events.append(BlockStored(h, prev))
            else:
                copies.append(b)
            if self._policy is _FIFO:
                self._registered[b] = None
            prev = h

    def _unregister(self, blocks: Iterable[int], *, keep_tree: bool = True) -> None:
        """Remove the hash registration of each of ``blocks`` in order; a hash leaves with its last copy.

        The blocks leave the evictable and registration orders too; their caller puts them on
        the free stack or hands them out. Callers pass hashed blocks only. ``keep_tree=False``
        leaves ``_parent`` and ``_children`` to a caller that rebuilds them afterwards (the
        one-call replay); eviction under lru-leaf reads them, so it always keeps them.
        """
        hashes, copies, parents, children = self._hash, self._copies, self._parent, self._children
        evictable, registered = self._evictable, self._registered
        events = self._events if self._events_on else None
        for b in blocks:
            h: int = hashes[b]  # type: ignore[assignment]
            hashes[b] = None
            found = copies[h]
            if len(found) > 1:
                found.remove(b)
            else:
                del copies[h]
                parent = parents.pop(h) if keep_tree else None
                if parent is not None:
                    left = children[parent] - 1
                    if left:
                        children[parent] = left
                    else:
                        del children[parent]
                if events is not None:
                    events.append(BlockRemoved(h))
            evictable.pop(b, None)
            if registered:
                registered.pop(b, None)

    def lookup(
        self,
        block_hashes: IntsLike,
        *,
        parent_hash: SupportsIndex | None = None,
        prefer: Sequence[int] | None = None,
    ) -> list[int]:
        """Blocks of the longest resident prefix of the chain; changes nothing (PFX-307, PFX-321).

        Hash ``i`` is a hit only if it is resident with the chain's parent (``parent_hash`` for
        the first); the walk stops at the first miss. Among several copies the oldest registered
        is returned, unless ``prefer[i]`` names another copy of that hash: the conformance suite
        uses ``prefer`` to follow the copy another implementation chose (PFX-308).
        """
        hs = as_hash_list(block_hashes, op="lookup")
        parent = None if parent_hash is None else as_hash(parent_hash, op="lookup", arg="parent_hash")
        return self._lookup(hs, parent, prefer)

    def _lookup(self, hs: list[int], parent: int | None, prefer: Sequence[int] | None = None) -> list[int]:
        out: list[int] = []
        copies, parents = self._copies, self._parent
        for i, h in enumerate(hs):
            found = copies.get(h)
            if found is None or parents[h] != parent:
                break
            if prefer is not None and i < len(prefer) and prefer[i] in found:
                out.append(prefer[i])
            else:
                out.append(found[0])
            parent = h
        return out

    def match(
        self,
        block_hashes: IntsLike,
        *,
        holder: Hashable = None,
        parent_hash: SupportsIndex | None = None,
        prefer: Sequence[int] | None = None,
    ) -> list[int]:
        """``lookup``, acquire the hit for ``holder`` and count it in the stats (PFX-309).

        ``prefer`` is as for :meth:`lookup`.
        """
        hs = as_hash_list(block_hashes, op="match")
        holder = as_holder(holder, op="match")
        parent = None if parent_hash is None else as_hash(parent_hash, op="match", arg="parent_hash")
        if holder in self._paused and hs:
            raise PausedHolderError("POOL-114", f"match: holder {holder!r} is paused")
        return self._match(hs, parent, holder, prefer)

    def _match(
        self, hs: list[int], parent: int | None, holder: Hashable, prefer: Sequence[int] | None = None
    ) -> list[int]:
        hit = self._lookup(hs, parent, prefer)
        self._pin(hit, holder)
        self._requests += 1
        self._queries += len(hs)
        self._hits += len(hit)
        return hit

    def match_request(
        self,
        block_hashes: IntsLike,
        *,
        num_tokens: SupportsIndex,
        block_size: SupportsIndex,
        holder: Hashable = None,
    ) -> list[int]:
        """``match`` for a request of ``num_tokens`` tokens: its last token is never a hit (REQ-701).

        At most ``(num_tokens - 1) // block_size`` blocks are matched, so the engine always has at
        least one token to compute and gets the logits of the last one.
        """
        hs = as_hash_list(block_hashes, op="match_request")
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
        """kvref's own hashing (:func:`kvref.contract.hashing.hash_token_blocks`, default algorithm)."""
        from kvref.contract.hashing import hash_token_blocks

        return hash_token_blocks(
            token_ids,
            block_size,
            adapter=adapter,
            cache_salt=cache_salt,
            multimodal=multimodal,
        )

    def resident_hashes(self) -> frozenset[int]:
        """Hashes with at least one cached copy, in use or evictable (PFX-305)."""
        return frozenset(self._copies)

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
        counts (POOL-111), so a (block, generation) handle from before the clear is stale after it.
        What a holder held is gone: freeing it later is POOL-108's refusal.
        """
        n, reserved = self._n, self._is_reserved
        self._drop_cache()
        self._ref = [0] * n
        self._holders = [None] * n
        self._free[:] = [b for b in range(n - 1, -1, -1) if not reserved[b]]
        self._held.clear()
        self._paused.clear()
        self._hashed_in_use.clear()
        self._hash = [None] * n

    def _drop_cache(self) -> None:
        """Forget every registration, free the cached blocks, count the reset, emit all-cleared."""
        for b in self._evictable:
            self._hash[b] = None
            self._free.append(b)
        self._evictable.clear()
        self._registered.clear()
        self._copies.clear()
        self._parent.clear()
        self._children.clear()
        self._resets += 1
        if self._events_on:
            self._events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        """Events since the last call, oldest first, and forget them (PFX-315)."""
        events, self._events = self._events, []
        return events
