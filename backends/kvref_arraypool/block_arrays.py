"""Chapter 01's block pool as an engine calls it on a GPU: request slots as holders, device arrays, no host sync.

:class:`DeviceBlockPool` is the block pool's array surface (ERR-510..ERR-514, ERR-517..ERR-520):
holders are integer **request slots** ``0 .. max_requests - 1`` (the row an engine gives a running
request), ``allocate`` hands out the blocks of a whole scheduler step as one fresh device array,
and ``free`` and ``acquire`` take device arrays of block ids with one request slot per entry.
Every rule of chapter 01 is still checked, on the device: a refused ``free`` or ``acquire``
changes nothing and leaves its error in a :class:`~kvref_arraypool.deferred.DeviceErrorRecord`
that :meth:`check` raises, naming the call.

Where the state lives:

* per block: ``ref`` (references) and ``gen`` (POOL-111), and which request slots hold it, as
  one bit per (block, slot) in int64 words of 32 bits (a slot holds at most one reference per
  block, ERR-518: a request's block table names each block once);
* the free stack ``stack`` (top at the end) whose length is a device counter (a ``free`` pushes
  on the device, where it alone knows which blocks lost their last reference), and a host
  **floor**: blocks known to be on the stack, exact after each read of the device and lowered by
  each ``allocate``. An ``allocate`` within the floor never waits for the device (ERR-513).

Every write of ``free`` and ``acquire`` is predicated on the call's verdict, and refused or
unused entries write to a dump index past the end of each array, so no write depends on a host
branch. There is no prefix cache on this surface (see the chapter's implementation-defined
section): a block whose last reference goes is free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, SupportsIndex

import numpy as np

from kvref.contract.errors import (
    BlockIdError,
    BlockStateError,
    InvalidValueError,
    NotHeldError,
    OutOfBlocksError,
    ReservedBlockError,
)
from kvref.contract.validate import IntsLike, as_count, as_int, as_pool_shape
from kvref_arraypool.deferred import CallNames, DeviceErrorRecord, ErrorKind
from kvref_arraypool.inputs import device_array, host_sequence
from kvref_arraypool.ops import Array, ArrayOps

__all__ = ["BLOCK_ERRORS", "BlockKernels", "DeviceBlockPool"]

#: The codes (the fused kernels write the same numbers).
RANGE, RESERVED, NOT_HELD, BAD_SLOT, TWICE, FREE_BLOCK, HELD_ALREADY = 1, 2, 3, 4, 5, 6, 7

#: The errors a device-checked ``free`` or ``acquire`` records (ERR-511), by code.
BLOCK_ERRORS = {
    RANGE: ErrorKind("POOL-103", BlockIdError, "is outside the pool's block ids"),
    RESERVED: ErrorKind("POOL-118", ReservedBlockError, "is a reserved block, never handed out"),
    NOT_HELD: ErrorKind(
        "POOL-108", NotHeldError, "is a block its request slot holds no reference to (a double or foreign free?)"
    ),
    BAD_SLOT: ErrorKind("ERR-517", InvalidValueError, "is a request slot outside [0, max_requests)"),
    TWICE: ErrorKind("POOL-109", NotHeldError, "names a (block, request slot) pair the call named before"),
    FREE_BLOCK: ErrorKind("POOL-119", BlockStateError, "is a free block, whose content is undefined"),
    HELD_ALREADY: ErrorKind(
        "ERR-518", InvalidValueError, "is a block its request slot holds already (one reference per slot and block)"
    ),
}


class BlockKernels(Protocol):
    """Fused one-slot calls for one array library and device (:class:`kvref_cuda.CudaBlockKernels`).

    Each does in one launch what the array path of :class:`DeviceBlockPool` does for a call
    whose entries all belong to one request slot, over the same arrays and record, with the same
    result; ``call`` (a ``free``, or an ``acquire``) takes up to ``max_call`` entries.
    """

    name: str
    max_call: int

    def allocate(
        self,
        *,
        stack: Array,
        ref: Array,
        gen: Array,
        bits: Array,
        record: Array,
        total: int,
        words: int,
        slot: int,
        dtype: str,
    ) -> Array:
        """Pop ``total`` blocks for ``slot``; the fresh ids in ``dtype``."""

    def call(
        self,
        *,
        ids: Array,
        ref: Array,
        bits: Array,
        reserved: Array,
        first: Array,
        stack: Array,
        record: Array,
        num_blocks: int,
        words: int,
        slot: int,
        free: bool,
    ) -> None:
        """Check and apply a ``free`` (``free=True``) or an ``acquire`` of ``ids`` by ``slot``."""


_DTYPES = ("int32", "int64")
_BITS = 32  # request slots per int64 word of the holding bitmap
_STACK = 0  # the record's counter: the free stack's length


class DeviceBlockPool:
    """Blocks with reference counts, request slots as holders, checked on the device (ERR-517..ERR-520).

    ``num_blocks`` blocks of which ``reserved_ids`` are never handed out (POOL-101, POOL-102);
    ``max_requests`` request slots; ``dtype`` of the returned ids, ``"int32"`` (the seeds' choice)
    or ``"int64"``. Blocks are handed out in the oracle's order (top of the free stack first).
    """

    def __init__(
        self,
        num_blocks: SupportsIndex,
        *,
        ops: ArrayOps,
        max_requests: SupportsIndex = 256,
        reserved_ids: IntsLike = (0,),
        dtype: str = "int32",
        kernels: BlockKernels | None = None,
    ) -> None:
        op = "DeviceBlockPool"
        n, reserved = as_pool_shape(num_blocks, reserved_ids, op=op)
        slots = as_count(max_requests, op=op, arg="max_requests")
        if slots < 1:
            raise InvalidValueError("ERR-517", f"{op}: max_requests must be at least 1, got {slots}")
        if dtype not in _DTYPES:
            raise InvalidValueError("ERR-510", f"{op}: dtype must be one of {_DTYPES}, got {dtype!r}")
        if dtype == "int32" and n > 2**31:
            raise InvalidValueError("ERR-510", f"{op}: block ids up to {n - 1} do not fit int32; ask for dtype='int64'")
        self.ops = ops
        #: Fused kernels for the calls of one request slot (one launch each), or None: array operations.
        self.kernels = kernels
        self.num_blocks, self.max_requests, self.dtype = n, slots, dtype
        #: The blocks never handed out (POOL-101, POOL-102), ascending.
        self.reserved_ids = tuple(sorted(reserved))
        self._words = -(-slots // _BITS)
        host_reserved = np.zeros(n + 1, dtype=bool)  # index n: the dump index, never reserved
        host_reserved[list(reserved)] = True
        self.num_usable = n - len(reserved)
        free = np.arange(n - 1, -1, -1, dtype=np.int64)
        free = free[~host_reserved[n - 1 :: -1]]
        # Each array has a dump index at the end for the writes of refused or unused entries.
        self._stack = ops.zeros(n + 1)
        self._stack[: len(free)] = ops.asarray(free)
        self._reserved = ops.asarray(host_reserved.copy())
        self._ref = ops.zeros(n + 1)
        self._gen = ops.zeros(n + 1)
        self._bits = ops.zeros((n + 1) * self._words)
        self._last = ops.zeros(n + 1)
        self._iota = ops.arange(n + 1)
        self._ones = ops.full(n + 1, 1)
        self.record = DeviceErrorRecord(ops, BLOCK_ERRORS, counters=1)
        self.record.counter(_STACK)[:] = ops.asarray(np.array([len(free)], dtype=np.int64))
        self._floor = len(free)
        self._unconfirmed = False
        self._names = CallNames("free or acquire")  # each checked call's operation, for the report

    # ------------------------------------------------------------------ sizes

    def available_blocks(self) -> int:
        """Free blocks, exactly: the largest total ``allocate`` grants now (POOL-106, ERR-513).

        Reads the device only when a ``free`` has run since the last read; raises an error a
        check recorded before answering (ERR-512).
        """
        if self._unconfirmed:
            self._confirm()
        return self._floor

    def check(self) -> None:
        """Raise the first error a device check recorded since the last report, once (ERR-511, ERR-512).

        One host read (a sync on a GPU), which also confirms the free count.
        """
        self._confirm()

    @property
    def calls(self) -> int:
        """How many checked calls (``free``, ``acquire``) were made: the call index the next one gets (ERR-511)."""
        return self._names.made

    @property
    def calls_confirmed(self) -> int:
        """How many checked calls were made at the last host read of the record: every error of a call
        below this index has been reported (ERR-511)."""
        return self._names.confirmed

    def _confirm(self) -> None:
        host = self.record.read()
        self._floor = int(host[-1])
        self._unconfirmed = False
        self.record.report(host, self._names)

    # ------------------------------------------------------------- allocation

    def allocate(self, counts: Sequence[SupportsIndex], slots: Sequence[SupportsIndex]) -> tuple[Array, list[int]]:
        """A scheduler step's blocks: ``counts[i]`` fresh blocks for request slot ``slots[i]`` (ERR-519).

        Returns one fresh device array of every request's blocks in turn, in the pool's dtype,
        and ``len(counts) + 1`` host offsets into it. All or nothing: when the total exceeds the
        free blocks it raises ``OutOfBlocksError`` (POOL-105) and takes nothing. No host sync
        while the host floor covers the total; otherwise one read, which first raises an error a
        check recorded (ERR-512).
        """
        op = "allocate"
        wants = [as_count(c, op=op, arg="counts") for c in host_sequence(counts, op, "counts")]
        owners = [self.request_slot(s, op) for s in host_sequence(slots, op, "slots")]
        if len(wants) != len(owners):
            raise InvalidValueError("ERR-506", f"{op}: {len(wants)} counts for {len(owners)} request slots")
        offsets = [0]
        for c in wants:
            offsets.append(offsets[-1] + c)
        total = offsets[-1]
        if total > self._floor:
            self._confirm()
            if total > self._floor:
                raise OutOfBlocksError(
                    "POOL-105",
                    f"{op}: asked for {total} blocks, {self._floor} free of {self.num_usable} usable; "
                    "nothing was taken",
                )
        ops = self.ops
        if total == 0:
            return ops.cast(self._iota[:0], self.dtype), offsets
        one = len(set(owners)) == 1
        if self.kernels is not None and one:
            got = self.kernels.allocate(
                stack=self._stack,
                ref=self._ref,
                gen=self._gen,
                bits=self._bits,
                record=self.record.array,
                total=total,
                words=self._words,
                slot=owners[0],
                dtype=self.dtype,
            )
            self._floor -= total  # once the launch is made: a launch that raises leaves the count as it was
            return got, offsets
        counter = self.record.counter(_STACK)
        ids = self._stack[counter - 1 - self._iota[:total]]
        counter -= total  # in place: the counter is a view into the record's array
        self._floor -= total
        ops.fill_at(self._ref, ids, 1)
        self._gen[ids] += 1
        if one:
            s = owners[0]
            # fresh blocks: no other holder's bit
            ops.fill_at(self._bits, ids * self._words + s // _BITS, 1 << (s % _BITS))
        else:
            per = np.repeat(np.array(owners, dtype=np.int64), wants)  # each block's slot: its word and bit, one copy in
            word_bit = ops.asarray(np.stack([per // _BITS, np.left_shift(1, per % _BITS)]))
            self._bits[ids * self._words + word_bit[0]] = word_bit[1]
        return ops.cast(ids, self.dtype), offsets

    # ------------------------------------------------------- free and acquire

    def free(self, block_ids: Any, slots: Any) -> None:
        """Drop request slot ``slots[i]``'s reference to ``block_ids[i]`` for every entry (ERR-520).

        ``slots``: one request slot per entry (a device array or a sequence), or one int for all.
        A block left with no reference goes on top of the free stack, in the order of the entries
        that released them. Checked on the device, no host sync (POOL-103, POOL-108, POOL-109,
        POOL-118, ERR-517); a refused call changes nothing and :meth:`check` raises its error.
        """
        if self._fused(block_ids, slots, "free"):
            self._unconfirmed = True
            return
        pairs = self._pairs(block_ids, slots, "free")
        if pairs is None:
            return
        ops = self.ops
        ids, safe, slot, word, bit, held, twice, codes = pairs
        codes = ops.where(codes != 0, codes, ops.where(~held, NOT_HELD, ops.where(twice, TWICE, 0)))
        one = isinstance(slot, int)
        accepted, taken = self._verdict(ids, slot, codes)
        m = len(safe)
        ops.scatter_add(self._bits, word, -bit * taken)
        ops.scatter_add(self._ref, safe, -taken)
        if one or m == 1:  # an accepted call names each block once: every entry is its block's last
            zero = (self._ref[safe] == 0) & accepted
        else:  # two slots may release one block: it leaves at its last entry
            at = self._positions(m)
            ops.fill_at(self._last, safe, -1)
            ops.scatter_max(self._last, safe, at)
            zero = (self._last[safe] == at) & (self._ref[safe] == 0) & accepted
        rank = ops.cumsum(zero) - 1
        counter = self.record.counter(_STACK)
        self._stack[ops.where(zero, counter + rank, self.num_blocks)] = safe
        counter += rank[-1:] + 1
        self._unconfirmed = True

    def acquire(self, block_ids: Any, slots: Any) -> None:
        """Add request slot ``slots[i]``'s reference to in-use block ``block_ids[i]`` for every entry (ERR-520).

        The form of a prefix hit on blocks other requests hold. Checked on the device, no host
        sync (POOL-103, POOL-118, POOL-119, ERR-517, ERR-518); a refused call changes nothing.
        """
        if self._fused(block_ids, slots, "acquire"):
            return
        pairs = self._pairs(block_ids, slots, "acquire")
        if pairs is None:
            return
        ops = self.ops
        ids, safe, slot, word, bit, held, twice, codes = pairs
        unused = self._ref[safe] == 0
        codes = ops.where(codes != 0, codes, ops.where(unused, FREE_BLOCK, ops.where(held | twice, HELD_ALREADY, 0)))
        _, taken = self._verdict(ids, slot, codes)
        ops.scatter_add(self._bits, word, bit * taken)
        ops.scatter_add(self._ref, safe, taken)

    def _verdict(self, ids: Array, slot: Any, codes: Array) -> tuple[Array, Array]:
        """Record the call's first error, if any (ERR-511): its verdict (0-d) and each entry's reference
        change, 1 when accepted and 0 when refused, so every write can be predicated on it."""
        ops, m = self.ops, len(ids)
        values = ids if isinstance(slot, int) else ops.where(codes == BAD_SLOT, slot, ids)
        accepted = self.record.note(codes, values)
        ones = self._ones[:m] if m <= len(self._ones) else ops.full(m, 1)
        return accepted, ops.where(accepted, ones, 0)

    def _fused(self, block_ids: Any, slots: Any, op: str) -> bool:
        """Run a call of one request slot (one host int) in one kernel launch, where there are kernels."""
        kernels = self.kernels
        if kernels is None or not _is_int(slots):
            return False
        ids = device_array(self.ops, block_ids, op=op, arg="block_ids", any_width=True)
        if not 0 < len(ids) <= kernels.max_call:
            return False
        slot = self.request_slot(slots, op)
        kernels.call(
            ids=ids,
            ref=self._ref,
            bits=self._bits,
            reserved=self._reserved,
            first=self._last,
            stack=self._stack,
            record=self.record.array,
            num_blocks=self.num_blocks,
            words=self._words,
            slot=slot,
            free=op == "free",
        )
        self._names.add(op)
        return True

    def _pairs(self, block_ids: Any, slots: Any, op: str) -> tuple[Any, ...] | None:
        """The entries of a call on the device, and what every check shares (None for an empty call).

        Returns the ids, the ids made safe to index (the dump index for those out of range), the
        slots (one host int when the call gave one), each entry's bitmap word and bit, whether its
        slot holds it, whether the call named its pair before, and the codes of the checks before
        the operation's own (ERR-517, POOL-103, POOL-118).
        """
        ops, n = self.ops, self.num_blocks
        ids = device_array(ops, block_ids, op=op, arg="block_ids")
        m = len(ids)
        one = _is_int(slots)
        # a host slot is checked at once
        slot: Any = self.request_slot(slots, op) if one else device_array(ops, slots, op=op, arg="slots")
        if not one and len(slot) != m:
            raise InvalidValueError("ERR-506", f"{op}: {m} block ids for {len(slot)} request slots")
        if m == 0:
            return None
        self._names.add(op)
        out = (ids < 0) | (ids >= n)
        safe = ops.where(out, n, ids)
        codes = ops.where(out, RANGE, ops.where(self._reserved[safe], RESERVED, 0))
        if one:  # the common call: one request's blocks; a repeated block is a repeated pair
            word, bit = safe * self._words + slot // _BITS, 1 << (slot % _BITS)
            if m > 1:
                at = self._positions(m)
                ops.fill_at(self._last, safe, m)
                ops.scatter_min(self._last, safe, at)
                twice = self._last[safe] != at
            else:
                twice = ops.falses(1)
        else:
            bad_slot = (slot < 0) | (slot >= self.max_requests)
            codes = ops.where(bad_slot, BAD_SLOT, codes)
            s = ops.where(bad_slot, 0, slot)
            word, bit = safe * self._words + s // _BITS, 1 << (s % _BITS)
            twice = ops.falses(m)
            if m > 1:
                key = safe * self.max_requests + s
                order = ops.argsort(key)
                ordered = key[order]
                twice[order[1:]] = ordered[1:] == ordered[:-1]  # stable: the later entry of a pair is named twice
        held = (self._bits[word] & bit) != 0
        return ids, safe, slot, word, bit, held, twice, codes

    def _positions(self, m: int) -> Array:
        """``0 .. m - 1`` on the device (a view of a kept range for calls up to the pool's size)."""
        return self._iota[:m] if m <= len(self._iota) else self.ops.arange(m)

    def request_slot(self, value: object, op: str) -> int:
        """``value`` as a request slot of this pool: ERR-503 for a non-int, ERR-517 outside ``[0, max_requests)``."""
        s = as_int(value, op=op, arg="slots")
        if not 0 <= s < self.max_requests:
            raise InvalidValueError("ERR-517", f"{op}: request slot {s} outside [0, {self.max_requests})")
        return s

    # ---------------------------------------------------------------- queries

    def ref_count(self, block_id: SupportsIndex) -> int:
        """References on ``block_id`` (STATE-002); a host read."""
        return int(self._ref[self._block(block_id)])

    def generation(self, block_id: SupportsIndex) -> int:
        """How many times ``block_id`` has been allocated (POOL-111); a host read."""
        return int(self._gen[self._block(block_id)])

    def holders(self, block_id: SupportsIndex) -> list[int]:
        """The request slots holding ``block_id``, ascending (STATE-002); a host read."""
        b = self._block(block_id)
        words = self.ops.to_host(self._bits[b * self._words : (b + 1) * self._words])
        return [w * _BITS + i for w, word in enumerate(words.tolist()) for i in range(_BITS) if word >> i & 1]

    def _block(self, value: object) -> int:
        b = as_int(value, op="query", arg="block_id")
        if not 0 <= b < self.num_blocks:
            raise BlockIdError("POOL-103", f"query: block id {b} outside [0, {self.num_blocks})")
        return b

    def snapshot(self) -> dict[str, Any]:
        """The free stack, references, generations and holding bits (host reads), for before/after comparison."""
        ops, n = self.ops, self.num_blocks
        top = int(self.record.read()[-1])
        return {
            "free": ops.tolist(self._stack[:top]),
            "ref": ops.tolist(self._ref[:n]),
            "gen": ops.tolist(self._gen[:n]),
            "bits": ops.tolist(self._bits[: n * self._words]),
        }

    def __repr__(self) -> str:
        return (
            f"DeviceBlockPool(num_blocks={self.num_blocks}, max_requests={self.max_requests}, "
            f"dtype={self.dtype!r}, device={self.ops.device!r})"
        )


def _is_int(value: object) -> bool:
    """Whether ``value`` is one host int (one request slot for every entry of a call)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
