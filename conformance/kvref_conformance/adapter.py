"""Adapters: thin classes that let the suite drive a foreign allocator through kvref's protocol.

A foreign allocator (SGLang's ``TokenToKVPoolAllocator``, vLLM's ``BlockPool`` with caching off,
a GPU free stack) speaks its own API and usually keeps no holders. :class:`ForeignPoolAdapter`
does the caller-side bookkeeping an engine does around such an allocator (who holds which block,
argument checks, generations) and leaves three hooks to the subclass:

- ``_take(count) -> list[int] | None``: the foreign call that hands out ``count`` blocks, or
  None (or raises) when it cannot;
- ``_give_back(ids)``: the foreign call that takes blocks back;
- ``_foreign_free() -> int``: how many blocks the foreign allocator reports free.

Whatever the foreign allocator gets wrong (an id handed out twice, a count that drifts, a short
allocation that keeps blocks) shows up in the suite, because the adapter passes its answers
through unchanged. The reserved ids are taken from the foreign allocator at creation and never
returned, as an engine does with its null block.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from kvref.errors import (
    BlockIdError,
    BlockStateError,
    InvalidValueError,
    NotHeldError,
    OutOfBlocksError,
    PausedHolderError,
    ReservedBlockError,
    StaleBlockError,
)
from kvref.pausing import PausedHolders
from kvref.protocol import BlockState
from kvref.validate import as_block_id_list, as_count, as_holder, as_int, as_pool_shape

__all__ = ["ForeignPoolAdapter"]


class ForeignPoolAdapter(PausedHolders):
    """The :class:`kvref.protocol.BlockPool` protocol over a foreign allocator (see module doc)."""

    def __init__(self, num_blocks: int, *, reserved_ids: Sequence[int] = (0,), paused_limit: int = 0) -> None:
        op = type(self).__name__
        self._n, self._reserved = as_pool_shape(num_blocks, reserved_ids, op=op)
        self._paused_limit = as_count(paused_limit, op=op, arg="paused_limit")
        self._holders: dict[int, dict[Hashable, int]] = {}
        self._gen = [0] * self._n
        self._paused: set[Hashable] = set()

    def _reserve(self) -> None:
        """Take every block, keep the reserved ones, give the rest back (call at the end of __init__)."""
        everything = self._take(self._n) or []
        self._give_back([b for b in everything if b not in self._reserved])

    # hooks --------------------------------------------------------------------------------
    def _take(self, count: int) -> list[int] | None:
        raise NotImplementedError

    def _give_back(self, ids: list[int]) -> None:
        raise NotImplementedError

    def _foreign_free(self) -> int:
        raise NotImplementedError

    # protocol -----------------------------------------------------------------------------
    name = "foreign"

    @property
    def num_blocks(self) -> int:
        return self._n

    @property
    def reserved_ids(self) -> tuple[int, ...]:
        return self._reserved

    @property
    def num_usable(self) -> int:
        return self._n - len(self._reserved)

    @property
    def num_free(self) -> int:
        return self._foreign_free()

    @property
    def num_in_use(self) -> int:
        return len(self._holders)

    @property
    def num_available(self) -> int:
        return self._foreign_free()

    def capabilities(self) -> frozenset[str]:
        return frozenset({"pause"})

    def _id(self, value: object, op: str) -> int:
        b = as_int(value, op=op, arg="block_id")
        if not 0 <= b < self._n:
            raise BlockIdError("POOL-103", f"{op}: block id {b} outside [0, {self._n})")
        return b

    def ref_count(self, block_id: int) -> int:
        return sum(self._holders.get(self._id(block_id, "ref_count"), {}).values())

    def holders(self, block_id: int) -> dict[Hashable, int]:
        return dict(self._holders.get(self._id(block_id, "holders"), {}))

    def generation(self, block_id: int) -> int:
        return self._gen[self._id(block_id, "generation")]

    def block_state(self, block_id: int) -> BlockState:
        b = self._id(block_id, "block_state")
        if b in self._reserved:
            return BlockState.RESERVED
        return BlockState.IN_USE if b in self._holders else BlockState.FREE

    def allocate(self, count: int, *, holder: Hashable = None) -> list[int]:
        n = as_count(count, op="allocate")
        holder = as_holder(holder, op="allocate")
        if n and holder in self._paused:
            raise PausedHolderError("POOL-114", f"allocate: holder {holder!r} is paused")
        if n == 0:
            return []
        if n > self._foreign_free():
            raise OutOfBlocksError("POOL-105", f"allocate: asked for {n}, {self._foreign_free()} free")
        try:
            ids = self._take(n)
        except Exception as exc:  # the foreign allocator's own out-of-memory error
            raise OutOfBlocksError("POOL-105", f"allocate: the allocator refused {n} blocks: {exc}") from exc
        if ids is None:
            raise OutOfBlocksError("POOL-105", f"allocate: the allocator returned nothing for {n} blocks")
        for b in ids:  # passed through unchanged: the suite judges what the allocator returned
            self._holders.setdefault(b, {})[holder] = self._holders.get(b, {}).get(holder, 0) + 1
            self._gen[b] += 1
        return list(ids)

    def _check(self, ids: list[int], holder: Hashable, generations: Any, op: str, *, sharing: bool) -> None:
        gens = None if generations is None else as_block_id_list(generations, op=op, arg="generations")
        if gens is not None and len(gens) != len(ids):
            raise InvalidValueError("ERR-506", f"{op}: {len(gens)} generations for {len(ids)} ids")
        wanted: dict[int, int] = {}
        for i, b in enumerate(ids):
            if not 0 <= b < self._n:
                raise BlockIdError("POOL-103", f"{op}: block id {b} outside [0, {self._n})")
            if b in self._reserved:
                raise ReservedBlockError("POOL-118", f"{op}: block {b} is reserved")
            if gens is not None and gens[i] != self._gen[b]:
                raise StaleBlockError("POOL-112", f"{op}: block {b} generation {gens[i]}, now {self._gen[b]}")
            if sharing:
                if b not in self._holders:
                    raise BlockStateError("POOL-119", f"{op}: block {b} is free")
                continue
            wanted[b] = wanted.get(b, 0) + 1
            have = self._holders.get(b, {}).get(holder, 0)
            if have == 0:
                raise NotHeldError("POOL-108", f"{op}: holder {holder!r} holds no reference to block {b}")
            if wanted[b] > have:
                raise NotHeldError("POOL-109", f"{op}: block {b} listed {wanted[b]} times, {have} held")

    def free(self, block_ids: Sequence[int], *, holder: Hashable = None, generations: Any = None) -> None:
        ids = as_block_id_list(block_ids, op="free")
        holder = as_holder(holder, op="free")
        self._check(ids, holder, generations, "free", sharing=False)
        released = []
        for b in ids:
            held = self._holders[b]
            held[holder] -= 1
            if not held[holder]:
                del held[holder]
            if not held:
                del self._holders[b]
                released.append(b)
        if released:
            self._give_back(released)

    def acquire(self, block_ids: Sequence[int], *, holder: Hashable = None, generations: Any = None) -> None:
        ids = as_block_id_list(block_ids, op="acquire")
        holder = as_holder(holder, op="acquire")
        if ids and holder in self._paused:
            raise PausedHolderError("POOL-114", f"acquire: holder {holder!r} is paused")
        self._check(ids, holder, generations, "acquire", sharing=True)
        for b in ids:
            self._holders[b][holder] = self._holders[b].get(holder, 0) + 1

    def _references_of(self, holder: Hashable) -> int:
        return sum(held.get(holder, 0) for held in self._holders.values())
