"""The array core's per-block arrays and its free stack (chapters 00, 01).

:class:`BlockArrays` is the array form of the oracle's per-block records: for each of ``n``
blocks its references, generation (POOL-111), owner, hash and hash entry, registration stamp,
release stamp and last access, one int64 array each; and the free stack ``stack[:num_free]`` (top
at the end) whose count is kept on the host, so the free count is read without a device sync.

``owner[b]`` is :data:`NOBODY` for a block no holder holds, the holder id ``h >= 0`` when one
holder holds every reference, or :data:`SHARED` when several do (their counts are in
:class:`~kvref_arraypool.holder_counts.HolderCounts`). ``released[b]`` is the block's release
stamp while it is cached, else -1 (the lru order, EVICT-401); ``registered[b]`` its registration
stamp while hashed (copy age and the fifo order, EVICT-406); ``accessed[b]`` its last access
(lru-leaf-access, EVICT-411).

CUDA graphs (CONF-908): ``ref``, ``gen``, ``hash`` and ``stack`` are allocated once and never
reallocated, so kernels captured in a CUDA graph may read them at fixed addresses between calls.
"""

from __future__ import annotations

import numpy as np

from kvref.contract.errors import BlockIdError
from kvref.contract.protocol import BlockState
from kvref.contract.validate import as_int
from kvref_arraypool.host_arrays import all_true, any_true, positions
from kvref_arraypool.ops import Array, ArrayOps

__all__ = ["NOBODY", "SHARED", "BlockArrays"]

#: ``owner[b]`` of a block no holder holds.
NOBODY = -1
#: ``owner[b]`` of a block several holders hold: their counts are in the per-holder counts.
SHARED = -2


class BlockArrays:
    """Every block's state as one array per field, and the free stack (STATE-001..STATE-005)."""

    def __init__(self, ops: ArrayOps, n: int, reserved: tuple[int, ...]) -> None:
        self.ops = ops
        self.n = n
        self.num_usable = n - len(set(reserved))
        host_reserved = np.zeros(n, dtype=bool)
        host_reserved[list(reserved)] = True
        self.host_reserved = host_reserved
        self.is_reserved = ops.asarray(host_reserved.copy())
        self.ref = ops.zeros(n)
        self.gen = ops.zeros(n)
        self.owner = ops.full(n, NOBODY)
        self.hash = ops.full(n, -1)
        self.entry = ops.full(n, -1)
        self.registered = ops.full(n, -1)
        self.released = ops.full(n, -1)
        self.accessed = ops.full(n, -1)
        self.stack = ops.zeros(n)
        self.num_free = 0
        #: Scratch marks of one call (all -1 between calls) and the positions 0..n-1.
        self.mark = ops.full(n, -1)
        self.positions = ops.arange(n)
        self.refill_stack()

    # ------------------------------------------------------------- the free stack

    def refill_stack(self) -> None:
        """Every usable block free, in a new pool's order: the lowest ids on top (POOL-115)."""
        free = np.arange(self.n - 1, -1, -1, dtype=np.int64)
        free = free[~self.host_reserved[::-1]]
        self.stack[: len(free)] = self.ops.asarray(free)
        self.num_free = len(free)

    def pop_free(self, count: int) -> Array:
        """The top ``count`` free blocks (at most ``num_free``), top first, off the stack."""
        top = self.num_free
        ids = self.ops.copy(self.ops.flip(self.stack[top - count : top]))
        self.num_free = top - count
        return ids

    def push_free(self, blocks: Array) -> None:
        """Put ``blocks`` on the stack in order: the last one ends on top."""
        m = len(blocks)
        if m:
            self.stack[self.num_free : self.num_free + m] = blocks
            self.num_free += m

    def free_blocks(self) -> Array:
        """The free stack, bottom first."""
        return self.stack[: self.num_free]

    # ------------------------------------------------------------- queries

    def check_id(self, value: object, op: str) -> int:
        """``value`` as a block id in range, or BlockIdError (POOL-103)."""
        b = as_int(value, op=op, arg="block_id")
        if not 0 <= b < self.n:
            raise BlockIdError("POOL-103", f"{op}: block id {b} outside [0, {self.n})")
        return b

    def state_of(self, b: int) -> BlockState:
        """The state of block ``b`` (STATE-001)."""
        if self.host_reserved[b]:
            return BlockState.RESERVED
        if int(self.ref[b]):
            return BlockState.IN_USE
        return BlockState.FREE if int(self.hash[b]) < 0 else BlockState.CACHED

    def in_range(self, host_ids: np.ndarray) -> bool:
        """Whether every host id is a block id."""
        return len(host_ids) == 0 or int(host_ids.astype(np.int64, copy=False).view(np.uint64).max()) < self.n

    def distinct(self, ids: Array) -> bool:
        """Whether device ids (all in range) are pairwise distinct: a scatter and a gather, no sort."""
        m = len(ids)
        if m < 2:
            return True
        if m > self.n:
            return False
        pos = self.positions[:m]
        self.mark[ids] = pos
        return not self.ops.any(self.mark[ids] != pos)

    def repeats(self, ids: Array) -> Array:
        """Per position of device ids (all in range, at most ``n``): set where another position names its
        block (all but one position of each block named twice); a scatter and a gather."""
        pos = self.positions[: len(ids)]
        self.mark[ids] = pos
        return self.mark[ids] != pos

    def part(self, blocks: Array, which: np.ndarray) -> Array:
        """The entries of ``blocks`` where the host flags ``which`` are set, in order (no device read)."""
        if all_true(which):
            return blocks
        if not any_true(which):
            return self.ops.zeros(0)
        return blocks[self.ops.asarray(positions(which))]

    def clear(self) -> None:
        """No reference or owner on any block and every usable block free, in a new pool's order; the
        generations stay (POOL-111). The caller has dropped every registration and cache order first."""
        self.ref[:] = 0
        self.owner[:] = NOBODY
        self.refill_stack()
