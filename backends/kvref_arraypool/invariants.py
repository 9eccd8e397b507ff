"""Every invariant of the spec, checked over the array core's state with array operations (STATE-00x).

Reads the state; changes nothing except scratch arrays. Raises
:class:`~kvref.contract.errors.InvariantViolation` whose rule is the invariant broken and whose message
says what was seen and what the rule expects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

import numpy as np

from kvref.contract.errors import InvariantViolation
from kvref.contract.policies import EvictionPolicy
from kvref_arraypool.blocks import BlockArrays
from kvref_arraypool.holders import HolderIds
from kvref_arraypool.host_arrays import count_distinct
from kvref_arraypool.orders import CacheOrders
from kvref_arraypool.prefix_index import PrefixIndex
from kvref_arraypool.references import ReferenceCounts

__all__ = ["check_pool_invariants"]


def _fail(rule: str, message: str) -> InvariantViolation:
    return InvariantViolation(rule, f"check_invariants: {message}")


def check_pool_invariants(
    blocks: BlockArrays, orders: CacheOrders, index: PrefixIndex, references: ReferenceCounts, holder_ids: HolderIds
) -> None:
    """Verify every invariant of the spec over a pool's parts; raise InvariantViolation naming the rule
    (STATE-002..STATE-007, EVICT-404..EVICT-406).

    Conservation, reference counts and holders, the hash index, child counts, the orders.
    """
    ops = blocks.ops
    host = ops.to_host
    counts, policy = references.shared, orders.policy
    n = blocks.n
    ref, owner, bhash, bentry = host(blocks.ref), host(blocks.owner), host(blocks.hash), host(blocks.entry)
    gen, evstamp = host(blocks.gen), host(blocks.released)
    reserved = blocks.host_reserved
    free = host(blocks.free_blocks())

    # STATE-005 / POOL-102: the free stack.
    if count_distinct(free) != len(free):
        raise _fail("STATE-005", f"a block is on the free stack more than once: {free.tolist()}")
    if len(free) and (free.min() < 0 or free.max() >= n or reserved[free].any()):
        raise _fail("POOL-102", f"reserved or out-of-range block on the free stack: {free.tolist()}")
    bad_free = free[(ref[free] != 0) | (bhash[free] >= 0)] if len(free) else free
    if len(bad_free):
        b = int(bad_free[0])
        raise _fail("STATE-005", f"free block {b} has {ref[b]} reference(s) and hash {bhash[b]}")
    if reserved.any() and ((ref[reserved] != 0).any() or (bhash[reserved] >= 0).any() or (owner[reserved] != -1).any()):
        raise _fail("POOL-102", "a reserved block is held or hashed")
    if (gen < 0).any():
        raise _fail("POOL-111", f"negative generation on block(s) {np.flatnonzero(gen < 0).tolist()}")

    # STATE-002: reference counts, owners and holders.
    if (ref < 0).any():
        raise _fail("STATE-002", f"negative reference count on block(s) {np.flatnonzero(ref < 0).tolist()}")
    unowned = (ref > 0) != (owner != -1)
    if unowned.any():
        b = int(np.flatnonzero(unowned)[0])
        raise _fail("STATE-002", f"block {b} has reference count {ref[b]} but owner code {owner[b]}")
    layout = counts.fault()
    if layout is not None:
        raise _fail("STATE-002", f"per-holder counts of shared blocks: {layout}")
    keys, values = (host(a) for a in counts.items())  # every counted pair, inline or in the table
    per_block = np.zeros(n, dtype=np.int64)
    np.add.at(per_block, keys >> 32, values)
    shared = owner == -2
    if (values <= 0).any() or (per_block[~shared] != 0).any() or (per_block[shared] != ref[shared]).any():
        raise _fail("STATE-002", "per-holder counts of shared blocks do not add up to their reference counts")
    totals: Counter[Hashable] = Counter()
    sole = np.flatnonzero(owner >= 0)
    for hid, count in zip(owner[sole].tolist(), ref[sole].tolist(), strict=True):
        totals[holder_ids.holder_of[hid]] += count
    for key, count in zip(keys.tolist(), values.tolist(), strict=True):
        totals[holder_ids.holder_of[key & 0xFFFFFFFF]] += count
    if dict(totals) != holder_ids.held:
        raise _fail("STATE-002", f"per-holder totals {holder_ids.held!r} != per-block holders {dict(totals)!r}")

    # STATE-003 / STATE-004: conservation and the eviction order.
    in_use = int(((ref > 0) & ~reserved).sum())
    cached_mask = (ref == 0) & (bhash >= 0)
    cached = int(cached_mask.sum())
    if blocks.num_free + in_use + cached != blocks.num_usable:
        raise _fail(
            "STATE-003", f"free {blocks.num_free} + in use {in_use} + cached {cached} != usable {blocks.num_usable}"
        )
    if cached != orders.num_cached:
        raise _fail("STATE-004", f"{cached} cached blocks but the counter says {orders.num_cached}")
    if policy is EvictionPolicy.REF_ZERO and cached:
        raise _fail("EVICT-405", f"{cached} unreferenced hashed block(s) stayed cached under ref-zero")
    order = np.array(orders.eviction_order(), dtype=np.int64)
    if not np.array_equal(np.sort(order), np.flatnonzero(cached_mask)):
        raise _fail(
            "STATE-004", f"eviction order {order.tolist()} != cached blocks {np.flatnonzero(cached_mask).tolist()}"
        )
    if ((evstamp >= 0) != cached_mask).any():
        raise _fail("PFX-310", "a block in use (or unhashed) has a release stamp, or a cached one lacks it")

    # STATE-006 / STATE-007: hash index, entries and child counts.
    index_keys, index_entries = (host(a) for a in index.index.items())
    ehash, ecopies, echildren = host(index.hash_of), host(index.copies), host(index.children)
    eparent, epentry, ehead = host(index.parent_hash), host(index.parent_entry), host(index.head)
    if not np.array_equal(ehash[index_entries], index_keys):
        raise _fail("STATE-006", "the hash index points at entries holding other hashes")
    hashed = np.flatnonzero(bhash >= 0)
    if (bentry[hashed] < 0).any() or not np.array_equal(ehash[bentry[hashed]], bhash[hashed]):
        raise _fail("STATE-006", "a hashed block's entry holds another hash")
    copies = np.zeros(len(ehash), dtype=np.int64)
    np.add.at(copies, bentry[hashed], 1)
    if not np.array_equal(copies[index_entries], ecopies[index_entries]) or copies.sum() != len(hashed):
        raise _fail("STATE-006", f"{len(hashed)} hashed blocks disagree with the copy counts of the hash index")
    resident = index_entries[ecopies[index_entries] > 0]
    if (bentry[ehead[resident]] != resident).any():
        raise _fail("STATE-006", "a resident hash's oldest copy is not one of its copies")
    alive = (ecopies[index_entries] > 0) | (echildren[index_entries] > 0)
    if not alive.all():
        raise _fail("STATE-007", "the hash index keeps an entry with no copy and no resident child")
    with_parent = resident[epentry[resident] >= 0]
    kids = np.zeros(len(ehash), dtype=np.int64)
    np.add.at(kids, epentry[with_parent], 1)
    if not np.array_equal(kids[index_entries], echildren[index_entries]):
        raise _fail("STATE-007", "child counts disagree with the parent links of resident hashes")
    if (ehash[epentry[with_parent]] != eparent[with_parent]).any():
        raise _fail("STATE-007", "a resident hash's parent entry holds another hash than its parent")
    if ((eparent[resident] >= 0) != (epentry[resident] >= 0)).any():
        raise _fail("STATE-007", "a resident hash has a parent hash but no parent entry, or the reverse")

    # EVICT-404: prefix closure where the policy promises it.
    if policy.prefix_closed and len(with_parent) and (ecopies[epentry[with_parent]] == 0).any():
        raise _fail(
            "EVICT-404", "a resident hash has a parent that is not resident (lru-leaf keeps the set prefix-closed)"
        )

    # EVICT-406: under fifo every hashed block is in the registration order, and nothing else.
    if policy is EvictionPolicy.FIFO:
        registered = np.array(ops.tolist(orders.fifo.oldest(n)), dtype=np.int64)
        if not np.array_equal(np.sort(registered), hashed):
            raise _fail("EVICT-406", f"{len(hashed)} hashed blocks but {len(registered)} in the fifo order")
