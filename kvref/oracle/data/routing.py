"""MoE routing per block: stored from the active-token layout, reconstructed per request (DATA-830..DATA-832)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvref.contract.errors import BlockIdError, ConfigError, InvalidValueError
from kvref.oracle.data.tensors import NumpyTensors, Tensors, host_indices

__all__ = ["RoutingStore"]


class RoutingStore:
    """``RoutingStore(num_blocks, block_size, num_layers, topk, *, tensors=None)``: the expert ids
    ``[num_layers, topk]`` of every token position of every block (int32), and which positions
    hold routing at all (a block handed out again holds none, DATA-832)."""

    def __init__(
        self, num_blocks: int, block_size: int, num_layers: int, topk: int, *, tensors: Tensors | None = None
    ) -> None:
        for name, value in (
            ("num_blocks", num_blocks),
            ("block_size", block_size),
            ("num_layers", num_layers),
            ("topk", topk),
        ):
            if type(value) is not int or value < 1:
                raise ConfigError("DATA-830", f"RoutingStore: {name} must be an integer >= 1, got {value!r}")
        self.tensors: Tensors = tensors or NumpyTensors()
        self.num_blocks, self.block_size, self.shape = num_blocks, block_size, (num_layers, topk)
        self.routing = self.tensors.zeros((num_blocks, block_size, num_layers, topk), "int32")
        self.known = np.zeros((num_blocks, block_size), dtype=bool)  # host: which positions hold routing

    def _blocks(self, values: object, op: str) -> np.ndarray:
        host = host_indices(values, op=op, arg="blocks").ravel()
        if host.size and (int(host.min()) < 0 or int(host.max()) >= self.num_blocks):
            raise BlockIdError("DATA-830", f"{op}: a block outside [0, {self.num_blocks}) in {host.tolist()[:8]}")
        return host

    def store_flat(self, routing: Any, blocks: object, offsets: object) -> None:
        """Store each active token's routing at its offset in its block (DATA-830)."""
        op = "store_flat"
        b = self._blocks(blocks, op)
        o = host_indices(offsets, op=op, arg="offsets").ravel()
        shape = tuple(routing.shape)
        if len(o) != len(b) or shape != (len(b), *self.shape):
            raise InvalidValueError(
                "DATA-830",
                f"{op}: routing {shape} for {len(b)} blocks and {len(o)} offsets; expected ({len(b)}, {self.shape})",
            )
        if o.size and (int(o.min()) < 0 or int(o.max()) >= self.block_size):
            raise InvalidValueError("DATA-830", f"{op}: an offset outside [0, {self.block_size})")
        if len(set(zip(b.tolist(), o.tolist(), strict=True))) != len(b):
            raise InvalidValueError("DATA-830", f"{op}: a (block, offset) appears twice")
        if not len(b):
            return
        t = self.tensors
        self.routing[t.index(b), t.index(o)] = t.values(routing, "int32")
        self.known[b, o] = True

    def reconstruct(self, block_ids: object, total_routing_tokens: int) -> Any | None:
        """The routing of the first ``total_routing_tokens`` positions of ``block_ids`` in order, or None
        when any of them lacks routing (DATA-831)."""
        op = "reconstruct"
        b = self._blocks(block_ids, op)
        n = total_routing_tokens
        if type(n) is not int or not 0 <= n <= len(b) * self.block_size:
            raise InvalidValueError("DATA-831", f"{op}: {n!r} tokens for {len(b)} blocks of {self.block_size}")
        positions = np.arange(n)
        rows, cols = b[positions // self.block_size], positions % self.block_size
        if not bool(self.known[rows, cols].all()):
            return None
        t = self.tensors
        return self.routing[t.index(rows), t.index(cols)]

    def forget(self, block_ids: object) -> None:
        """Drop the routing of blocks evicted or handed out again (DATA-832)."""
        self.known[self._blocks(block_ids, "forget")] = False
