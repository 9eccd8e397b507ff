"""Holders as the array core sees them: small integer ids on the host, and the references each holds (STATE-002).

The arrays keep a holder id per block (``owner``) and per shared pair; :class:`HolderIds` maps
any hashable holder to such an id while it holds a reference, and counts the references each
holder holds over all blocks (``held``). An id is given on a holder's first reference and taken
back, for the next new holder, when its last reference goes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from kvref.contract.errors import OutOfBlocksError
from kvref_arraypool.holder_counts import HID_MASK
from kvref_arraypool.ops import Array, ArrayOps

__all__ = ["HolderIds"]


class HolderIds:
    """``holder -> id`` for the holders that hold references, and each one's total references."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ids: dict[Hashable, int] = {}
        self.holder_of: list[Hashable] = []
        self.spare: list[int] = []
        self.held: dict[Hashable, int] = {}

    def known(self, holder: Hashable) -> int:
        """The id of a holder that holds references, else -1."""
        return self.ids.get(holder, -1)

    def give(self, holder: Hashable) -> int:
        """The id of ``holder``, given now if it has none."""
        hid = self.ids.get(holder)
        if hid is None:
            hid = self.ids[holder] = self.next_id(holder)
            if self.spare:
                self.holder_of[self.spare.pop()] = holder
            else:
                self.holder_of.append(holder)
        return hid

    def next_id(self, holder: Hashable) -> int:
        """The id ``holder`` has, or the one :meth:`give` would give it next, without giving it."""
        hid = self.ids.get(holder)
        if hid is None:
            hid = self.spare[-1] if self.spare else len(self.holder_of)
            if hid > HID_MASK >> 1:  # pragma: no cover - 2**31 holders at once
                raise OutOfBlocksError("POOL-105", f"{self.name}: more than 2**31 holders hold references")
        return hid

    def entry_ids(self, counts: Sequence[int], holders: Sequence[Hashable]) -> list[int]:
        """The id of each entry's holder (-1 for an empty entry), given in entry order, as single calls would."""
        return [self.give(h) if c else -1 for c, h in zip(counts, holders, strict=True)]

    def per_position(self, ops: ArrayOps, counts: Sequence[int], holders: Sequence[Hashable]) -> Array:
        """Holder id of each of ``counts[i]`` positions of entry ``i``, as one device array (one copy in)."""
        hids = np.array(self.entry_ids(counts, holders), dtype=np.int64)
        return ops.asarray(np.repeat(hids, np.asarray(counts, dtype=np.int64)))

    def add(self, holder: Hashable, count: int) -> None:
        """``holder`` took ``count`` more references."""
        if count:
            self.held[holder] = self.held.get(holder, 0) + count

    def drop(self, holder: Hashable, count: int) -> None:
        """``holder`` gave ``count`` references back; its id goes back once it holds none."""
        if not count:
            return
        left = self.held[holder] - count
        if left:
            self.held[holder] = left
        else:
            del self.held[holder]
            self.spare.append(self.ids.pop(holder))

    def drop_many(self, holders: Sequence[Hashable], counts: Sequence[int]) -> None:
        """``drop(holders[i], counts[i])`` for each ``i``."""
        for h, k in zip(holders, counts, strict=True):
            self.drop(h, k)

    def references_of(self, holder: Hashable) -> int:
        """References ``holder`` holds over all blocks."""
        return self.held.get(holder, 0)

    def clear(self) -> None:
        """No holder holds anything."""
        self.ids.clear()
        self.holder_of.clear()
        self.spare.clear()
        self.held.clear()
