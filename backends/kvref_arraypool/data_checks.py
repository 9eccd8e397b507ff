"""The data plane's slot checks made on the device (DATA-815..DATA-817, DATA-825), over any :class:`ArrayOps`.

:class:`DeviceSlotChecks` is what :meth:`kvref.oracle.data.Tensors.device_checks` returns for a
library that keeps arrays on a device (torch, CuPy; NumPy too, so the CPU runs the same path):
a ``set_kv``, ``get_kv`` or ``copy_kv`` given its slots as an array of that library checks them
here with array operations, never reading them back; so does a state pool's ``reset_states`` or
``copy_states`` (DATA-825), in its own record and in its own rules' words. The verdict of a call is a 0-d device bool;
the caller predicates its writes on it (a refused call writes only the padding slot), and the
first refused call's error waits in a :class:`~kvref_arraypool.deferred.DeviceErrorRecord` for
:meth:`check`.
"""

from __future__ import annotations

from kvref.contract.errors import BlockIdError, InvalidValueError
from kvref_arraypool.deferred import CallNames, DeviceErrorRecord, ErrorKind
from kvref_arraypool.ops import Array, ArrayOps

__all__ = ["DATA_ERRORS", "DeviceSlotChecks"]

_RANGE, _PADDING, _TWICE, _OVERLAP, _STATE_RANGE, _STATE_DST = 1, 2, 3, 4, 5, 6

#: The errors the data plane's device checks record, by code (ERR-511's record, chapter 08's rules).
DATA_ERRORS = {
    _RANGE: ErrorKind("DATA-804", BlockIdError, "is a slot outside the buffers"),
    _PADDING: ErrorKind("DATA-802", InvalidValueError, "is a padding slot, which holds no data to read"),
    _TWICE: ErrorKind("DATA-807", InvalidValueError, "is a usable slot the call writes twice"),
    _OVERLAP: ErrorKind("DATA-809", InvalidValueError, "is a dst slot that repeats or is also a src slot"),
    _STATE_RANGE: ErrorKind("DATA-821", BlockIdError, "is a state slot outside the pool"),
    _STATE_DST: ErrorKind("DATA-823", InvalidValueError, "is slot 0, which a copy of states never writes"),
}


class DeviceSlotChecks:
    """Slot indices of ``slots`` buffers' rows, checked on the device (DATA-815); one per buffer set."""

    def __init__(self, ops: ArrayOps, slots: int) -> None:
        self.ops = ops
        self.slots = slots
        self.record = DeviceErrorRecord(ops, DATA_ERRORS)
        self._first = ops.zeros(slots + 1)  # scratch: the first position naming each slot (index slots: dump)
        self._iota = ops.arange(slots + 1)
        self._names = CallNames("a data-plane call")

    def take(self, values: object) -> tuple[Array, tuple[int, ...]] | None:
        """``values`` flattened as an int64 array of this library and device, and their shape; None when
        they are anything else (lists, another library's arrays), which the host path checks."""
        shape = getattr(values, "shape", None)
        reshape = getattr(values, "reshape", None)
        if shape is None or reshape is None:
            return None
        flat = self.ops.device_ints(reshape(-1))  # None for another library's arrays and for non-integers
        return None if flat is None else (flat, tuple(int(d) for d in shape))

    def writes(self, flat: Array, *, op: str, padding: int) -> Array:
        """Where a ``set_kv`` writes each entry (DATA-804, DATA-807): its slot, or slot 0 (padding,
        which absorbs writes) for padded entries and for every entry of a refused call. An empty
        call is no call: it is neither checked nor counted."""
        ops = self.ops
        if len(flat) == 0:
            return flat
        out, safe = self._range(flat)
        usable = safe >= padding
        twice = usable & ~self._first_occurrence(safe)
        codes = ops.where(out, _RANGE, ops.where(twice, _TWICE, 0))
        accepted = self._note(codes, flat, op)
        return ops.where(usable & accepted, safe, 0)

    def reads(self, flat: Array, *, op: str, padding: int) -> Array:
        """Where a ``get_kv`` reads each entry (DATA-802, DATA-804): its slot, or slot 0 for every
        entry of a refused call; an empty call is no call."""
        ops = self.ops
        if len(flat) == 0:
            return flat
        out, safe = self._range(flat)
        codes = ops.where(out, _RANGE, ops.where(safe < padding, _PADDING, 0))
        accepted = self._note(codes, flat, op)
        return ops.where(accepted, safe, 0)

    def copies(self, src: Array, dst: Array, *, op: str, padding: int) -> tuple[Array, Array]:
        """Sources and destinations of a ``copy_kv`` (DATA-802, DATA-804, DATA-809), both slot 0 for
        every entry of a refused call. ``src`` and ``dst`` have one length (checked on the host)."""
        ops = self.ops
        s_out, s = self._range(src)
        d_out, d = self._range(dst)
        both = ops.concat([src, dst])
        codes = ops.concat([ops.where(s_out, _RANGE, 0), ops.where(d_out, _RANGE, 0)])
        codes = ops.where(codes != 0, codes, _PADDING * (ops.concat([s, d]) < padding))
        # A dst that repeats, or that is also a src: mark the sources, then the first of each dst.
        ops.fill_at(self._first, d, self.slots)
        ops.fill_at(self._first, s, -1)
        repeated = ~self._first_occurrence(d, keep_marks=True)
        dup = ops.concat([ops.falses(len(src)), repeated])
        codes = ops.where(codes != 0, codes, ops.where(dup, _OVERLAP, 0))
        accepted = self._note(codes, both, op)
        return ops.where(accepted, s, 0), ops.where(accepted, d, 0)

    def states(self, flat: Array, *, op: str) -> Array:
        """The slots a ``reset_states`` zeroes (DATA-821, DATA-825): each slot, or the reserved slot 0
        for every entry of a refused call; an empty call is no call."""
        if len(flat) == 0:
            return flat
        out, safe = self._range(flat)
        accepted = self._note(self.ops.where(out, _STATE_RANGE, 0), flat, op)
        return self.ops.where(accepted, safe, 0)

    def state_copies(self, src: Array, dst: Array, *, op: str) -> tuple[Array, Array]:
        """Sources and destinations of a ``copy_states`` (DATA-821, DATA-823, DATA-825), both slot 0 for
        every entry of a refused call (a copy of slot 0 onto itself). One length, checked on the host."""
        ops = self.ops
        if len(src) == 0:
            return src, dst
        s_out, s = self._range(src)
        d_out, d = self._range(dst)
        codes = ops.concat([ops.where(s_out, _STATE_RANGE, 0), ops.where(d_out, _STATE_RANGE, _STATE_DST * (d == 0))])
        accepted = self._note(codes, ops.concat([src, dst]), op)
        return ops.where(accepted, s, 0), ops.where(accepted, d, 0)

    def _range(self, flat: Array) -> tuple[Array, Array]:
        out = (flat < 0) | (flat >= self.slots)
        return out, self.ops.where(out, self.slots, flat)

    def _first_occurrence(self, safe: Array, *, keep_marks: bool = False) -> Array:
        """Whether each entry is the first to name its slot (a slot marked -1 beforehand counts as named)."""
        ops, m = self.ops, len(safe)
        at = self._iota[:m] if m <= len(self._iota) else ops.arange(m)
        if not keep_marks:
            ops.fill_at(self._first, safe, m)
        ops.scatter_min(self._first, safe, at)
        return self._first[safe] == at

    def _note(self, codes: Array, values: Array, op: str) -> Array:
        self._names.add(op)
        return self.record.note(codes, values)

    def check(self) -> None:
        """Raise the first error a device check recorded since the last report, once (DATA-816, DATA-825)."""
        self.record.report(self.record.read(), self._names)
