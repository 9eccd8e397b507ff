"""Trace replay fused into one call on the oracle's own state (TRACE-1019).

:meth:`FusedReplay.replay_requests` does for a whole batch what :func:`kvref.simulation.replay.replay` does request by
request through the protocol (TRACE-1014): for each request, match the cached prefix, allocate the
misses (as many as fit, TRACE-1015), register them chained after the hit, and release everything
tail first. It touches the same state the same way (the free stack, generations, hashes, copies,
parents, children, release and registration order, events and statistics), so the pool ends
exactly as the stepwise calls leave it: ``tests/test_replay_fused.py`` compares whole snapshots.

What it skips is what cannot fail or cannot be seen once a request is released: per-call argument
checks (the batch is checked once, up front), and the holder bookkeeping of a holder that holds
nothing before the request and nothing after it. It has two forms:

- the general one (:meth:`FusedReplay._replay_general`) works from any state: each step as the protocol
  calls do it, with only the hit blocks given a transient reference, so that the policies and
  ``num_available`` see them pinned; parents and children are rebuilt once at the end when the
  batch outweighs the cache (not under lru-leaf or lru-leaf-access, whose eviction reads them);
- while the cache is an LRU stack (:meth:`FusedReplay.lru_stack_holds`), :meth:`FusedReplay._replay_lru_stack` runs a
  plain LRU over one block per hash, which a replay keeps exact request after request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from kvref.contract.errors import HashConflictError, InvalidTypeError
from kvref.contract.events import BlockStored, CacheCounters
from kvref.contract.policies import EvictionPolicy
from kvref.contract.protocol import ReplayedBatch
from kvref.contract.validate import IntsLike, as_hash_list, as_list, prefix_tree_violation
from kvref.oracle.blockpool.blocks import take_free
from kvref.oracle.blockpool.eviction import Eviction

__all__ = ["FusedReplay", "checked_replay_batch"]


def checked_replay_batch(
    block_lists: Sequence[IntsLike], resident_parents: dict[int, int | None], *, op: str = "replay_requests"
) -> tuple[list[list[int]], dict[int, int | None]]:
    """The batch as lists of hashes and the parent of each hash in it, or the first error in it.

    Every entry must be a chain of hashes (ERR-503, HASH-207); together they must form a prefix
    tree, an id occurring once per chain and always after the same id (TRACE-1006), that agrees
    with ``resident_parents``, the parents of the hashes resident now (PFX-306).
    """
    if isinstance(block_lists, (str, bytes, Mapping)) or not isinstance(block_lists, Iterable):
        raise InvalidTypeError(
            "ERR-503", f"{op}: block_lists must be a sequence of hash lists, got {type(block_lists).__name__}"
        )
    entries = as_list(block_lists, op=op, arg="block_lists")
    lists = [as_hash_list(ids, op=op, arg=f"block_lists[{i}]") for i, ids in enumerate(entries)]
    parent_of: dict[int, int | None] = {}
    for i, ids in enumerate(lists):
        violation = prefix_tree_violation(ids, parent_of, resident_parents)
        if violation is not None:
            rule, reason = violation
            raise HashConflictError(rule, f"{op}: block_lists[{i}]: {reason}; nothing was replayed")
    return lists, parent_of


class FusedReplay:
    """``replay_requests``: a batch of trace requests replayed in one call (TRACE-1019, TRACE-1020),
    over the pool's parts (its blocks, orders and index, reached through its eviction)."""

    def __init__(self, eviction: Eviction, counters: CacheCounters) -> None:
        self.eviction = eviction
        self.blocks = eviction.blocks
        self.orders = eviction.orders
        self.index = eviction.index
        self.counters = counters

    def replay_requests(self, block_lists: Sequence[IntsLike]) -> ReplayedBatch:
        """Replay a batch of requests as :func:`kvref.simulation.replay.replay` does, in one call (TRACE-1019).

        Request ``ids`` in turn, by a holder holding nothing else: ``match(ids)``, allocate the
        misses as far as ``num_available`` allows (TRACE-1015), register them after the hit,
        release all tail first (TRACE-1014). The pool ends exactly as those calls leave it, stats
        and events included. The whole batch is checked first: each entry a chain of hashes, all
        of them one prefix tree (TRACE-1006) agreeing with the resident parents (PFX-306);
        otherwise HashConflictError and nothing changes (ERR-501).
        """
        lists, parent_of = checked_replay_batch(block_lists, self.index.parent)
        # Rebuilding the parents and children at the end costs a pass over the resident hashes:
        # worth it when the batch has at least as many block references.
        rebuild = sum(map(len, lists)) >= len(self.index.copies)
        if rebuild and self.lru_stack_holds():
            return self._replay_lru_stack(lists, parent_of)
        leaf_policy = self.orders.policy.prefix_closed  # its eviction reads the tree
        return self._replay_general(lists, parent_of if rebuild and not leaf_policy else None)

    def _rebuild_tree(self, parent_of: dict[int, int | None]) -> None:
        """Set the parents and children of the resident hashes after a replay that left them stale.

        A hash registered by the batch has its batch parent (``parent_of``, which agrees with the
        resident parents); one the batch never touched is resident since before it, with its old
        parent. ``_children[p]`` counts the resident hashes whose parent is ``p``, as register and
        unregister keep it step by step.
        """
        old = self.index.parent
        parents = {h: parent_of[h] if h in parent_of else old[h] for h in self.index.copies}
        old.clear()
        old.update(parents)
        self.index.children.clear()
        self.index.children.update(Counter(p for p in parents.values() if p is not None))

    def lru_stack_holds(self) -> bool:
        """Whether the cache is an LRU stack of one copy per hash, parents released after children.

        That is: policy lru or lru-leaf, no events to emit, no hashed block in use, one cached copy
        per resident hash, and every resident hash's parent resident and later in the release order.
        A replay keeps all of it, request after request (TRACE-1014 releases tail first, so a
        parent is always released after its children): the oldest cached block is then a leaf, so
        lru and lru-leaf evict alike (EVICT-401, EVICT-403); the cached hashes stay prefix-closed,
        so a request's blocks after its first miss are never cached and no hash gets a second copy.
        Checking costs one pass over the cached blocks.
        """
        if (
            self.orders.policy not in (EvictionPolicy.LRU, EvictionPolicy.LRU_LEAF)
            or self.index.events_on
            or self.orders.hashed_in_use
        ):
            return False
        copies, parents, evictable = self.index.copies, self.index.parent, self.orders.evictable
        if len(copies) != len(evictable):  # nothing cached is in use, so some hash has two copies
            return False
        position = {b: i for i, b in enumerate(evictable)}
        for h, found in copies.items():
            parent = parents[h]
            if parent is not None:
                above = copies.get(parent)
                if above is None or position[above[0]] < position[found[0]]:
                    return False
        return True

    def _replay_lru_stack(self, lists: list[list[int]], parent_of: dict[int, int | None]) -> ReplayedBatch:
        """The replay while :meth:`lru_stack_holds`: a plain LRU over one block per hash.

        Eviction takes the oldest cached block (a leaf, as shown there), each request's blocks after
        its first miss are all fresh, and parents and children are rebuilt from the prefix tree at
        the end instead of being kept step by step. The pool's blocks, free stack, generations,
        hashes and release order change exactly as in the general replay.
        """
        gen, hashes, free, evictable = self.blocks.gen, self.blocks.hash, self.blocks.free, self.orders.evictable
        block_of = {h: found[0] for h, found in self.index.copies.items()}
        cached_block = block_of.get
        take_oldest = evictable.popitem
        usable = self.blocks.num_usable
        hits: list[int] = []
        peak = queries = evicted = 0
        for ids in lists:
            queries += len(ids)
            hit: list[int] = []
            for h in ids:
                b = cached_block(h)
                if b is None:
                    break
                del evictable[b]  # pinned: no hashed block is in use but the request's own
                hit.append(b)
            n_hit = len(hit)
            need = len(ids) - n_hit
            n_free = len(free)
            # TRACE-1015; every cached block is reclaimable here.
            room = need if need <= n_free else min(need, n_free + len(evictable))
            fresh = take_free(free, min(room, n_free))
            for _ in range(room - n_free):
                b = take_oldest(last=False)[0]
                del block_of[hashes[b]]  # type: ignore[arg-type]  # cached blocks are hashed
                fresh.append(b)
            evicted += max(room - n_free, 0)
            for b, h in zip(fresh, ids[n_hit : n_hit + len(fresh)], strict=True):
                gen[b] += 1
                hashes[b] = h
                block_of[h] = b
            occupied = usable - len(free)
            if occupied > peak:
                peak = occupied
            for b in reversed(fresh):
                evictable[b] = None
            for b in reversed(hit):
                evictable[b] = None
            hits.append(n_hit)
        self.index.copies.clear()
        self.index.copies.update({h: [b] for h, b in block_of.items()})
        self._rebuild_tree(parent_of)
        self.counters.evictions += evicted
        self.counters.requests += len(lists)
        self.counters.queries += queries
        self.counters.hits += sum(hits)
        return ReplayedBatch(hits, peak)

    def _replay_general(self, lists: list[list[int]], rebuild_from: dict[int, int | None] | None) -> ReplayedBatch:
        """The replay on any state: each step as the protocol calls make it, without their checks.

        With ``rebuild_from`` (the batch's parents), parents and children are left alone during the
        replay and rebuilt at the end (:meth:`_rebuild_tree`); nothing but lru-leaf eviction reads
        them in between.
        """
        keep_tree = rebuild_from is None
        policy = self.orders.policy
        fifo = policy is EvictionPolicy.FIFO
        ref_zero = policy is EvictionPolicy.REF_ZERO
        leaf_policy = policy.prefix_closed
        by_access = policy.by_access
        ref, gen, hashes, free = self.blocks.ref, self.blocks.gen, self.blocks.hash, self.blocks.free
        copies, parents, children = self.index.copies, self.index.parent, self.index.children
        evictable, registered, pinned = self.orders.evictable, self.orders.registered, self.orders.hashed_in_use
        events = self.index.events if self.index.events_on else None
        kept = self.index.kept
        usable = self.blocks.num_usable
        cached_copies = copies.get
        hits: list[int] = []
        peak = queries = 0
        for ids in lists:
            queries += len(ids)
            # Match (PFX-309): the oldest copy of each hash of the longest resident prefix, pinned.
            # The batch agrees with the resident parents, so residency alone decides a hit.
            hit: list[int] = []
            newly_pinned = 0
            for h in ids:
                found = cached_copies(h)
                if found is None:
                    break
                b = found[0]
                r = ref[b]
                if r == 0:
                    del evictable[b]
                    pinned.add(b)
                    if kept is not None:
                        kept.gain(h)
                    newly_pinned += 1
                ref[b] = r + 1
                hit.append(b)
            n_hit = len(hit)
            if by_access:  # the match's access, then the allocation's (EVICT-411)
                self.orders.stamp_access(hit)
            # Allocate the misses, free blocks first, evicting only the shortfall (EVICT-408); beyond
            # what is available the rest are not cached (TRACE-1015).
            need = len(ids) - n_hit
            n_free = len(free)
            if need <= n_free:
                room = need
            else:
                # POOL-106. When the hit is all that is in use, every cached block is reclaimable,
                # under lru-leaf too: the hit is a chain from the root, so it keeps its own ancestors.
                alone = leaf_policy and len(pinned) == newly_pinned
                room = min(need, n_free + (len(evictable) if alone else self.eviction.reclaimable()))
            fresh = take_free(free, min(room, n_free))
            if room > n_free:
                fresh.extend(self.eviction.victims(room - n_free, keep_tree=keep_tree))
            if by_access:
                self.orders.stamp_access(fresh)
            # Register them chained after the hit (PFX-301); a hash gaining its first copy is stored.
            prev = ids[n_hit - 1] if n_hit else None
            for b, h in zip(fresh, ids[n_hit : n_hit + len(fresh)], strict=True):
                gen[b] += 1
                hashes[b] = h
                found = cached_copies(h)
                if found is None:
                    copies[h] = [b]
                    if keep_tree:
                        parents[h] = prev
                        if prev is not None:
                            children[prev] = children.get(prev, 0) + 1
                    if events is not None:
                        events.append(BlockStored(h, prev))
                else:
                    found.append(b)
                    if len(found) == 2:
                        self.orders.may_be_leaves(found[:1])  # no longer its hash's last copy
                if fifo:
                    registered[b] = None
                prev = h
            occupied = usable - len(free)
            if occupied > peak:
                peak = occupied
            # Release tail first (TRACE-1014): the fresh blocks, then the hit.
            released = fresh[::-1]
            for b in reversed(hit):
                r = ref[b] - 1
                ref[b] = r
                if r == 0:
                    pinned.discard(b)
                    if kept is not None:
                        kept.lose(hashes[b])  # type: ignore[arg-type]
                    released.append(b)
            if ref_zero:  # EVICT-405: the hashes go with the last reference
                free.extend(released)
                self.index.unregister(released, keep_tree=keep_tree)
                self.counters.evictions += len(released)
            else:
                for b in released:
                    evictable[b] = None
            hits.append(n_hit)
        if rebuild_from is not None:
            self._rebuild_tree(rebuild_from)
        self.counters.requests += len(lists)
        self.counters.queries += queries
        self.counters.hits += sum(hits)
        return ReplayedBatch(hits, peak)
