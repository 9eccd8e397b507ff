"""The request-to-token table: a row of token slots per live request (DATA-810..DATA-814)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvref.contract.errors import ConfigError, InvalidValueError
from kvref.oracle.data.tensors import NumpyTensors, Tensors, host_indices

__all__ = ["ReqToTokenTable"]


class ReqToTokenTable:
    """``ReqToTokenTable(max_reqs, max_context_len, *, tensors=None)``: rows ``[1, max_reqs]`` of
    ``max_context_len`` int32 token slots; row 0 is reserved. A pure mapping: the caller keeps each
    request's length, as SGLang's and pymllm's schedulers do."""

    def __init__(self, max_reqs: int, max_context_len: int, *, tensors: Tensors | None = None) -> None:
        for name, value in (("max_reqs", max_reqs), ("max_context_len", max_context_len)):
            if type(value) is not int or value < 1:
                raise ConfigError("DATA-810", f"ReqToTokenTable: {name} must be an integer >= 1, got {value!r}")
        self.tensors: Tensors = tensors or NumpyTensors()
        self.max_reqs = max_reqs
        self.max_context_len = max_context_len
        self.req_to_token = self.tensors.zeros((max_reqs + 1, max_context_len), "int32")
        self._free = list(range(max_reqs, 0, -1))  # pop() hands out the lowest row first
        self._held: set[int] = set()
        #: Takes slots given as an integer array of the library as they are, without reading them
        #: back (DATA-815's ``take``); None for the reference, which reads every argument on the host.
        self._device = self.tensors.device_checks(max_context_len)

    def available_size(self) -> int:
        """Rows not handed out (DATA-810)."""
        return len(self._free)

    def alloc(self, n: int = 1) -> list[int] | None:
        """``n`` rows reading as 0 everywhere, or None taking nothing when fewer are free (DATA-810, DATA-811)."""
        if type(n) is not int or n < 0:
            raise InvalidValueError("DATA-810", f"alloc: n must be an integer >= 0, got {n!r}")
        if n > len(self._free):
            return None
        rows = [self._free.pop() for _ in range(n)]
        if rows:
            self.req_to_token[self.tensors.index(np.array(rows))] = 0  # nothing a former holder wrote
        self._held.update(rows)
        return rows

    def _held_row(self, row: object, op: str, rule: str) -> int:
        if type(row) is not int or row not in self._held:
            raise InvalidValueError(rule, f"{op}: row {row!r} is not handed out")
        return row

    def free(self, row: int) -> None:
        """Return ``row``; a row not handed out is refused, changing nothing (DATA-812)."""
        self._held.discard(self._held_row(row, "free", "DATA-812"))
        self._free.append(row)

    def write(self, row: int, start: int, slots: object) -> None:
        """Write token ``slots`` at positions ``[start, start + len)`` of ``row`` (DATA-813).

        Slots given as an integer array of the table's library are written as they are, never read
        back (no host sync on a GPU); anything else is checked on the host (ERR-503)."""
        op = "write"
        self._held_row(row, op, "DATA-813")
        taken = None if self._device is None else self._device.take(slots)
        values = host_indices(slots, op=op, arg="slots").ravel() if taken is None else taken[0]
        if type(start) is not int or start < 0 or start + len(values) > self.max_context_len:
            raise InvalidValueError(
                "DATA-813",
                f"{op}: positions from {start!r}, {len(values)} of them, of row {row} outside "
                f"[0, {self.max_context_len})",
            )
        if len(values):  # a device array stays on the device: its length is known on the host
            self.req_to_token[row, start : start + len(values)] = self.tensors.values(values, "int32")

    def read(self, row: int, start: int, stop: int) -> Any:
        """A fresh copy of positions ``[start, stop)`` of ``row`` (DATA-813)."""
        self._held_row(row, "read", "DATA-813")
        if not (type(start) is int and type(stop) is int and 0 <= start <= stop <= self.max_context_len):
            raise InvalidValueError("DATA-813", f"read: [{start!r}, {stop!r}) outside [0, {self.max_context_len}]")
        return self.req_to_token[row, start:stop][self.tensors.index(np.arange(stop - start))]

    def clear(self) -> None:
        """Free every row and zero the table (DATA-814)."""
        self._free = list(range(self.max_reqs, 0, -1))
        self._held.clear()
        self.req_to_token[...] = 0
