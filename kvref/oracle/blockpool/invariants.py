"""Every invariant the spec states, checked over the oracle's explicit state (STATE-00x, EVICT-404).

Reads the state; changes nothing. Raises :class:`~kvref.contract.errors.InvariantViolation` whose rule is
the invariant broken and whose message says what was seen and what the rule expects.
"""

from __future__ import annotations

from collections import Counter

from kvref.contract.errors import InvariantViolation
from kvref.oracle.blockpool.blocks import BlockLists
from kvref.oracle.blockpool.orders import CacheOrders, LeafCandidates
from kvref.oracle.blockpool.prefix import PrefixIndex

__all__ = ["check_pool_invariants"]


def _fail(rule: str, message: str) -> InvariantViolation:
    return InvariantViolation(rule, f"check_invariants: {message}")


def check_pool_invariants(blocks: BlockLists, orders: CacheOrders, index: PrefixIndex) -> None:
    """Verify every invariant of the spec over a pool's parts; raise InvariantViolation naming the rule
    broken (STATE-002..STATE-007, POOL-102, POOL-111, EVICT-404..EVICT-406).

    Checks conservation, reference counts, holders, hash index and prefix closure.
    """
    n = blocks.n
    ref, holders, hashes, gen = blocks.ref, blocks.holders, blocks.hash, blocks.gen
    free = blocks.free
    policy = orders.policy

    # STATE-005: no id twice among the free blocks; a free block has no reference and no hash.
    seen = Counter(free)
    twice = [b for b, c in seen.items() if c > 1]
    if twice:
        raise _fail("STATE-005", f"block(s) {twice} are on the free list more than once")
    for b in free:
        if not 0 <= b < n or blocks.is_reserved[b]:
            raise _fail("POOL-102", f"reserved or out-of-range block {b} is on the free list")
        if ref[b] or hashes[b] is not None:
            raise _fail("STATE-005", f"free block {b} has {ref[b]} reference(s) and hash {hashes[b]!r}")

    in_use = cached = 0
    per_holder: Counter[object] = Counter()
    for b in range(n):
        if gen[b] < 0:
            raise _fail("POOL-111", f"block {b} has negative generation {gen[b]}")
        if blocks.is_reserved[b]:
            if ref[b] or holders[b] is not None or hashes[b] is not None:
                raise _fail("POOL-102", f"reserved block {b} is held or hashed")
            continue
        held = holders[b]
        if ref[b] < 0:
            raise _fail("STATE-002", f"block {b} has negative reference count {ref[b]}")
        if ref[b] == 0:
            if held is not None:
                raise _fail("STATE-002", f"block {b} has no reference but holders {held!r}")
            if hashes[b] is not None:
                cached += 1
                if b not in orders.evictable and policy.value != "ref-zero":
                    raise _fail("STATE-004", f"cached block {b} is missing from the eviction order")
        else:
            in_use += 1
            if not held or any(c < 1 for c in held.values()) or sum(held.values()) != ref[b]:
                raise _fail(
                    "STATE-002",
                    f"block {b} has reference count {ref[b]} but holders {held!r}; "
                    "the count must equal the references the holders hold",
                )
            if b in orders.evictable:
                raise _fail("PFX-310", f"block {b} is in use yet in the eviction order")
            per_holder.update(held)

    hashed_in_use = {b for b in range(n) if ref[b] and hashes[b] is not None}
    if hashed_in_use != orders.hashed_in_use:
        raise _fail(
            "STATE-004",
            f"in-use hashed blocks {sorted(hashed_in_use)} != tracked {sorted(orders.hashed_in_use)}",
        )

    # STATE-003: conservation.
    if len(free) + in_use + cached != blocks.num_usable:
        raise _fail(
            "STATE-003",
            f"free {len(free)} + in use {in_use} + cached {cached} != usable {blocks.num_usable}",
        )
    if cached != len(orders.evictable):
        raise _fail("STATE-004", f"{cached} cached blocks but {len(orders.evictable)} in the eviction order")
    if policy.value == "ref-zero" and cached:
        raise _fail("EVICT-405", f"{cached} unreferenced hashed block(s) stayed cached under ref-zero")

    # STATE-002: the per-holder totals agree with the per-block holders.
    if dict(per_holder) != blocks.held:
        raise _fail("STATE-002", f"per-holder totals {blocks.held!r} != per-block holders {dict(per_holder)!r}")

    # STATE-006: the hash index and the block hashes agree.
    indexed = 0
    for h, copies in index.copies.items():
        if not copies or len(set(copies)) != len(copies):
            raise _fail("STATE-006", f"hash {h:#x} lists copies {copies}")
        for b in copies:
            if hashes[b] != h:
                raise _fail("STATE-006", f"hash {h:#x} lists block {b}, whose hash is {hashes[b]!r}")
        indexed += len(copies)
        if h not in index.parent:
            raise _fail("STATE-006", f"resident hash {h:#x} has no recorded parent")
    hashed = sum(1 for h in hashes if h is not None)
    if indexed != hashed:
        raise _fail("STATE-006", f"{hashed} hashed blocks but {indexed} listed in the hash index")
    if set(index.parent) != set(index.copies):
        raise _fail("STATE-006", "parent links exist for hashes that are not resident")

    # STATE-007: child counts agree with the parent links of resident hashes.
    children = Counter(p for p in index.parent.values() if p is not None)
    if dict(children) != index.children:
        raise _fail("STATE-007", f"child counts {index.children!r} != parent links {dict(children)!r}")

    # EVICT-404: prefix closure where the policy promises it.
    if policy.prefix_closed:
        for h, p in index.parent.items():
            if p is not None and p not in index.copies:
                raise _fail(
                    "EVICT-404",
                    f"resident hash {h:#x} has parent {p:#x} that is not resident (lru-leaf keeps the "
                    "cached set prefix-closed)",
                )
        # POOL-106: the kept hashes, recounted: mark the ancestors of every hash with an in-use copy;
        # each marked hash with no in-use copy of its own must keep one copy.
        own_use = {hashes[b] for b in orders.hashed_in_use}
        busy_below: set[int | None] = set()
        for used in own_use:
            up = index.parent[used]  # type: ignore[index]
            while up is not None and up not in busy_below:
                busy_below.add(up)
                up = index.parent[up]
        kept = len(busy_below - own_use)
        if index.kept is None or index.kept.count != kept:
            counted = None if index.kept is None else index.kept.count
            raise _fail("POOL-106", f"{counted} hashes counted as kept for the in-use blocks below them; {kept} are")
        leaves = orders.evictable
        live = (
            {b for stamp, b in leaves.heap if b in leaves and leaves.stamps[b] == stamp}
            if isinstance(leaves, LeafCandidates)
            else set()
        )
        for b in leaves:
            leaf_hash = hashes[b]
            if (leaf_hash not in index.children or len(index.copies.get(leaf_hash, ())) > 1) and b not in live:
                raise _fail("EVICT-403", f"cached leaf block {b} is missing from the eviction heap")

    # EVICT-406: under fifo every hashed block is in the registration order, and nothing else.
    if policy.value == "fifo" and len(orders.registered) != hashed:
        raise _fail("EVICT-406", f"{hashed} hashed blocks but {len(orders.registered)} in the fifo order")
