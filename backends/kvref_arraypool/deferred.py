"""Errors found on the device and reported later: the record every array-surface call writes (ERR-510..ERR-514).

A call of the array surface checks its input with array operations and never waits for the
device to learn the verdict. When the input breaks a rule the call's mutation is a no-op (every
write it makes is predicated on the verdict, ERR-501) and the *first* such call's error is written
into a small device array, the **record**, beside the counters the call keeps on the device:

====== ==================================================================
slot   meaning
====== ==================================================================
0      the error code of the first refused call (0: none since the last report)
1      that call's index (the count of checked calls made before it)
2      the position in that call's input of the first offending entry
3      that entry's value
4      how many checked calls were refused since the last report
5      how many checked calls were made (the next call's index)
====== ==================================================================

:meth:`DeviceErrorRecord.report` reads the record with one host read and raises the first error
as the exception class and rule the immediate check would have raised, its message naming the
call and the entry; it then clears the record, so each error is raised once (ERR-512).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvref.contract.errors import KVRefError
from kvref_arraypool.ops import Array, ArrayOps

__all__ = ["CALLS", "CODE", "CallNames", "DeviceError", "DeviceErrorRecord", "ErrorKind", "REFUSED"]

#: Slots of the record (see the module).
CODE, CALL, POSITION, VALUE, REFUSED, CALLS = 0, 1, 2, 3, 4, 5
_WIDTH = 6


@dataclass(frozen=True)
class ErrorKind:
    """What a device error code means: the rule, the exception class and what went wrong."""

    rule: str
    error: type[KVRefError]
    #: Completes "entry P (value V) ..." in the report; says what the rule refuses.
    what: str


@dataclass(frozen=True)
class DeviceError:
    """The first refused call as the record holds it (host values)."""

    kind: ErrorKind
    call: int
    position: int
    value: int
    refused: int


class DeviceErrorRecord:
    """The record of an array-surface object: written on the device, read by :meth:`report` (ERR-510).

    ``kinds`` maps each error code (1, 2, ...) the object's checks write to its meaning.
    ``counters`` is how many further int64 slots the owner keeps in the same device array (its
    free counts): they are read by the same host read as the record, so confirming the counts and
    reporting an error cost one synchronization together (ERR-513).
    """

    def __init__(self, ops: ArrayOps, kinds: dict[int, ErrorKind], *, counters: int = 0) -> None:
        self.ops = ops
        self.kinds = dict(kinds)
        #: The record (slots 0.._WIDTH-1) followed by the owner's counters.
        self.array = ops.zeros(_WIDTH + counters)
        self._count_call = ops.asarray(np.array([0, 1], dtype=np.int64))  # added to [REFUSED, CALLS]
        self._count_refusal = ops.asarray(np.array([1, 0], dtype=np.int64))

    def counter(self, i: int) -> Array:
        """The owner's counter ``i`` as a one-element view into the record's array."""
        return self.array[_WIDTH + i : _WIDTH + i + 1]

    def note(self, codes: Array, values: Array) -> Array:
        """Record the first nonzero of ``codes`` (one per input entry) if this call is refused.

        Returns the call's verdict as a 0-d device bool (True: accepted); nothing is read back.
        ``values`` are the entries as given, for the report. The call counter advances either way.
        """
        ops, rec = self.ops, self.array
        bad = codes != 0
        refused = bad.any()
        pick = ops.argmax_bool(bad)[None]  # a 1-element index: a gather, where a 0-d index would read it back
        fresh = refused & (rec[CODE] == 0)
        found = ops.concat([codes[pick], rec[CALLS : CALLS + 1], pick, values[pick]])
        rec[CODE : VALUE + 1] = ops.where(fresh, found, rec[CODE : VALUE + 1])
        rec[REFUSED : CALLS + 1] += self._count_call + refused * self._count_refusal
        return ~refused

    def read(self) -> np.ndarray:
        """The record and the counters as host int64 values: one host read (a sync on a GPU)."""
        return self.ops.to_host(self.array)

    def first_error(self, host: np.ndarray) -> DeviceError | None:
        """The first refused call in a host copy of the record, or None."""
        code = int(host[CODE])
        if code == 0:
            return None
        return DeviceError(self.kinds[code], int(host[CALL]), int(host[POSITION]), int(host[VALUE]), int(host[REFUSED]))

    def clear(self) -> None:
        """Forget the reported error (the counters and the call count stay)."""
        self.array[CODE : REFUSED + 1] = 0

    def report(self, host: np.ndarray, names: CallNames) -> None:
        """Raise the first error in ``host`` (a read of the record) once, naming its call's operation;
        ``names`` starts counting afresh from this read."""
        error = self.first_error(host)
        op = names.after_read(int(host[CALLS]), None if error is None else error.call)
        if error is not None:
            self.clear()
            self.raise_error(error, op)

    def raise_error(self, error: DeviceError, op: str, explain: Callable[[], None] | None = None) -> None:
        """Raise ``error`` as its rule's exception (ERR-511); ``explain`` may raise the immediate check's own."""
        if explain is not None:
            explain()
        later = f"; {error.refused - 1} later call(s) were refused too" if error.refused > 1 else ""
        exc = error.kind.error(
            error.kind.rule,
            f"{op} (call {error.call}): entry {error.position} (value {error.value}) {error.kind.what}; "
            f"that call changed nothing{later}",
        )
        exc.call_index = error.call  # type: ignore[attr-defined]
        raise exc


class CallNames:
    """The operation of each checked call since the last read of a record, so that a report names it.

    Kept for the first :attr:`LIMIT` calls after a read; a report of a later call says ``fallback``.
    """

    LIMIT = 1 << 16

    def __init__(self, fallback: str) -> None:
        self.fallback = fallback
        #: How many checked calls were named in all: the index the next one gets.
        self.made = 0
        self._first = 0
        self._names: list[str] = []

    def add(self, op: str) -> None:
        """Name the next checked call."""
        self.made += 1
        if len(self._names) < self.LIMIT:
            self._names.append(op)

    @property
    def confirmed(self) -> int:
        """The record's call count at its last read: the calls below it have had their errors reported."""
        return self._first

    def after_read(self, calls: int, call: int | None) -> str:
        """The name of checked call ``call``: the fallback for None, for a call named before the last read
        or past :attr:`LIMIT`; the names start again at ``calls`` (the record's call count now)."""
        names, first = self._names, self._first
        self._names, self._first = [], calls
        if call is None:
            return self.fallback
        at = call - first
        return names[at] if 0 <= at < len(names) else self.fallback
