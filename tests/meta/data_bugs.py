"""Planted bugs of the data plane (chapter 08): the slips users fear most in the memory the ids address.

Each is a backend the conformance suite loads by name (``tests.meta.data_bugs:X``): the oracle,
whose ``data_plane()`` hands out one buggy class in place of kvref's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvref.oracle.backend import OracleBackend
from kvref.oracle.data import DataPlane, KVBuffers, ReqToTokenTable, RoutingStore, StatePool


class PaddingRead(KVBuffers):
    """``get_kv`` reads a padding slot as if it held data."""

    def _no_padding(self, host: np.ndarray, op: str, arg: str) -> None:
        if op != "get_kv":
            super()._no_padding(host, op, arg)


class StateNotZeroed(StatePool):
    """``reset_states`` forgets the conv state: a new request starts from the last one's."""

    def reset_states(self, slots: object) -> None:
        where = self.tensors.index(self._checked(slots, "reset_states", "slots"))
        self.recurrent_state[:, where] = 0


class EvictedRoutingKept(RoutingStore):
    """``forget`` does nothing: a reallocated block still answers with its former tokens' routing."""

    def forget(self, block_ids: object) -> None:
        self._blocks(block_ids, "forget")


class CopyWrongSpan(KVBuffers):
    """``copy_kv`` copies every source shifted by one slot (the classic off-by-one of a span)."""

    def copy_kv(self, src: object, dst: object) -> None:
        super().copy_kv(np.asarray(src) + 1 if len(np.asarray(src)) > 1 else src, dst)


class PagedOffByOne(KVBuffers):
    """In the paged layout a token's row within its block is read one row off (``offset + 1``, wrapping)."""

    def get_kv(self, layer: int, indices: object) -> tuple[Any, Any]:
        if self.layout != "paged":
            return super().get_kv(layer, indices)
        host = np.asarray(indices)
        shifted = host - host % self.block_size + (host % self.block_size + 1) % self.block_size
        return super().get_kv(layer, shifted)


class SlotsStoredBackwards(KVBuffers):
    """Usable token slots are stored in reverse row order, and every call maps them the same way: what
    ``set_kv`` writes ``get_kv`` reads back, but a kernel reading the buffer at slot ``s``'s row finds
    another token's KV."""

    def _stored(self, indices: object) -> Any:
        host = np.asarray(indices)
        usable = (host >= self.padding) & (host < self.slots)
        return np.where(usable, self.padding + self.slots - 1 - host, host)

    def set_kv(self, layer: int, indices: object, k: Any, v: Any) -> None:
        super().set_kv(layer, self._stored(indices), k, v)

    def get_kv(self, layer: int, indices: object) -> tuple[Any, Any]:
        return super().get_kv(layer, self._stored(indices))

    def copy_kv(self, src: object, dst: object) -> None:
        super().copy_kv(self._stored(src), self._stored(dst))


class StaleRow(ReqToTokenTable):
    """``alloc`` hands out a row with what its former request wrote still in it."""

    def alloc(self, n: int = 1) -> list[int] | None:
        if n > len(self._free):
            return None
        rows = [self._free.pop() for _ in range(n)]
        self._held.update(rows)
        return rows


class ClearLeavesRowsWritten(ReqToTokenTable):
    """``clear`` hands every row back but leaves what requests wrote in them: a row handed out next
    names a former request's slots until its own are written."""

    def clear(self) -> None:
        written = self.req_to_token.copy()
        super().clear()
        self.req_to_token[...] = written


def _backend(**classes: type[Any]) -> type[OracleBackend]:
    class PlantedDataBackend(OracleBackend):
        def data_plane(self, device: str | None = None, **options: Any) -> DataPlane:
            self.device(device)
            return DataPlane(DataPlane.reference().tensors, **classes)

    return PlantedDataBackend


#: Each planted bug, the part it replaces and the rules the suite may name for it.
DATA_BUGS: dict[str, tuple[str, set[str]]] = {
    "PaddingRead": ("kv_class", {"DATA-802"}),
    "StateNotZeroed": ("states_class", {"DATA-822"}),
    "EvictedRoutingKept": ("routing_class", {"DATA-832"}),
    "CopyWrongSpan": ("kv_class", {"DATA-809"}),
    "PagedOffByOne": ("kv_class", {"DATA-801", "DATA-802", "DATA-809"}),
    "StaleRow": ("table_class", {"DATA-811"}),
    "SlotsStoredBackwards": ("kv_class", {"DATA-818"}),
    "ClearLeavesRowsWritten": ("table_class", {"DATA-814"}),
}

for _name, (_part, _) in DATA_BUGS.items():
    _backend_class = _backend(**{_part: globals()[_name]})
    _backend_class.__name__ = _backend_class.__qualname__ = _name + "Backend"
    globals()[_name] = _backend_class()
