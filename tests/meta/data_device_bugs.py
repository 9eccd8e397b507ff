"""Planted bugs of chapter 08's checks on the device (DATA-815..DATA-817): the slips a deferred check
invites (writes not predicated on the verdict, a repeat or an overlap not looked for).

Each is a backend the conformance suite loads by name (``tests.meta.data_device_bugs:X``): the CuPy
backend (NumPy without CUDA) whose data plane's tensors hand out the buggy checks.
"""

from __future__ import annotations

from typing import Any

from kvref_arraypool.data_checks import DeviceSlotChecks
from kvref_arraypool.ops import Array, NumpyLikeOps
from kvref_arraypool.tensors import LibraryTensors

from kvref.oracle.data import DataPlane
from kvref_cupy.backend import CupyBackend


class VerdictIgnored(DeviceSlotChecks):
    """A refused ``set_kv`` still writes its usable slots: the verdict gates the record, not the writes."""

    def writes(self, flat: Array, *, op: str, padding: int) -> Array:
        super().writes(flat, op=op, padding=padding)
        out, safe = self._range(flat)
        return self.ops.where(out | (safe < padding), 0, safe)


class RepeatNotSeen(DeviceSlotChecks):
    """``set_kv`` never looks for a usable slot named twice (DATA-807)."""

    def _first_occurrence(self, safe: Array, *, keep_marks: bool = False) -> Array:
        return self.ops.where(safe >= 0, True, False) if not keep_marks else super()._first_occurrence(safe)


class OverlapNotSeen(DeviceSlotChecks):
    """``copy_kv`` never looks for a dst that is also a src (DATA-809): the copy reads what it overwrites."""

    def copies(self, src: Array, dst: Array, *, op: str, padding: int) -> tuple[Array, Array]:
        ops = self.ops
        _, s = self._range(src)
        _, d = self._range(dst)
        self.record.note(ops.where(d >= self.slots, 1, 0), dst)
        return s, d


class StateResetUnchecked(DeviceSlotChecks):
    """A refused ``reset_states`` still zeroes the slots in range: the state of a live request is lost
    because another entry of the call was bad (DATA-825)."""

    def states(self, flat: Array, *, op: str) -> Array:
        super().states(flat, op=op)
        out, safe = self._range(flat)
        return self.ops.where(out, 0, safe)


class StateCopyIntoSlotZero(DeviceSlotChecks):
    """``copy_states`` never looks for slot 0 among its dsts (DATA-823): the reserved slot takes a state."""

    def state_copies(self, src: Array, dst: Array, *, op: str) -> tuple[Array, Array]:
        ops = self.ops
        s_out, s = self._range(src)
        d_out, d = self._range(dst)
        accepted = self.record.note(
            ops.concat([ops.where(s_out, 5, 0), ops.where(d_out, 5, 0)]), ops.concat([src, dst])
        )
        return ops.where(accepted, s, 0), ops.where(accepted, d, 0)


def _backend(checks: type[DeviceSlotChecks]) -> Any:
    class PlantedTensors(LibraryTensors):
        def device_checks(self, slots: int) -> DeviceSlotChecks:
            return checks(NumpyLikeOps(self.xp, device=self.device, is_device=False), slots)

    class PlantedDeviceChecksBackend(CupyBackend):
        name = checks.__name__

        def data_plane(self, device: str | None = None, **options: Any) -> DataPlane:
            import numpy

            self.device(device)
            return DataPlane(PlantedTensors(numpy, name="numpy", device="host"))

    PlantedDeviceChecksBackend.__name__ = PlantedDeviceChecksBackend.__qualname__ = checks.__name__ + "Backend"
    return PlantedDeviceChecksBackend


#: Each planted bug and the rules the suite may name for it.
DEVICE_DATA_BUGS: dict[str, set[str]] = {
    "VerdictIgnored": {"DATA-816"},
    "RepeatNotSeen": {"DATA-807", "DATA-816"},
    "OverlapNotSeen": {"DATA-809", "DATA-816"},
    "StateResetUnchecked": {"DATA-825"},
    "StateCopyIntoSlotZero": {"DATA-823", "DATA-825"},
}

for _name in DEVICE_DATA_BUGS:
    globals()[_name] = _backend(globals()[_name])
