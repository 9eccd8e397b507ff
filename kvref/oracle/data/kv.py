"""KV buffers per layer, by token slot or by block, with padding slots and prefix copy (DATA-801..DATA-809)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvref.contract.errors import BlockIdError, ConfigError, InvalidValueError
from kvref.oracle.data.tensors import (
    DeviceChecked,
    NumpyTensors,
    Tensors,
    chosen_checks,
    host_indices,
)

__all__ = ["KVBuffers"]


def _positive(value: object, name: str) -> int:
    if type(value) is not int or value < 1:
        raise ConfigError("DATA-801", f"KVBuffers: {name} must be an integer >= 1, got {value!r}")
    return value


def _span(host: np.ndarray) -> slice | None:
    """``host`` as a slice when it is a run of consecutive slots (a contiguous span: one copy, no gather)."""
    if len(host) > 1 and bool((np.diff(host) == 1).all()):
        return slice(int(host[0]), int(host[-1]) + 1)
    return None


class KVBuffers(DeviceChecked):
    """One K and one V buffer per layer (spec chapter 08).

    ``KVBuffers(size, layer_num, k_head_num, k_head_dim, *, v_head_num=None, v_head_dim=None,
    dtype="float16", layout="token", block_size=1, row="heads", tensors=None)``: ``size`` usable
    token slots after the padding (one slot, or one block in the ``paged`` layout, DATA-801);
    ``row="flat"`` stores a token's heads as one row of ``heads * dim``. ``tensors`` picks the
    library and device (NumPy on the host by default). Every call takes token slots.
    ``checks="device"`` checks slots given as arrays of that library on the device, never reading
    them back (DATA-815..DATA-817; the default on a CUDA device); ``"host"`` checks every call at once.
    """

    def __init__(
        self,
        size: int,
        layer_num: int,
        k_head_num: int,
        k_head_dim: int,
        *,
        v_head_num: int | None = None,
        v_head_dim: int | None = None,
        dtype: str = "float16",
        layout: str = "token",
        block_size: int = 1,
        row: str = "heads",
        tensors: Tensors | None = None,
        checks: str | None = None,
    ) -> None:
        self.tensors: Tensors = tensors or NumpyTensors()
        self.size = _positive(size, "size")
        self.layer_num = _positive(layer_num, "layer_num")
        self.k_shape = (_positive(k_head_num, "k_head_num"), _positive(k_head_dim, "k_head_dim"))
        vh = k_head_num if v_head_num is None else v_head_num
        vd = k_head_dim if v_head_dim is None else v_head_dim
        self.v_shape = (_positive(vh, "v_head_num"), _positive(vd, "v_head_dim"))
        if layout not in ("token", "paged") or row not in ("heads", "flat"):
            raise ConfigError(
                "DATA-801", f"KVBuffers: layout must be token or paged and row heads or flat, got {layout!r}, {row!r}"
            )
        self.block_size = _positive(block_size, "block_size")
        if layout == "paged" and (size % block_size or row == "flat"):
            raise ConfigError(
                "DATA-801",
                f"KVBuffers: a paged layout needs size {size} a multiple of block_size {block_size}, and heads rows",
            )
        if layout == "token" and block_size != 1:
            raise ConfigError("DATA-801", "KVBuffers: block_size belongs to the paged layout")
        self.layout, self.row, self.dtype = layout, row, dtype
        self.padding = block_size if layout == "paged" else 1  # slots [0, padding) absorb padded writes
        self.slots = size + self.padding
        self._checks = chosen_checks(self.tensors, self.slots, checks, owner="KVBuffers", rule="DATA-815")
        self._mark: np.ndarray | None = None  # the host check of repeated slots, made when first needed
        self.k_buffer = [self.tensors.zeros(self._shape(self.k_shape), dtype) for _ in range(layer_num)]
        self.v_buffer = [self.tensors.zeros(self._shape(self.v_shape), dtype) for _ in range(layer_num)]

    def _shape(self, heads_dim: tuple[int, int]) -> tuple[int, ...]:
        if self.layout == "paged":
            return (self.slots // self.block_size, self.block_size, *heads_dim)
        return (self.slots, heads_dim[0] * heads_dim[1]) if self.row == "flat" else (self.slots, *heads_dim)

    # ------------------------------------------------------------------ checks

    def _layer(self, layer: object, op: str) -> int:
        if type(layer) is not int or not 0 <= layer < self.layer_num:
            raise BlockIdError("DATA-804", f"{op}: layer {layer!r} outside [0, {self.layer_num})")
        return layer

    def _slots(self, indices: object, op: str, arg: str = "indices") -> np.ndarray:
        host = host_indices(indices, op=op, arg=arg)
        if host.size and (int(host.min()) < 0 or int(host.max()) >= self.slots):
            flat = host.ravel()
            bad = int(flat[(flat < 0) | (flat >= self.slots)][0])
            raise BlockIdError("DATA-804", f"{op}: slot {bad} outside [0, {self.slots})")
        return host

    def _repeats(self, slots: np.ndarray) -> bool:
        """Whether host ``slots`` (all in range) name one slot twice: a scatter and a gather, no sort."""
        n = len(slots)
        if n < 2:
            return False
        if self._mark is None:
            self._mark = np.zeros(self.slots, dtype=np.int64)
        at = np.arange(n)
        self._mark[slots] = at
        return bool((self._mark[slots] != at).any())

    def _no_padding(self, host: np.ndarray, op: str, arg: str) -> None:
        flat = host.ravel()
        if flat.size and int(flat.min()) < self.padding:
            bad = int(flat[flat < self.padding][0])
            raise InvalidValueError("DATA-802", f"{op}: {arg} slot {bad} is padding and holds no data")

    def _rows(self, layer_buffer: Any) -> Any:
        """The buffer as rows of token slots (a view), whatever its layout."""
        return layer_buffer.reshape(self.slots, *layer_buffer.shape[-2:]) if self.layout == "paged" else layer_buffer

    def _shaped(self, data: Any, batch: tuple[int, ...], heads_dim: tuple[int, int], op: str, name: str) -> Any:
        shape = tuple(data.shape)
        if shape[: len(batch)] != batch or math.prod(shape[len(batch) :]) != heads_dim[0] * heads_dim[1]:
            raise InvalidValueError(
                "DATA-803",
                f"{op}: {name} of shape {shape} for indices of shape {batch}: its leading dimensions must be the "
                f"indices' and its trailing ones multiply to {heads_dim[0]} x {heads_dim[1]}",
            )
        n = math.prod(batch)
        return data.reshape(n, heads_dim[0] * heads_dim[1]) if self.row == "flat" else data.reshape(n, *heads_dim)

    # ------------------------------------------------------------------ calls

    def set_kv(self, layer: int, indices: object, k: Any, v: Any) -> None:
        """Write ``k`` and ``v`` at token slots ``indices`` of ``layer`` (DATA-802..DATA-807)."""
        op = "set_kv"
        layer = self._layer(layer, op)
        checks = self._checks
        taken = None if checks is None else checks.take(indices)
        if checks is not None and taken is not None:  # checked on the device: no host read (DATA-815)
            flat, shape = taken
            ks = self._shaped(k, shape, self.k_shape, op, "k")
            vs = self._shaped(v, shape, self.v_shape, op, "v")
            rows_at = checks.writes(flat, op=op, padding=self.padding)
            self._rows(self.k_buffer[layer])[rows_at] = self.tensors.values(ks, self.dtype)
            self._rows(self.v_buffer[layer])[rows_at] = self.tensors.values(vs, self.dtype)
            return
        host = self._slots(indices, op)
        batch = tuple(host.shape)
        ks = self._shaped(k, batch, self.k_shape, op, "k")
        vs = self._shaped(v, batch, self.v_shape, op, "v")
        flat = host.ravel()
        usable = flat[flat >= self.padding]
        if self._repeats(usable):
            raise InvalidValueError("DATA-807", f"{op}: a usable slot appears twice in one call")
        t = self.tensors
        k_rows, v_rows = self._rows(self.k_buffer[layer]), self._rows(self.v_buffer[layer])
        if len(usable) == len(flat):  # no padded token: one scatter, or one slice for a span
            where: Any = _span(flat) or t.index(flat)
            k_rows[where] = t.values(ks, self.dtype)
            v_rows[where] = t.values(vs, self.dtype)
            return
        keep = np.flatnonzero(flat >= self.padding)  # padded tokens' writes are absorbed
        if not len(keep):
            return
        where, pick = t.index(flat[keep]), t.index(keep)
        k_rows[where] = t.values(ks, self.dtype)[pick]
        v_rows[where] = t.values(vs, self.dtype)[pick]

    def get_kv(self, layer: int, indices: object) -> tuple[Any, Any]:
        """Fresh copies of K and V at ``indices``: ``[*indices.shape, heads, dim]`` (DATA-806)."""
        op = "get_kv"
        layer = self._layer(layer, op)
        checks = self._checks
        taken = None if checks is None else checks.take(indices)
        if checks is not None and taken is not None:  # on the device: a refused call reads the padding (DATA-817)
            flat, shape = taken
            rows_at = checks.reads(flat, op=op, padding=self.padding)
            k = self._rows(self.k_buffer[layer])[rows_at].reshape(*shape, *self.k_shape)
            v = self._rows(self.v_buffer[layer])[rows_at].reshape(*shape, *self.v_shape)
            return k, v
        host = self._slots(indices, op)
        self._no_padding(host, op, "source")
        where = self.tensors.index(host.ravel())
        k = self._rows(self.k_buffer[layer])[where].reshape(*host.shape, *self.k_shape)
        v = self._rows(self.v_buffer[layer])[where].reshape(*host.shape, *self.v_shape)
        return k, v

    def copy_kv(self, src: object, dst: object) -> None:
        """Copy every layer's K and V rows of ``src`` slots into ``dst`` slots (DATA-809)."""
        op = "copy_kv"
        if self._copied_on_device(src, dst, op):
            return
        s = self._slots(src, op, "src").ravel()
        d = self._slots(dst, op, "dst").ravel()
        if len(s) != len(d):
            raise InvalidValueError("DATA-809", f"{op}: {len(s)} src slots and {len(d)} dst slots")
        self._no_padding(s, op, "src")
        self._no_padding(d, op, "dst")
        if len(np.unique(d)) != len(d) or np.intersect1d(s, d).size:
            raise InvalidValueError("DATA-809", f"{op}: dst slots repeat or are also src slots")
        if not len(s):
            return
        t = self.tensors
        si: Any = _span(s) or t.index(s)
        di: Any = _span(d) or t.index(d)
        for buffers in (self.k_buffer, self.v_buffer):
            for layer_buffer in buffers:
                rows = self._rows(layer_buffer)
                rows[di] = rows[si]

    def _copied_on_device(self, src: object, dst: object, op: str) -> bool:
        """``copy_kv`` of slots given as device arrays, checked on the device (DATA-815); False otherwise."""
        checks = self._checks
        if checks is None:
            return False
        src_taken, dst_taken = checks.take(src), checks.take(dst)
        if src_taken is None or dst_taken is None:
            return False
        s, d = src_taken[0], dst_taken[0]
        if len(s) != len(d):
            raise InvalidValueError("DATA-809", f"{op}: {len(s)} src slots and {len(d)} dst slots")
        if len(s):
            si, di = checks.copies(s, d, op=op, padding=self.padding)
            for buffers in (self.k_buffer, self.v_buffer):
                for layer_buffer in buffers:
                    rows = self._rows(layer_buffer)
                    rows[di] = rows[si]
        return True

    def mem_bytes(self) -> int:
        """Bytes of every K and V buffer (DATA-808)."""
        return sum(self.tensors.nbytes(b) for b in (*self.k_buffer, *self.v_buffer))

    def __repr__(self) -> str:
        return (
            f"KVBuffers({self.size} slots, {self.layer_num} layers, K {self.k_shape}, V {self.v_shape}, "
            f"{self.dtype}, {self.layout}, on {self.tensors.name} {self.tensors.device})"
        )
