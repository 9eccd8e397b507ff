"""A scheduler step over the block pool's array surface: request block tables on the device, grown and
released for a whole batch in one call each (REQ-750..REQ-756).

A GPU engine keeps each running request's block table as a row of one device array (vLLM's
``BlockTable``, Megatron's request-to-block map), which its attention kernels read. A scheduler
step grows many rows at once: every decoding request whose next token opens a block needs one.
:class:`DeviceBlockTables` does that with one ``allocate`` of :class:`DeviceBlockPool` for the
whole step and one scatter of the new ids into their rows; a release of finished requests is one
gather and one ``free``. The lengths of the rows are host integers, as the scheduler's own token
counts are, so a step computes what it needs on the host and never reads the device while the
pool's free count covers it (ERR-513).

There is no prefix cache on this surface (chapter 07's implementation-defined section): the
request manager of chapter 07 over a pool with caching off hands out the same blocks, in the same
order, and the conformance suite checks exactly that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import SupportsIndex

import numpy as np

from kvref.contract.errors import InvalidTypeError, InvalidValueError, KVRefError
from kvref.contract.validate import as_count
from kvref_arraypool.block_arrays import DeviceBlockPool
from kvref_arraypool.deferred import REFUSED
from kvref_arraypool.inputs import host_sequence
from kvref_arraypool.ops import Array

__all__ = ["DeviceBlockTables"]


class DeviceBlockTables:
    """One block table row per request slot of ``pool``, on its device (REQ-750..REQ-756).

    ``block_size`` tokens per block; ``max_blocks`` entries per row (a request of more than
    ``max_blocks * block_size`` tokens is refused). Unused entries hold block 0, the pool's
    reserved null block.
    """

    def __init__(self, pool: DeviceBlockPool, *, block_size: SupportsIndex, max_blocks: SupportsIndex) -> None:
        op = "DeviceBlockTables"
        if not isinstance(pool, DeviceBlockPool):
            raise InvalidTypeError("ERR-503", f"{op}: pool must be a DeviceBlockPool, got {type(pool).__name__}")
        size = as_count(block_size, op=op, arg="block_size", rule="REQ-756")
        width = as_count(max_blocks, op=op, arg="max_blocks", rule="REQ-756")
        if size < 1 or width < 1:
            raise InvalidValueError("REQ-756", f"{op}: block_size {size} and max_blocks {width} must be >= 1")
        if 0 not in pool.reserved_ids:
            raise InvalidValueError("REQ-756", f"{op}: block 0 pads the rows, so the pool must reserve it")
        if pool.available_blocks() != pool.num_usable:
            raise InvalidValueError("REQ-756", f"{op}: the pool already has blocks in use")
        self.pool, self.ops = pool, pool.ops
        self.block_size, self.max_blocks = size, width
        rows = pool.max_requests
        self._flat = self.ops.cast(self.ops.zeros(rows * width), pool.dtype)
        #: The tables as a ``max_requests x max_blocks`` view in the pool's dtype (row ``s`` is request
        #: slot ``s``, REQ-753): state the engine's kernels read, which only this object writes.
        self.table = self._flat.reshape(rows, width)
        self._lengths = [0] * rows
        self._released: dict[int, list[tuple[int, int]]] = {}  # the pool's call index -> the rows it released

    def num_blocks(self, slot: SupportsIndex) -> int:
        """How many blocks request slot ``slot`` holds (a host int, no device read)."""
        return self._lengths[self.pool.request_slot(slot, "num_blocks")]

    def blocks(self, slot: SupportsIndex) -> list[int]:
        """Request slot ``slot``'s blocks in token order (a host read, for checking)."""
        s = self.pool.request_slot(slot, "blocks")
        start = s * self.max_blocks
        return self.ops.tolist(self._flat[start : start + self._lengths[s]])

    @property
    def releases_unconfirmed(self) -> int:
        """How many releases since the pool's last host read the tables keep the rows of, to restore
        them if the pool reports one refused (REQ-752): bounded by the releases between two reads."""
        confirmed = self.pool.calls_confirmed
        return sum(call >= confirmed for call in self._released)

    # ------------------------------------------------------------------ the step

    def step(self, slots: Sequence[SupportsIndex], num_tokens: Sequence[SupportsIndex]) -> tuple[Array, list[int]]:
        """Grow each named request's row to hold ``num_tokens[i]`` tokens, all in one allocation (REQ-750).

        Returns the new blocks as one fresh device array, every request's in turn, and
        ``len(slots) + 1`` host offsets into it. All or nothing: refused input (REQ-751) or too few
        free blocks (REQ-755, POOL-105) raise and change nothing. No device read while the pool's host
        floor covers the step (REQ-754).
        """
        op = "step"
        owners = self._slots(slots, op)
        tokens = [as_count(n, op=op, arg="num_tokens") for n in host_sequence(num_tokens, op, "num_tokens")]
        if len(tokens) != len(owners):
            raise InvalidValueError("REQ-751", f"{op}: {len(tokens)} token counts for {len(owners)} request slots")
        size, width, lengths = self.block_size, self.max_blocks, self._lengths
        counts = []
        for s, n in zip(owners, tokens, strict=True):
            need = -(-n // size)
            if need > width:
                raise InvalidValueError(
                    "REQ-751", f"{op}: request slot {s}'s {n} tokens need {need} blocks; a row holds {width}"
                )
            counts.append(max(0, need - lengths[s]))
        try:
            ids, offsets = self.pool.allocate(counts, owners)  # POOL-105 here changes nothing
        except KVRefError as exc:  # a host read may report an earlier refused release: its rows come back
            self._restore(exc)
            raise
        if offsets[-1]:
            held = zip(owners, counts, strict=True)
            at = np.concatenate([s * width + np.arange(lengths[s], lengths[s] + c, dtype=np.int64) for s, c in held])
            self._flat[self.ops.asarray(at)] = ids
            for s, c in zip(owners, counts, strict=True):
                lengths[s] += c
        return ids, offsets

    def release(self, slots: Sequence[SupportsIndex]) -> None:
        """Free every block of each named request with one ``free``, each row tail first, and empty
        the rows (REQ-752); a row that holds nothing is a no-op. Checked on the device as ``free``
        is (ERR-511): a refused release (a block freed behind the tables' back) keeps every row it
        named on the device, and :meth:`check` gives them back their lengths as it raises."""
        op = "release"
        owners = self._slots(slots, op)
        width, lengths, ops = self.max_blocks, self._lengths, self.ops
        held = [(s, lengths[s]) for s in owners if lengths[s]]
        if not held:
            return
        at = np.concatenate([s * width + np.arange(n - 1, -1, -1, dtype=np.int64) for s, n in held])
        per = np.concatenate([np.full(n, s, dtype=np.int64) for s, n in held])
        where, refused = ops.asarray(at), self.pool.record.array[REFUSED : REFUSED + 1]
        before = ops.copy(refused)
        confirmed = self.pool.calls_confirmed  # the errors of calls below it were reported: nothing to restore
        self._released = {call: rows for call, rows in self._released.items() if call >= confirmed}
        self._released[self.pool.calls] = held  # the call index this free gets
        self.pool.free(self._flat[where], ops.asarray(per))
        self._flat[where] = ops.where(refused != before, self._flat[where], 0)  # refused: the rows stay
        for s, _ in held:
            lengths[s] = 0

    def check(self) -> None:
        """Raise the first error the pool's device checks recorded, once, as :meth:`DeviceBlockPool.check`
        does (ERR-511); when it is a refused release, its rows get their blocks back first (REQ-752)."""
        try:
            self.pool.check()
        except KVRefError as exc:
            self._restore(exc)
            raise
        finally:
            self._released = {}

    def _restore(self, exc: KVRefError) -> None:
        """Give the rows of the refused release ``exc`` reports their lengths back (REQ-752)."""
        for s, n in self._released.pop(getattr(exc, "call_index", -1), []):
            self._lengths[s] = n

    # ---------------------------------------------------------------- checks

    def _slots(self, slots: object, op: str) -> list[int]:
        owners = [self.pool.request_slot(s, op) for s in host_sequence(slots, op, "slots")]
        if len(set(owners)) != len(owners):
            raise InvalidValueError("REQ-751", f"{op}: request slots {owners} name one slot twice")
        return owners

    def __repr__(self) -> str:
        return (
            f"DeviceBlockTables(rows={len(self._lengths)}, max_blocks={self.max_blocks}, "
            f"block_size={self.block_size}, pool={self.pool!r})"
        )
