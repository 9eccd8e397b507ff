"""Planted bugs of the array surface (ERR-510..ERR-514): chapter 06's device allocator, each with one
bug a deferred check invites (a mutation not predicated on the verdict, a report not cleared, a
count not confirmed, an output that aliases the state).

Each is a backend the conformance suite loads by name (``tests.meta.array_surface_bugs:X``): the
CuPy backend (NumPy without CUDA) whose ``create_slot_arrays`` builds the buggy allocator.
"""

from __future__ import annotations

from typing import Any

from kvref_arraypool.ops import Array
from kvref_arraypool.slot_arrays import DeviceSlotAllocator

from kvref_cupy.backend import CupyBackend


class RefusedFreeTakesEffect(DeviceSlotAllocator):
    """A refused free still releases its valid entries: the verdict gates the record, not the writes."""

    def _release(self, pages: Array, keep: Array, state: int) -> None:
        first = self._first[pages] == self._iota[: len(pages)]  # as free() marked them, verdict aside
        valid = (self._state[pages] == state) & (pages > 0)
        super()._release(pages, first & valid, state)


class ReportedTwice(DeviceSlotAllocator):
    """``check()`` raises the recorded error but never clears it: every later check raises it again."""

    def _confirm(self, explain: Any = None) -> None:
        clear = self.record.clear
        self.record.clear = lambda: None  # type: ignore[method-assign]
        try:
            super()._confirm(explain)
        finally:
            self.record.clear = clear  # type: ignore[method-assign]


class CountNotConfirmed(DeviceSlotAllocator):
    """``available_size()`` returns the host's floor without reading the device after a free."""

    def available_size(self) -> int:
        return (self._floor + self._released_floor) * self.page_size


class OutputAliasesState(DeviceSlotAllocator):
    """``alloc`` returns a view of its free list for pages of one slot: the caller's writes reach the state."""

    def alloc(self, need_size: Any) -> Array | None:
        head = self._head
        got = super().alloc(need_size)
        if got is not None and self.page_size == 1 and self.dtype == "int64" and head + len(got) <= self.num_pages:
            return self._ring[head : head + len(got)]
        return got


def _backend(allocator: type[DeviceSlotAllocator]) -> type[CupyBackend]:
    class PlantedArraysBackend(CupyBackend):
        name = allocator.__name__

        def create_slot_arrays(
            self, size: int, *, page_size: int = 1, sort: bool = True, dtype: str = "int32", device: str | None = None
        ) -> DeviceSlotAllocator:
            ops = self.ops(self.device(device))
            return allocator(size, ops=ops, page_size=page_size, sort=sort, dtype=dtype)

    PlantedArraysBackend.__name__ = PlantedArraysBackend.__qualname__ = allocator.__name__ + "Backend"
    return PlantedArraysBackend


#: Each planted bug and the rule the suite must name.
ARRAY_BUGS: dict[str, str] = {
    "RefusedFreeTakesEffect": "ERR-511",
    "ReportedTwice": "ERR-512",
    "CountNotConfirmed": "ERR-513",
    "OutputAliasesState": "ERR-510",
}

for _name in ARRAY_BUGS:
    globals()[_name] = _backend(globals()[_name])
