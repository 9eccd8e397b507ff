"""A pool's common release and pin as numba kernels (imported by :mod:`kvref_arraypool.host_jit` only where numba is).

:func:`release_distinct` is ``free`` of pairwise distinct blocks each held by its entry's holder
(alone or shared), checked and applied in one pass over the pool's own arrays: what
``_check_release``'s fast reads, ``_release`` and ``_settle`` do on the array path for that case, in
the same order.
:func:`pin_distinct` is ``acquire`` (and ``match``'s pin) of pairwise distinct blocks for one
holder: its checks, then ``_pin_few``'s changes block by block. :func:`register` and
:func:`unregister` are ``_register_few`` and ``_unregister_few`` for any number of blocks.
"""

from __future__ import annotations

from typing import Any

from numba import njit

from kvref_arraypool.host_jit_kernels import count_pair, erase, pair_count, pair_key, put_key, slot_of, uncount_pair

__all__ = ["pin_distinct", "register", "release_distinct", "unregister"]

_NOBODY = -1  # kvref_arraypool.state.NOBODY
_SHARED = -2  # kvref_arraypool.state.SHARED
_TOMB = -2  # kvref_arraypool.table.TOMB


@njit(cache=True, _nrt=False)
def release_distinct(ids: Any, hids: Any, n: Any, owner: Any, ref: Any, mark: Any, bhash: Any, evstamp: Any,
                     stack: Any, nfree: Any, qblocks: Any, qstamps: Any, qtail: Any, clock: Any, hid0: Any,
                     count0: Any, hid1: Any, count1: Any, spilled: Any, tkeys: Any, tvalues: Any,
                     mask: Any) -> Any:  # fmt: skip
    """Drop one reference of ``hids[i]`` to ``ids[i]`` for every ``i``, in order, if every id is in
    ``[0, n)`` and held by ``hids[i]`` (alone, or with a count among the shared ones), and none
    comes twice; else change nothing (but ``mark``, the pool's scratch). A shared block's pair
    loses the reference too. A block reaching zero is nobody's: pushed on the free stack, or,
    hashed, stamped ``clock``, ``clock + 1``, ... and appended to the eviction order (room made by
    the caller). Returns (accepted, free count, order tail, blocks cached, table keys deleted)."""
    m = ids.shape[0]
    for i in range(m):
        b = ids[i]
        if b < 0 or b >= n:
            return False, nfree, qtail, 0, 0
        holds = owner[b]
        if holds != hids[i] and (
            holds != _SHARED or pair_count(hid0, count0, hid1, count1, spilled, tkeys, tvalues, mask, b, hids[i]) < 1
        ):
            return False, nfree, qtail, 0, 0
        mark[b] = i
    for i in range(m):
        if mark[ids[i]] != i:  # a block that comes twice
            return False, nfree, qtail, 0, 0
    cached = 0
    deleted = 0
    for i in range(m):
        b = ids[i]
        if owner[b] == _SHARED:
            deleted += uncount_pair(hid0, count0, hid1, count1, spilled, tkeys, tvalues, mask, b, hids[i], 1)
        left = ref[b] - 1
        ref[b] = left
        if left:
            continue
        owner[b] = _NOBODY
        if bhash[b] >= 0:
            evstamp[b] = clock + cached
            qblocks[qtail] = b
            qstamps[qtail] = clock + cached
            qtail += 1
            cached += 1
        else:
            stack[nfree] = b
            nfree += 1
    return True, nfree, qtail, cached, deleted


@njit(cache=True, _nrt=False)
def pin_distinct(ids: Any, hid: Any, n: Any, reserved: Any, ref: Any, bhash: Any, owner: Any, evstamp: Any, mark: Any,
                 hid0: Any, count0: Any, hid1: Any, count1: Any, spilled: Any, tkeys: Any, tvalues: Any,
                 mask: Any, room: Any) -> Any:  # fmt: skip
    """One more reference of holder ``hid`` to each of ``ids``, if every id is in ``[0, n)``, not
    reserved, in use or cached, and none comes twice; else change nothing (but ``mark``). A cached
    block leaves the eviction order; a block another holder holds alone becomes shared, both
    counts moving to its free inline slots. Returns (status, blocks taken out of the cache, keys
    added to the table, deleted slots taken); status 1: done; 0: refused; 2: nothing changed
    because the per-holder table has ``room`` for fewer new keys than the call needs (the second
    value is then how many: make room and call again)."""
    m = ids.shape[0]
    for i in range(m):
        b = ids[i]
        if b < 0 or b >= n or reserved[b] or (ref[b] == 0 and bhash[b] < 0):
            return 0, 0, 0, 0
        mark[b] = i
    need = 0
    for i in range(m):
        b = ids[i]
        if mark[b] != i:
            return 0, 0, 0, 0
        third = owner[b] == _SHARED and hid0[b] >= 0 and hid1[b] >= 0 and hid0[b] != hid and hid1[b] != hid
        if third and (spilled[b] == 0 or slot_of(tkeys, mask, pair_key(b, hid)) < 0):  # a new key in the table
            need += 1
    if need > room:
        return 2, need, 0, 0
    uncached = 0
    added = 0
    tombs = 0
    for i in range(m):
        b = ids[i]
        holds = owner[b]
        if holds == _NOBODY:  # cached: it leaves the eviction order (PFX-310)
            evstamp[b] = -1
            uncached += 1
            owner[b] = hid
        elif holds == _SHARED:
            a, t = count_pair(hid0, count0, hid1, count1, spilled, tkeys, tvalues, mask, b, hid, 1)
            added += a
            tombs += t
        elif holds != hid:  # a second holder: both counts move to the shared counts
            a, t = count_pair(hid0, count0, hid1, count1, spilled, tkeys, tvalues, mask, b, holds, ref[b])
            added += a
            tombs += t
            a, t = count_pair(hid0, count0, hid1, count1, spilled, tkeys, tvalues, mask, b, hid, 1)
            added += a
            tombs += t
            owner[b] = _SHARED
        ref[b] += 1
    return 1, uncached, added, tombs


@njit(cache=True, _nrt=False)
def unregister(victims: Any, bentry: Any, evstamp: Any, bhash: Any, regstamp: Any, ecopies: Any, ehead: Any,
               ehash: Any, epentry: Any, echildren: Any, estack: Any, nefree: Any, tkeys: Any, tvalues: Any,
               mask: Any, mark: Any, buf: Any, lost: Any) -> Any:  # fmt: skip  # pragma: no cover - compiled
    """Remove the hash registration of distinct hashed ``victims``, as ``_unregister_few`` does: each
    block forgets its hash, entry and stamps and its entry loses a copy; an entry whose head copy
    left (copies remain) goes to ``lost`` for the caller to renew; an entry left with no copies
    loses a child from its parent entry; then every such entry and parent with neither copies nor
    children is dead: its hash leaves the index, the entry goes back on the entry stack (in the
    order the victims first name them; entry ids are the pool's own). ``mark``: scratch over the
    entries, all -1, and so left; ``buf``: scratch of at least 3 * len(victims). Each pass touches
    few arrays, so the CPU keeps many of its scattered reads in flight. Returns (blocks that were
    cached, entries free, heads lost, index keys deleted: erased, no tombstones)."""
    m = victims.shape[0]
    for i in range(m):
        buf[i] = bentry[victims[i]]
    uncached = 0
    for i in range(m):
        if evstamp[victims[i]] >= 0:
            uncached += 1
    for i in range(m):
        b = victims[i]
        evstamp[b] = -1
        bhash[b] = -1
        bentry[b] = -1
        regstamp[b] = -1
    k = 0
    for i in range(m):  # copies drop; each entry kept once, in first-named order
        e = buf[i]
        ecopies[e] -= 1
        if mark[e] < 0:
            mark[e] = 0
            buf[k] = e
            k += 1
    nlost = 0
    ncand = 0
    for j in range(k):
        e = buf[j]
        mark[e] = -1
        if ecopies[e] > 0:
            if bentry[ehead[e]] != e:
                lost[nlost] = e
                nlost += 1
            continue
        buf[m + ncand] = e
        ncand += 1
        p = epentry[e]
        if p >= 0:
            echildren[p] -= 1
            buf[m + ncand] = p
            ncand += 1
    deleted = 0
    for j in range(m, m + ncand):
        e = buf[j]
        if mark[e] >= 0:  # named twice (an entry and another's parent)
            continue
        mark[e] = 0
        if ecopies[e] != 0 or echildren[e] != 0:
            continue
        slot = slot_of(tkeys, mask, ehash[e])
        if slot >= 0:
            erase(tkeys, tvalues, mask, slot)
            deleted += 1
        ehash[e] = -1
        ehead[e] = -1
        estack[nefree] = e
        nefree += 1
    for j in range(m, m + ncand):
        mark[buf[j]] = -1
    return uncached, nefree, nlost, deleted


@njit(cache=True, _nrt=False)
def register(ids: Any, hs: Any, parent: Any, parent_entry: Any, n: Any, reserved: Any, ref: Any, bhash: Any,
             bentry: Any, regstamp: Any, tkeys: Any, tvalues: Any, mask: Any, ecopies: Any, eparent: Any,
             echildren: Any, ehead: Any, epentry: Any, edepth: Any, ehash: Any, estack: Any, nefree: Any, clock: Any,
             mark: Any, entries: Any, resident: Any) -> Any:  # fmt: skip  # pragma: no cover - compiled
    """``register`` of ``ids`` under distinct ``hs`` (chained from ``parent``), as ``_register_few``
    does, if nothing needs explaining: distinct ids (``mark``: the pool's scratch), each hash unlike
    its parent, ids in range, unreserved, in use and unhashed, a resident hash under the same
    parent, an absent one with no resident children; else change nothing (but ``mark``). New
    entries come off the entry stack in position order and go into the index (room made by the
    caller); ``entries`` and ``resident`` get each position's entry and whether its hash was
    resident already. Each pass touches few arrays.
    Returns (accepted, entries free, index keys added, deleted index slots taken)."""
    m = hs.shape[0]
    for i in range(m):
        b = ids[i]
        if b < 0 or b >= n or hs[i] == (parent if i == 0 else hs[i - 1]):
            return False, nefree, 0, 0
        if reserved[b] or ref[b] == 0 or bhash[b] >= 0:
            return False, nefree, 0, 0
        mark[b] = i
    for i in range(m):
        if mark[ids[i]] != i:  # a block named twice
            return False, nefree, 0, 0
    for i in range(m):
        slot = slot_of(tkeys, mask, hs[i])
        entries[i] = tvalues[slot] if slot >= 0 else -1
    absent = 0
    for i in range(m):
        e = entries[i]
        here = e >= 0 and ecopies[e] > 0
        if (here and eparent[e] != (parent if i == 0 else hs[i - 1])) or (not here and e >= 0 and echildren[e] > 0):
            return False, nefree, 0, 0
        resident[i] = here
        if e < 0:
            absent += 1
    top = nefree - absent
    j = 0
    tombs = 0
    for i in range(m):  # new entries from the entry stack, in position order, into the index
        if entries[i] >= 0:
            continue
        e = estack[top + j]
        j += 1
        entries[i] = e
        tombs += put_key(tkeys, tvalues, mask, hs[i], e)
        ehash[e] = hs[i]
        echildren[e] = 0
    base = edepth[parent_entry] + 1 if parent_entry >= 0 else 0
    for i in range(m):
        e = entries[i]
        if resident[i]:
            ecopies[e] += 1
            continue
        pe = parent_entry if i == 0 else entries[i - 1]
        ecopies[e] = 1
        ehead[e] = ids[i]
        eparent[e] = parent if i == 0 else hs[i - 1]
        epentry[e] = pe
        edepth[e] = base + i
        if pe >= 0:
            echildren[pe] += 1
    for i in range(m):
        b = ids[i]
        bhash[b] = hs[i]
        bentry[b] = entries[i]
        regstamp[b] = clock + i
    return True, top, absent, tombs
