"""Planted bugs of the block pool's array surface (ERR-511, ERR-513, ERR-517..ERR-520): each the slip a
deferred, request-slot check invites (a holder check by reference count, writes not predicated on
the verdict, a pair named twice let through, a host count not lowered).

Each is a backend the conformance suite loads by name (``tests.meta.block_arrays_bugs:X``): the
CuPy backend (NumPy without CUDA) whose ``create_block_arrays`` builds the buggy pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvref_arraypool.block_arrays import DeviceBlockPool
from kvref_arraypool.ops import Array

from kvref_cupy.backend import CupyBackend


class HolderByReferenceCount(DeviceBlockPool):
    """A free checks that the block is in use, not that the entry's slot holds it: foreign frees pass."""

    def _pairs(self, block_ids: Any, slots: Any, op: str) -> tuple[Array, ...] | None:
        pairs = super()._pairs(block_ids, slots, op)
        if pairs is None or op != "free":
            return pairs
        ids, safe, slot, word, bit, _, twice, codes = pairs
        return ids, safe, slot, word, bit, self._ref[safe] > 0, twice, codes


class WritesIgnoreTheVerdict(DeviceBlockPool):
    """The verdict gates the record, not the writes: a refused call still frees or shares its entries."""

    def _pairs(self, block_ids: Any, slots: Any, op: str) -> tuple[Array, ...] | None:
        note = self.record.note

        def accept_anyway(codes: Array, values: Array) -> Array:
            verdict = note(codes, values)
            return verdict | ~verdict

        self.record.note = accept_anyway  # type: ignore[method-assign]
        return super()._pairs(block_ids, slots, op)


class PairTwiceLetThrough(DeviceBlockPool):
    """Nothing looks for one (block, slot) pair named twice in a call (POOL-109, ERR-518)."""

    def _pairs(self, block_ids: Any, slots: Any, op: str) -> tuple[Array, ...] | None:
        pairs = super()._pairs(block_ids, slots, op)
        if pairs is None:
            return pairs
        ids, safe, slot, word, bit, held, _, codes = pairs
        return ids, safe, slot, word, bit, held, self.ops.falses(len(ids)), codes


class FloorNotLowered(DeviceBlockPool):
    """``allocate`` leaves the host's count of free blocks where it was: later steps over-allocate."""

    def allocate(self, counts: Sequence[Any], slots: Sequence[Any]) -> tuple[Array, list[int]]:
        floor = self._floor
        got = super().allocate(counts, slots)
        self._floor = floor
        return got


def _backend(pool: type[DeviceBlockPool]) -> type[CupyBackend]:
    class PlantedBlockArraysBackend(CupyBackend):
        name = pool.__name__

        def create_block_arrays(
            self,
            num_blocks: int,
            *,
            max_requests: int = 256,
            reserved_ids: Sequence[int] = (0,),
            dtype: str = "int32",
            device: str | None = None,
        ) -> DeviceBlockPool:
            ops = self.ops(self.device(device))
            return pool(num_blocks, ops=ops, max_requests=max_requests, reserved_ids=reserved_ids, dtype=dtype)

    PlantedBlockArraysBackend.__name__ = PlantedBlockArraysBackend.__qualname__ = pool.__name__ + "Backend"
    return PlantedBlockArraysBackend


#: Each planted bug and the rule the suite must name.
BLOCK_ARRAY_BUGS: dict[str, str] = {
    "HolderByReferenceCount": "POOL-108",
    "WritesIgnoreTheVerdict": "ERR-511",
    "PairTwiceLetThrough": "POOL-109",
    "FloorNotLowered": "ERR-519",
}

for _name in BLOCK_ARRAY_BUGS:
    globals()[_name] = _backend(globals()[_name])
