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

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import Any, SupportsIndex

from kvref.contract.errors import (
    BlockIdError,
    BlockStateError,
    HashConflictError,
    InvalidValueError,
    NotHeldError,
    OutOfBlocksError,
    ReservedBlockError,
    StaleBlockError,
)
from kvref.contract.pausing import PauseCalls, PausedHolders
from kvref.contract.protocol import BlockState
from kvref.contract.shape import PoolShape
from kvref.contract.validate import (
    IntsLike,
    as_block_id_list,
    as_count,
    as_holder,
    as_int,
    as_pool_shape,
    register_arguments,
)

__all__ = ["ForeignPoolAdapter", "HeldReferences", "checked_registration"]


def checked_registration(
    pool: Any,
    block_ids: IntsLike,
    block_hashes: IntsLike,
    parent_hash: SupportsIndex | None,
    *,
    parent_resident: Callable[[int], bool],
) -> tuple[list[int], list[int], int | None]:
    """``register``'s arguments checked as the spec asks, for a peer whose own call checks none.

    Returns the block ids, the hashes and the parent hash. Refuses what
    :func:`kvref.contract.validate.register_arguments` refuses (ERR-506, PFX-304, a block twice: PFX-303),
    then a block outside the pool (POOL-103), reserved (POOL-118), not in use (PFX-302) or
    already hashed (PFX-303). ``pool`` is the adapter: its ``num_blocks``, ``reserved_ids``, ``ref_count``
    and ``block_hash`` are read.
    """
    op = "register"
    ids, hs, parent = register_arguments(block_ids, block_hashes, parent_hash, parent_resident=parent_resident)
    n, reserved = pool.num_blocks, pool.reserved_ids
    for b in ids:
        if not 0 <= b < n:
            raise BlockIdError("POOL-103", f"{op}: block id {b} outside [0, {n})")
        if b in reserved:
            raise ReservedBlockError("POOL-118", f"{op}: block {b} is reserved")
        if pool.ref_count(b) == 0:
            raise BlockStateError("PFX-302", f"{op}: block {b} is not in use")
        if pool.block_hash(b) is not None:
            raise HashConflictError("PFX-303", f"{op}: block {b} already has a hash")
    return ids, hs, parent


class HeldReferences(PoolShape, PauseCalls):
    """The caller-side record an engine keeps around its allocator: who holds which block, generations.

    Shared by :class:`ForeignPoolAdapter` and the peer adapters (``kvref_conformance.peers``).
    A subclass sets ``_n`` and ``_reserved`` (``as_pool_shape``), calls :meth:`_start_references`,
    and supplies ``block_state``; :meth:`_check` then refuses bad releases and shares the way the
    oracle does (POOL-103, POOL-108, POOL-109, POOL-112, POOL-118, POOL-119, ERR-506), and the
    ``_record_*`` methods keep the record after the foreign call.
    """

    _n: int
    _reserved: tuple[int, ...]

    def _start_references(self, paused_limit: int, op: str) -> None:
        self.paused = PausedHolders(as_count(paused_limit, op=op, arg="paused_limit"), self._references_of)
        self._holders: dict[int, dict[Hashable, int]] = {}
        self._gen = [0] * self._n
        self._held: dict[Hashable, int] = {}

    def block_state(self, block_id: SupportsIndex) -> BlockState:
        """The state of ``block_id``, as the foreign allocator shows it."""
        raise NotImplementedError

    def _id(self, value: object, op: str) -> int:
        b = as_int(value, op=op, arg="block_id")
        if not 0 <= b < self._n:
            raise BlockIdError("POOL-103", f"{op}: block id {b} outside [0, {self._n})")
        return b

    def holders(self, block_id: SupportsIndex) -> dict[Hashable, int]:
        """References per holder, as the engine's request-to-blocks map records them."""
        return dict(self._holders.get(self._id(block_id, "holders"), {}))

    def generation(self, block_id: SupportsIndex) -> int:
        """Allocations of ``block_id`` seen by this adapter (POOL-111)."""
        return self._gen[self._id(block_id, "generation")]

    def holder_references(self, holder: Hashable) -> int:
        """References ``holder`` holds."""
        return self._held.get(as_holder(holder, op="holder_references"), 0)

    def _references_of(self, holder: Hashable) -> int:
        return self._held.get(holder, 0)

    def _check(self, ids: list[int], holder: Hashable, generations: Any, op: str, *, sharing: bool) -> None:
        """Refuse, before any foreign call, what the oracle refuses: a release (or, ``sharing``, an acquire)."""
        gens = None if generations is None else as_block_id_list(generations, op=op, arg="generations")
        if gens is not None and len(gens) != len(ids):
            raise InvalidValueError("ERR-506", f"{op}: {len(gens)} generations for {len(ids)} block ids")
        if gens is not None:
            for b, g in zip(ids, gens, strict=True):
                if 0 <= b < self._n and b not in self._reserved and g != self._gen[b]:
                    raise StaleBlockError("POOL-112", f"{op}: block {b} generation {g}, current {self._gen[b]}")
        for b in ids:
            if not 0 <= b < self._n:
                raise BlockIdError("POOL-103", f"{op}: block id {b} outside [0, {self._n})")
            if b in self._reserved:
                raise ReservedBlockError("POOL-118", f"{op}: block {b} is reserved and never held")
            if sharing:
                if self.block_state(b) is BlockState.FREE:
                    raise BlockStateError("POOL-119", f"{op}: block {b} is free; only blocks in use or cached")
            elif self._holders.get(b, {}).get(holder, 0) == 0:
                raise NotHeldError("POOL-108", f"{op}: holder {holder!r} holds no reference to block {b}")
        if not sharing:
            for b, times in Counter(ids).items():
                have = self._holders[b][holder]
                if times > have:
                    raise NotHeldError("POOL-109", f"{op}: block {b} occurs {times} times, {holder!r} holds {have}")

    def _record_references(self, ids: list[int], holder: Hashable, *, allocated: bool = False) -> None:
        """``holder`` took one reference per position (``allocated``: fresh blocks, a new generation)."""
        for b in ids:
            held = self._holders.setdefault(b, {})
            held[holder] = held.get(holder, 0) + 1
            if allocated:
                self._gen[b] += 1
        if ids:
            self._held[holder] = self._held.get(holder, 0) + len(ids)

    def _record_release(self, ids: list[int], holder: Hashable) -> list[int]:
        """``holder`` gave one reference back per position (checked); returns the blocks nobody holds now."""
        released = []
        for b in ids:
            held = self._holders[b]
            held[holder] -= 1
            if not held[holder]:
                del held[holder]
            if not held:
                del self._holders[b]
                released.append(b)
        if ids:
            left = self._held[holder] - len(ids)
            if left:
                self._held[holder] = left
            else:
                del self._held[holder]
        return released


class ForeignPoolAdapter(HeldReferences):
    """The :class:`kvref.contract.protocol.BlockPool` protocol over a foreign allocator (see module doc)."""

    def __init__(self, num_blocks: int, *, reserved_ids: Sequence[int] = (0,), paused_limit: int = 0) -> None:
        op = type(self).__name__
        self._n, self._reserved = as_pool_shape(num_blocks, reserved_ids, op=op)
        self._start_references(paused_limit, op)

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

    def ref_count(self, block_id: int) -> int:
        return sum(self._holders.get(self._id(block_id, "ref_count"), {}).values())

    def block_state(self, block_id: SupportsIndex) -> BlockState:
        b = self._id(block_id, "block_state")
        if b in self._reserved:
            return BlockState.RESERVED
        return BlockState.IN_USE if b in self._holders else BlockState.FREE

    def allocate(self, count: int, *, holder: Hashable = None) -> list[int]:
        n = as_count(count, op="allocate")
        holder = as_holder(holder, op="allocate")
        self.paused.refuse(holder, n, "allocate")
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
        self._record_references(ids, holder, allocated=True)  # passed through unchanged: the suite judges them
        return list(ids)

    def free(self, block_ids: Sequence[int], *, holder: Hashable = None, generations: Any = None) -> None:
        ids = as_block_id_list(block_ids, op="free")
        holder = as_holder(holder, op="free")
        self._check(ids, holder, generations, "free", sharing=False)
        released = self._record_release(ids, holder)
        if released:
            self._give_back(released)

    def acquire(self, block_ids: Sequence[int], *, holder: Hashable = None, generations: Any = None) -> None:
        ids = as_block_id_list(block_ids, op="acquire")
        holder = as_holder(holder, op="acquire")
        self.paused.refuse(holder, len(ids), "acquire")
        self._check(ids, holder, generations, "acquire", sharing=True)
        self._record_references(ids, holder)
