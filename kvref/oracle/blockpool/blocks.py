"""The oracle's blocks: each block's fields as plain lists, the free stack, and what each holder holds (chapter 01).

Per block id ``b``: ``ref[b]`` references from all holders; ``holders[b]`` ``{holder:
references}`` while in use, else None; ``gen[b]`` allocations so far (POOL-111); ``hash[b]`` the
hash ``b`` is registered under, or None. ``free`` is the free stack (the end is the top; a new
pool hands out the lowest ids first); ``held`` is each holder's references over all blocks.
"""

from __future__ import annotations

from collections.abc import Hashable

from kvref.contract.errors import BlockIdError
from kvref.contract.protocol import BlockState
from kvref.contract.validate import as_int

__all__ = ["BlockLists", "take_free"]


def take_free(free: list[int], n: int) -> list[int]:
    """Pop the top ``n`` blocks of the free stack ``free``, topmost first: what ``allocate`` hands out."""
    if not n:
        return []
    taken = free[-n:]
    del free[-n:]
    taken.reverse()
    return taken


class BlockLists:
    """Every block's references, holders, generation and hash, the free stack and the holders' totals."""

    def __init__(self, n: int, reserved: tuple[int, ...]) -> None:
        self.n = n
        self.num_usable = n - len(reserved)
        self.is_reserved = bytearray(n)
        for r in reserved:
            self.is_reserved[r] = 1
        self.ref = [0] * n
        self.gen = [0] * n
        self.holders: list[dict[Hashable, int] | None] = [None] * n
        self.hash: list[int | None] = [None] * n
        self.free: list[int] = []
        self.held: dict[Hashable, int] = {}
        self.refill_free()

    def refill_free(self) -> None:
        """Every usable block free, in a new pool's order: the lowest ids on top (POOL-115)."""
        reserved = self.is_reserved
        self.free[:] = [b for b in range(self.n - 1, -1, -1) if not reserved[b]]

    def check_id(self, value: object, op: str) -> int:
        """``value`` as a block id in range, or BlockIdError (POOL-103)."""
        b = as_int(value, op=op, arg="block_id")
        if not 0 <= b < self.n:
            raise BlockIdError("POOL-103", f"{op}: block id {b} outside [0, {self.n})")
        return b

    def state_of(self, b: int) -> BlockState:
        """The state of block ``b`` (STATE-001)."""
        if self.is_reserved[b]:
            return BlockState.RESERVED
        if self.ref[b]:
            return BlockState.IN_USE
        return BlockState.FREE if self.hash[b] is None else BlockState.CACHED

    def add_held(self, holder: Hashable, count: int) -> None:
        """``holder`` took ``count`` more references."""
        self.held[holder] = self.held.get(holder, 0) + count

    def drop_held(self, holder: Hashable, count: int) -> None:
        """``holder`` gave ``count`` references back."""
        left = self.held[holder] - count
        if left:
            self.held[holder] = left
        else:
            del self.held[holder]

    def clear(self) -> None:
        """No reference, holder or hash on any block, every usable block free; generations stay (POOL-111)."""
        n = self.n
        self.ref[:] = [0] * n
        self.holders[:] = [None] * n
        self.hash[:] = [None] * n
        self.held.clear()
        self.refill_free()
