"""Planted bugs of the batched step over the block array surface (chapter 07, REQ-750..REQ-756): each a
slip a batched scheduler step invites (rows released head first, rows not cleared, what a row holds
ignored, a step that does not fit taking what fits).

Each is a backend the conformance suite loads by name (``tests.meta.block_tables_bugs:X``): the
CuPy backend (NumPy without CUDA) whose ``create_block_tables`` builds the buggy tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvref_arraypool.block_tables import DeviceBlockTables
from kvref_arraypool.ops import Array

from kvref.contract.errors import OutOfBlocksError
from kvref_cupy.backend import CupyBackend


def _named(slots: Sequence[Any], rows: int) -> list[int]:
    """The distinct slots of a call that are rows of the tables (what the real checks will accept)."""
    return [s for s in dict.fromkeys(int(x) for x in slots) if 0 <= s < rows]


class ReleasedHeadFirst(DeviceBlockTables):
    """A release hands each row's blocks back head first: the next step reuses them in the wrong order."""

    def release(self, slots: Sequence[Any]) -> None:
        for s in _named(slots, self.pool.max_requests):
            n, start = self.num_blocks(s), s * self.max_blocks
            if n > 1:
                self._flat[start : start + n] = self.ops.flip(self._flat[start : start + n])
        super().release(slots)


class RowsNotCleared(DeviceBlockTables):
    """A release empties the rows on the host only: the table the kernels read still names freed blocks."""

    def release(self, slots: Sequence[Any]) -> None:
        kept = self.ops.copy(self._flat)
        super().release(slots)
        self._flat[:] = kept


class StepIgnoresHeld(DeviceBlockTables):
    """A step allocates every block a request's tokens need, as if its row were empty."""

    def step(self, slots: Sequence[Any], num_tokens: Sequence[Any]) -> tuple[Array, list[int]]:
        held = {s: self.num_blocks(s) for s in _named(slots, self.pool.max_requests)}
        for s in held:
            self._lengths[s] = 0
        try:
            return super().step(slots, num_tokens)
        except Exception:
            for s, n in held.items():
                self._lengths[s] = n
            raise


class PartialStep(DeviceBlockTables):
    """A step that does not fit as a whole grows the requests that fit, one by one, then raises."""

    def step(self, slots: Sequence[Any], num_tokens: Sequence[Any]) -> tuple[Array, list[int]]:
        try:
            return super().step(slots, num_tokens)
        except OutOfBlocksError:
            for s, n in zip(slots, num_tokens, strict=False):
                try:
                    super().step([s], [n])
                except OutOfBlocksError:
                    continue
            raise


def _backend(tables: type[DeviceBlockTables]) -> type[CupyBackend]:
    class PlantedBlockTablesBackend(CupyBackend):
        name = tables.__name__

        def create_block_tables(
            self,
            num_blocks: int,
            *,
            max_requests: int = 256,
            block_size: int = 16,
            max_blocks: int = 64,
            dtype: str = "int32",
            device: str | None = None,
        ) -> DeviceBlockTables:
            pool = self.create_block_arrays(num_blocks, max_requests=max_requests, dtype=dtype, device=device)
            return tables(pool, block_size=block_size, max_blocks=max_blocks)

    PlantedBlockTablesBackend.__name__ = PlantedBlockTablesBackend.__qualname__ = tables.__name__ + "Backend"
    return PlantedBlockTablesBackend


#: Each planted bug and the rule the suite must name.
BLOCK_TABLES_BUGS: dict[str, str] = {
    "ReleasedHeadFirst": "EVICT-402",
    "RowsNotCleared": "REQ-753",
    "StepIgnoresHeld": "REQ-750",
    "PartialStep": "REQ-755",
}

for _name in BLOCK_TABLES_BUGS:
    globals()[_name] = _backend(globals()[_name])
