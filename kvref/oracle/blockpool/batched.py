"""The oracle's batched calls for a scheduler step: allocate_many, free_many, match_many (POOL-116, POOL-117, PFX-320).

Each is defined as the single calls in entry order; the whole batch is checked before anything
changes. The pool's methods of the same names are these.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from kvref.contract.errors import OutOfBlocksError
from kvref.contract.pausing import PausedHolders
from kvref.contract.validate import IntsLike, as_block_id_list, as_count, as_hash_list, as_holder_list, as_list
from kvref.oracle.blockpool.references import ReferenceCounts

__all__ = ["BatchedCalls"]


class BatchedCalls:
    """``allocate_many``, ``free_many`` and ``match_many`` over the single calls' state changes.

    ``allocate`` is the pool's single ``allocate``; ``match`` its checked match (hashes, parent,
    holder); ``paused`` its paused holders.
    """

    def __init__(
        self,
        references: ReferenceCounts,
        *,
        allocate: Callable[..., list[int]],
        match: Callable[[list[int], int | None, Hashable], list[int]],
        paused: PausedHolders,
    ) -> None:
        self.references = references
        self.allocate = allocate
        self.match = match
        self.paused = paused

    def allocate_many(self, counts: IntsLike, *, holders: Sequence[Hashable]) -> list[list[int]]:
        """Admit the longest prefix of the batch that fits, in order (POOL-116).

        Entry ``i`` asks ``counts[i]`` blocks for ``holders[i]``; admission stops at the first
        entry that does not fit, and later entries are not tried. Bad input anywhere in the batch
        raises before any block is taken (ERR-501).
        """
        op = "allocate_many"
        cs = [
            as_count(c, op=op, arg=f"counts[{i}]") for i, c in enumerate(as_block_id_list(counts, op=op, arg="counts"))
        ]
        hs = as_holder_list(holders, len(cs), op=op)
        for c, h in zip(cs, hs, strict=True):
            self.paused.refuse(h, c, op)
        out: list[list[int]] = []
        for c, h in zip(cs, hs, strict=True):
            try:
                out.append(self.allocate(c, holder=h))
            except OutOfBlocksError:
                break
        return out

    def free_many(self, block_lists: Sequence[IntsLike], *, holders: Sequence[Hashable]) -> None:
        """``free(block_lists[i], holder=holders[i])`` for each ``i`` in order, atomically (POOL-117).

        The whole batch is checked first, duplicates across entries of one holder included, so a
        bad entry anywhere leaves every reference in place.
        """
        op = "free_many"
        entries = as_list(block_lists, op=op, arg="block_lists")
        lists = [as_block_id_list(ids, op=op, arg=f"block_lists[{i}]") for i, ids in enumerate(entries)]
        hs = as_holder_list(holders, len(lists), op=op)
        by_holder: dict[Hashable, list[int]] = {}
        for ids, h in zip(lists, hs, strict=True):
            by_holder.setdefault(h, []).extend(ids)
        for h, ids in by_holder.items():
            self.references.check_release(ids, h, None, op)
        for ids, h in zip(lists, hs, strict=True):
            self.references.release(ids, h)

    def match_many(self, hash_lists: Sequence[IntsLike], *, holders: Sequence[Hashable]) -> list[list[int]]:
        """``match(hash_lists[i], holder=holders[i])`` for each ``i`` in order (PFX-320)."""
        op = "match_many"
        entries = as_list(hash_lists, op=op, arg="hash_lists")
        lists = [as_hash_list(hl, op=op, arg=f"hash_lists[{i}]") for i, hl in enumerate(entries)]
        hs = as_holder_list(holders, len(lists), op=op)
        for h, hl in zip(hs, lists, strict=True):
            self.paused.refuse(h, len(hl), op)
        return [self.match(hl, None, h) for hl, h in zip(lists, hs, strict=True)]
