"""The array core's batched calls for a scheduler step: allocate_many, free_many, match_many.

Each does in one pass of array operations what the single calls would do in entry order
(POOL-116, POOL-117, PFX-320), over the pool's components; the pool's methods of the same names
are these.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import accumulate, chain, pairwise, repeat
from operator import sub
from typing import Any, NoReturn

import numpy as np

from kvref.contract.checks import explain_release
from kvref.contract.errors import InvalidValueError, InvariantViolation
from kvref.contract.pausing import PausedHolders
from kvref.contract.validate import IntsLike, as_count, as_holder_list, as_list
from kvref_arraypool.eviction import BlockSupply
from kvref_arraypool.holders import HolderIds
from kvref_arraypool.inputs import hash_array, index_array, plain_ints
from kvref_arraypool.ops import Array
from kvref_arraypool.prefix_index import PrefixIndex
from kvref_arraypool.references import ReferenceCounts

__all__ = ["BatchedCalls"]


class BatchedCalls:
    """``allocate_many``, ``free_many`` and ``match_many`` (and their array forms) over a pool's components.

    ``pool`` is the pool they belong to, for the explainers of a refused batch (its public queries);
    ``paused`` its paused holders (POOL-114).
    """

    def __init__(
        self,
        pool: Any,
        *,
        supply: BlockSupply,
        references: ReferenceCounts,
        holders: HolderIds,
        index: PrefixIndex,
        paused: PausedHolders,
    ) -> None:
        self.pool = pool
        self.ops = supply.ops
        self.supply = supply
        self.references = references
        self.holders = holders
        self.index = index
        self.counters = supply.counters
        self.paused = paused

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
        if self.paused.holders:
            for c, h in zip(cs, hs, strict=True):
                self.paused.refuse(h, c, op)
        ends = list(accumulate(cs))
        total = ends[-1] if ends else 0
        if total > self.supply.blocks.num_free:
            room = self.supply.available()
            admitted = next((i for i, end in enumerate(ends) if end > room), len(cs))
            total = ends[admitted - 1] if admitted else 0
            cs, hs, ends = cs[:admitted], hs[:admitted], ends[:admitted]
        if total == 0:
            return self.ops.zeros(0), ends
        ids = self.supply.take(total, op)
        self.references.hand_out(ids, self.holders.per_position(self.ops, cs, hs), cs)
        for c, h in zip(cs, hs, strict=True):
            self.holders.add(h, c)
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
        self.free_flat(host, originals, sizes, hs, op)

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
        self.free_flat(host, items, sizes, hs, op)

    def free_flat(
        self, host: np.ndarray, originals: list[int] | None, sizes: list[int], hs: list[Hashable], op: str
    ) -> None:
        """Release entry after entry of ``host`` (``sizes[i]`` ids of ``hs[i]``), atomically (POOL-117).

        ``originals``: the ids as given, where some lie beyond int64 (``-1`` in ``host``), for messages.
        """
        if len(host) == 0:
            return
        hid_of = list(map(self.holders.ids.get, hs, repeat(-1)))
        per_block = np.repeat(np.array(hid_of, dtype=np.int64), sizes)
        known = -1 not in hid_of or all(hid >= 0 for hid, k in zip(hid_of, sizes, strict=True) if k)
        hids = self.ops.asarray(per_block)

        checked = self.references.check_release(host, hids, known=known)
        if checked is None:
            self._explain_refused(host, originals, sizes, hs, op)
        self.supply.settle(*self.references.release(checked, hids))
        self.holders.drop_many(hs, sizes)

    def _explain_refused(
        self, host: np.ndarray, originals: list[int] | None, sizes: list[int], hs: list[Hashable], op: str
    ) -> NoReturn:
        """Name the first bad entry of a refused batch, holder by holder with its ids in order (ERR-509)."""
        given = originals if originals is not None else host.tolist()
        by_holder: dict[Hashable, list[int]] = {}
        for h, start, end in zip(hs, [0, *accumulate(sizes)], accumulate(sizes), strict=False):
            by_holder.setdefault(h, []).extend(given[start:end])
        for holder, ids in by_holder.items():
            explain_release(self.pool, ids, holder, op)
        raise InvariantViolation("ERR-508", f"{op}: the batch was refused but no entry is at fault")  # pragma: no cover

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
            self.paused.refuse(h, len(hl), op)
        ids, sizes = self.index.lookup_many(lists)
        if sum(sizes):
            self.references.pin(ids, self.holders.per_position(self.ops, sizes, hs), sizes)
            for k, h in zip(sizes, hs, strict=True):
                self.holders.add(h, k)
        counters = self.counters
        counters.requests += len(lists)
        counters.queries += sum(len(hl) for hl in lists)
        counters.hits += sum(sizes)
        flat = self.ops.tolist(ids)
        ends = list(accumulate(sizes))
        return [flat[end - k : end] for k, end in zip(sizes, ends, strict=True)]


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
