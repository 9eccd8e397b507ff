"""lru-leaf eviction order without a per-victim loop (EVICT-402, EVICT-403, EVICT-404).

The oracle evicts one block at a time: the least recently released block whose eviction keeps
the resident hashes prefix-closed (a copy of a hash with other copies, or the last copy of a
hash with no resident child). Evicting a last copy can make its parent's last copy eligible, so
the order is not simply release order. It is, though, a sort. Give every cached block ``u`` an
*effective time*:

* a copy that is not its hash's last copy (the hash has an in-use copy, or a younger cached
  copy) is eligible now: ``eff(u) = stamp(u)``;
* the last copy of a hash is eligible once every resident child hash is gone, so
  ``eff(u) = max(stamp(u), eff of each child hash's last copy)``, and infinite when a child hash
  has a copy in use (it never goes).

Stamps are distinct, so equal effective times occur only along one ancestor chain (a node and
the ancestors that inherited its time), and there the deeper goes first. The oracle's order is
then exactly ascending ``(eff, -depth)``: the smallest pair is always eligible and always the
least recently released eligible block. See ``spec/04-eviction.md`` (EVICT-403).

:func:`leaf_order` computes this for a *window*: the ``m`` least recently released cached
blocks. A dependency outside the window (a younger last copy, a child whose last copy is
younger) counts as infinite; every finite effective time inside the window is then exact, and
every block outside has a larger one, so the window's finite blocks, in order, are the first
victims. The subtree maxima are taken by pointer doubling: ``log2(depth)`` rounds of one
gather and one scatter-max each, over the window only.
"""

from __future__ import annotations

from kvref_arraypool.ops import Array, ArrayOps

__all__ = ["INF_TIME", "leaf_order"]

#: Effective time of a block that cannot be evicted now; larger than any stamp.
INF_TIME = 1 << 42
_DEPTH_BITS = 20
_DEPTH_MAX = (1 << _DEPTH_BITS) - 1


def leaf_order(
    ops: ArrayOps,
    blocks: Array,
    stamps: Array,
    *,
    entry_of: Array,
    copies: Array,
    children: Array,
    parent_entry: Array,
    depth: Array,
    scratch: Array,
    scratch2: Array,
) -> tuple[Array, int]:
    """Positions of ``blocks`` in lru-leaf eviction order, and how many of them are evictable now.

    ``blocks``/``stamps``: the window, oldest release first. The per-entry arrays describe hash
    entries (copies, resident children, parent entry or -1, depth). ``scratch`` must be all 0 and
    ``scratch2`` all -1 over the entries; both are restored before returning.
    """
    m = len(blocks)
    if m == 0:
        return ops.zeros(0), 0
    e = entry_of[blocks]
    # Copies of each entry inside the window; a hash's last copy is in the window only if all its
    # copies are (an in-use copy or a younger cached one keeps the hash resident).
    ops.scatter_add(scratch, e, 1)
    all_in = scratch[e] == copies[e]
    ops.fill_at(scratch, e, 0)
    ops.scatter_max(scratch2, e, stamps)
    last = all_in & (stamps == scratch2[e])
    ops.fill_at(scratch2, e, -1)

    lb = ops.nonzero(last)
    le = e[lb]
    lpe = parent_entry[le]
    with_parent = lpe >= 0
    pe = lpe[with_parent]
    ops.scatter_add(scratch, pe, 1)
    blocked = scratch[le] != children[le]
    ops.fill_at(scratch, pe, 0)
    value = ops.where(blocked, INF_TIME, stamps[lb])

    # Parent of each last copy, as a position among the last copies (-1: none in the window).
    scratch2[le] = ops.arange(len(lb))
    anc = ops.full(len(lb), -1)
    anc[with_parent] = scratch2[pe]
    ops.fill_at(scratch2, le, -1)
    while True:
        src = ops.nonzero(anc >= 0)
        if len(src) == 0:
            break
        up = anc[src]
        pushed = ops.copy(value)
        ops.scatter_max(pushed, up, value[src])
        value = pushed
        jumped = ops.copy(anc)
        jumped[src] = anc[up]
        anc = jumped

    eff = ops.copy(stamps)
    eff[lb] = value
    d = depth[e]
    d = ops.where(d > _DEPTH_MAX, _DEPTH_MAX, d)
    key = (eff << _DEPTH_BITS) | (_DEPTH_MAX - d)
    order = ops.argsort(key)
    return order, ops.count(eff < INF_TIME)
