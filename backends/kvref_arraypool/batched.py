"""The array core's batched calls for a scheduler step: allocate_many, free_many, match_many.

Each does in one pass of array operations what the single calls would do in entry order
(POOL-116, POOL-117, PFX-320).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import accumulate, chain, pairwise, repeat
from operator import sub

import numpy as np

from kvref.contract.errors import InvalidValueError
from kvref.contract.validate import IntsLike, as_count, as_holder_list, as_list
from kvref_arraypool.host_flags import any_true
from kvref_arraypool.inputs import hash_array, index_array, plain_ints
from kvref_arraypool.ops import Array
from kvref_arraypool.state import ArrayPoolState

__all__ = ["BatchedCalls"]


class BatchedCalls(ArrayPoolState):
    """``allocate_many``, ``free_many`` and ``match_many`` over the array core."""

    def allocate_many(self, counts: IntsLike, *, holders: Sequence[Hashable]) -> list[list[int]]:
        """Admit the longest prefix of the batch that fits, in order, in one pass (POOL-116).

        Entry ``i`` asks ``counts[i]`` blocks for ``holders[i]``; admission stops at the first
        entry that does not fit. The admitted entries take their blocks from one pop of the free
        stack (and one eviction for the shortfall), in entry order, exactly as single calls would.
        """
        ids, ends = self._allocate_many(counts, holders, "allocate_many")
        flat = self.ops.tolist(ids)
        return [flat[start:end] for start, end in pairwise([0, *ends])]

    def allocate_many_ids(self, counts: IntsLike, *, holders: Sequence[Hashable]) -> tuple[Array, list[int]]:
        """``allocate_many`` (POOL-116) for a caller that keeps block tables as arrays.

        Returns every admitted entry's ids, entry after entry, as one fresh device array (int64),
        and ``admitted + 1`` host offsets into it: entry ``i`` got ``ids[offsets[i]:offsets[i + 1]]``.
        """
        ids, ends = self._allocate_many(counts, holders, "allocate_many_ids")
        return self.ops.export(ids), [0, *ends]

    def _allocate_many(self, counts: IntsLike, holders: Sequence[Hashable], op: str) -> tuple[Array, list[int]]:
        """The blocks of the admitted entries in one array, and where each admitted entry ends in it."""
        given = plain_ints(counts)
        if given is None:
            host, items = index_array(counts, op=op, arg="counts")
            given = items if items is not None else host.tolist()  # huge counts are -1 in ``host``
        if given and min(given) >= 0:  # ints, none negative: counts as they are
            cs = given
        else:
            cs = [as_count(c, op=op, arg=f"counts[{i}]") for i, c in enumerate(given)]
        hs = as_holder_list(holders, len(cs), op=op)
        if self._paused:
            for c, h in zip(cs, hs, strict=True):
                self._refuse_if_paused(h, c, op)
        ends = list(accumulate(cs))
        total = ends[-1] if ends else 0
        admitted = len(cs)
        if total > self._nfree:
            room = self._nfree + self._reclaimable()
            admitted = next((i for i, end in enumerate(ends) if end > room), len(cs))
            total = ends[admitted - 1] if admitted else 0
            cs, hs, ends = cs[:admitted], hs[:admitted], ends[:admitted]
        if total == 0:
            return self.ops.zeros(0), ends
        ids = self._take(total, op)
        self._hand_out(ids, self._holder_ids(cs, hs), cs)
        held = self._held
        for c, h in zip(cs, hs, strict=True):
            if c:
                held[h] = held.get(h, 0) + c
        return ids, ends

    def free_many(self, block_lists: Sequence[IntsLike], *, holders: Sequence[Hashable]) -> None:
        """``free(block_lists[i], holder=holders[i])`` for each ``i`` in order, atomically (POOL-117).

        The whole batch is checked first, duplicates across entries of one holder included, so a
        bad entry anywhere leaves every reference in place.
        """
        op = "free_many"
        entries = as_list(block_lists, op=op, arg="block_lists")
        flat = _flat_ints(entries)
        originals = None
        if flat is not None:  # lists of ints, as allocate_many returns them: one conversion for the batch
            host, sizes = flat
        else:
            arrays = [index_array(ids, op=op, arg=f"block_lists[{i}]") for i, ids in enumerate(entries)]
            host = np.concatenate([a for a, _ in arrays]) if arrays else np.zeros(0, dtype=np.int64)
            sizes = [len(a) for a, _ in arrays]
            if any(items is not None for _, items in arrays):  # values beyond int64 are -1 in ``host``
                originals = list(chain.from_iterable(a.tolist() if i is None else i for a, i in arrays))
        hs = as_holder_list(holders, len(entries), op=op)
        self._free_flat(host, originals, sizes, hs, op)

    def free_many_ids(self, block_ids: IntsLike, offsets: IntsLike, *, holders: Sequence[Hashable]) -> None:
        """``free_many`` (POOL-117) of entries laid end to end, as ``allocate_many_ids`` returns them.

        Entry ``i`` is ``block_ids[offsets[i]:offsets[i + 1]]``, released by ``holders[i]``.
        ``offsets`` are ``len(holders) + 1`` integers (ERR-503) from 0 to ``len(block_ids)``
        (ERR-506), none below the one before (a negative count, ERR-504); a bad call drops nothing.
        """
        op = "free_many_ids"
        host, items = index_array(block_ids, op=op)
        bounds = plain_ints(offsets)
        if bounds is None:
            read, given = index_array(offsets, op=op, arg="offsets")
            bounds = given if given is not None else read.tolist()  # ``read`` has -1 for values beyond int64
        if not bounds or bounds[0] != 0 or bounds[-1] != len(host):
            ends = f"{bounds[0]} to {bounds[-1]}" if bounds else "none"
            raise InvalidValueError("ERR-506", f"{op}: offsets must run from 0 to {len(host)}, got {ends}")
        hs = as_holder_list(holders, len(bounds) - 1, op=op)
        sizes = list(map(sub, bounds[1:], bounds[:-1]))
        if sizes and min(sizes) < 0:
            at = next(i for i, k in enumerate(sizes) if k < 0)
            raise InvalidValueError(
                "ERR-504",
                f"{op}: offsets[{at + 1}] = {bounds[at + 1]} is below offsets[{at}] = {bounds[at]}: a negative count",
            )
        self._free_flat(host, items, sizes, hs, op)

    def _free_flat(
        self, host: np.ndarray, originals: list[int] | None, sizes: list[int], hs: list[Hashable], op: str
    ) -> None:
        """Release entry after entry of ``host`` (``sizes[i]`` ids of ``hs[i]``), atomically (POOL-117).

        ``originals``: the ids as given, where some lie beyond int64 (``-1`` in ``host``), for messages.
        """
        if len(host) == 0:
            return
        hid_of = list(map(self._hids.get, hs, repeat(-1)))
        per_block = np.repeat(np.array(hid_of, dtype=np.int64), sizes)
        known = -1 not in hid_of or all(hid >= 0 for hid, k in zip(hid_of, sizes, strict=True) if k)
        hids = self.ops.asarray(per_block)

        def groups() -> list[tuple[Hashable, int, np.ndarray, list[int] | None]]:
            """Each holder with its ids in order, for naming the first bad entry (only a refused batch asks)."""
            given = originals if originals is not None else host.tolist()
            by_holder: dict[Hashable, tuple[list[np.ndarray], list[int]]] = {}
            for h, start, end in zip(hs, [0, *accumulate(sizes)], accumulate(sizes), strict=False):
                chunks, values = by_holder.setdefault(h, ([], []))
                chunks.append(host[start:end])
                values.extend(given[start:end])
            return [(h, self._hids.get(h, -1), np.concatenate(c), o) for h, (c, o) in by_holder.items()]

        ids, distinct, sole, flags = self._check_release(host, None, hids, groups, None, op, known=known)
        self._release(ids, hids, distinct, sole=sole, flags=flags)
        self._drop_held_many(hs, sizes)

    def _drop_held_many(self, holders: Sequence[Hashable], counts: Sequence[int]) -> None:
        """``_drop_held(holders[i], counts[i])`` for each ``i``, inlined for a batch."""
        held, known, spare = self._held, self._hids, self._spare_hids
        for h, k in zip(holders, counts, strict=True):
            if k:
                left = held[h] - k
                if left:
                    held[h] = left
                else:
                    del held[h]
                    spare.append(known.pop(h))

    def match_many(self, hash_lists: Sequence[IntsLike], *, holders: Sequence[Hashable]) -> list[list[int]]:
        """``match(hash_lists[i], holder=holders[i])`` for each ``i`` in order (PFX-320).

        Lookups change nothing, so all run on the state before the batch; the hits are then
        pinned in one pass.
        """
        op = "match_many"
        entries = as_list(hash_lists, op=op, arg="hash_lists")
        lists = [hash_array(hl, op=op, arg=f"hash_lists[{i}]") for i, hl in enumerate(entries)]
        hs = as_holder_list(holders, len(lists), op=op)
        for h, hl in zip(hs, lists, strict=True):
            self._refuse_if_paused(h, len(hl), op)
        ids, sizes = self._lookup_many(lists)
        if sum(sizes):
            self._pin(ids, self._holder_ids(sizes, hs), sizes)
            for k, h in zip(sizes, hs, strict=True):
                self._add_held(h, k)
        self._requests += len(lists)
        self._queries += sum(len(hl) for hl in lists)
        self._hits += sum(sizes)
        flat = self.ops.tolist(ids)
        ends = list(accumulate(sizes))
        return [flat[end - k : end] for k, end in zip(sizes, ends, strict=True)]

    def _holder_ids(self, counts: Sequence[int], holders: Sequence[Hashable]) -> Array:
        """Holder id of each of ``counts[i]`` positions of entry ``i``, as one device array (one copy in).

        Ids are given to the holders of non-empty entries in entry order, as single calls would.
        """
        hids = np.array(self._entry_hids(counts, holders), dtype=np.int64)
        return self.ops.asarray(np.repeat(hids, np.asarray(counts, dtype=np.int64)))

    def _entry_hids(self, counts: Sequence[int], holders: Sequence[Hashable]) -> list[int]:
        """Holder id of each entry (-1 for an empty one), given to holders in entry order, as single calls would."""
        known, spare, holder_of = self._hids, self._spare_hids, self._holder_of
        out = []
        for c, h in zip(counts, holders, strict=True):
            hid = known.get(h) if c else -1
            if hid is None:
                if spare:  # ``_hid`` inlined for a batch of new holders
                    hid = known[h] = spare.pop()
                    holder_of[hid] = h
                else:
                    hid = self._hid(h)
            out.append(hid)
        return out

    def _lookup_many(self, lists: Sequence[np.ndarray]) -> tuple[Array, list[int]]:
        """The hits of every chain from the root, in one pass: their blocks (concatenated) and lengths.

        All chains are looked up together on the state before the batch, as ``match_many`` promises
        (PFX-320): one probe of the index for every hash, one segmented minimum for the first miss
        of each chain, one gather of the oldest copies. One host read, of the lengths (two where a
        hash sat far from its home slot: :meth:`HashTable.find_near`).
        """
        ops = self.ops
        lengths = np.array([len(hl) for hl in lists], dtype=np.int64)
        total = int(lengths.sum())
        if total == 0:
            return ops.zeros(0), [0] * len(lists)
        flat = np.concatenate(lists)
        starts = np.cumsum(lengths) - lengths
        segment = np.repeat(np.arange(len(lists), dtype=np.int64), lengths)
        position = np.arange(total, dtype=np.int64) - starts[segment]
        prev = np.concatenate([np.array([-1], dtype=np.int64), flat[:-1]])
        prev[position == 0] = -1  # every chain starts at the root
        hashes = ops.asarray(flat)
        entries, far = self._index.find_near(hashes)
        seg, pos, parents = ops.asarray(segment), ops.asarray(position), ops.asarray(prev)
        k = len(lists)
        while True:
            safe, ok = self._chained(entries, parents)
            hit_length = ops.asarray(lengths.copy())
            ops.scatter_min(hit_length, seg, ops.where(ok, total, pos))
            read = ops.to_host(ops.concat([hit_length, ops.cast(far, "int64")]) if far is not None else hit_length)
            if far is None or not any_true(read[k:] != 0):
                break
            entries, far = self._entries_of(hashes), None  # a hash far from home: the exact probe
        hits = read[:k]
        first = np.repeat(starts - (np.cumsum(hits) - hits), hits)  # each hit's position in ``flat``
        at = first + np.arange(int(hits.sum()), dtype=np.int64)
        return self._ehead[safe[ops.asarray(at)]], hits.tolist()


def _flat_ints(entries: list[object]) -> tuple[np.ndarray, list[int]] | None:
    """Every entry's ids as one host int64 array, and each entry's length, when every entry is a
    list of Python ints within int64; else None (each entry then goes through ``index_array``,
    which names what is wrong, in entry order)."""
    if set(map(type, entries)) != {list}:
        return None
    lists: list[list[int]] = entries  # type: ignore[assignment]
    flat = list(chain.from_iterable(lists))
    if not set(map(type, flat)) <= {int}:
        return None
    try:
        return np.array(flat, dtype=np.int64), [len(e) for e in lists]
    except OverflowError:
        return None
