"""The block pool's fused one-slot calls for arrays in host memory (``torch`` on ``cpu``, NumPy).

:class:`HostBlockKernels` does what the Triton kernels of ``kvref_torch.block_kernels`` do on a
GPU, with NumPy over the pool's own arrays (:mod:`kvref_arraypool.host_views`): ``allocate``
pops blocks for one request slot; ``call`` checks and applies a ``free`` or an ``acquire`` of one
request slot's blocks, a refused call writing only the record. Same checks, same record writes,
same stack order; ``tests/test_host_kernels.py`` holds them to
:class:`~kvref_arraypool.block_arrays.DeviceBlockPool`'s array path.
"""

from __future__ import annotations

import numpy as np

from kvref_arraypool.block_errors import FREE_BLOCK, HELD_ALREADY, NOT_HELD, RANGE, RESERVED, TWICE
from kvref_arraypool.host_flags import all_true
from kvref_arraypool.host_views import SCALAR_LIMIT, HostViews, first_refusal
from kvref_arraypool.ops import Array

__all__ = ["SCALAR_LIMIT", "HostBlockKernels"]

# The free stack's length, after the record's slots (kvref_arraypool.deferred).
_STACK = 6
_BITS = 32  # request slots per bitmap word, as block_arrays packs them


class HostBlockKernels(HostViews):
    """:class:`~kvref_arraypool.block_errors.BlockKernels` for arrays in host memory (see :class:`HostViews`)."""

    name = "host"
    #: Any call: NumPy has no block size.
    max_call = 1 << 62

    def allocate(
        self, *, stack: Array, ref: Array, gen: Array, bits: Array, record: Array, total: int, words: int, slot: int,
        dtype: str,
    ) -> Array:  # fmt: skip
        """Pop ``total`` blocks from the top of the free stack for ``slot``: one reference each, the
        generation bumped, the slot's bit set; the fresh ids in ``dtype``."""
        st, rf, gn, bt, rec = self._host(stack), self._host(ref), self._host(gen), self._host(bits), self._host(record)
        self.launches += 1
        top = int(rec[_STACK])
        rec[_STACK] = top - total
        word, bit = slot // _BITS, 1 << (slot % _BITS)
        out_type = np.int32 if dtype == "int32" else np.int64
        if total <= self._scalar:
            ids = [int(st[top - 1 - k]) for k in range(total)]
            for b in ids:
                rf[b] = 1
                gn[b] += 1
                bt[b * words + word] = bit  # a free block's row is all zero
            return self._wrap(np.array(ids, dtype=out_type))
        taken = st[top - total : top][::-1]
        rf[taken] = 1
        gn[taken] += 1  # distinct blocks: a plain fancy increment is exact
        bt[taken * words + word] = bit
        return self._wrap(taken.astype(out_type))  # astype copies: the output is fresh

    def call(
        self, *, ids: Array, ref: Array, bits: Array, reserved: Array, first: Array, stack: Array, record: Array,
        num_blocks: int, words: int, slot: int, free: bool,
    ) -> None:  # fmt: skip
        """Check and apply one ``free`` (``free=True``) or ``acquire`` of ``ids`` by request slot ``slot``."""
        self.launches += 1
        given = self._ints(ids)
        rf, bt, rec = self._host(ref), self._host(bits), self._host(record)
        word, bit = slot // _BITS, 1 << (slot % _BITS)
        if len(given) <= self._scalar:
            self._call_few(given.tolist(), rf, bt, self._host(reserved), rec, stack, num_blocks, words, word, bit, free)
            return
        if all_true(given.view(np.uint64) < num_blocks):  # in range (a negative id is huge as unsigned)
            at = given * words + word
            old, r = bt[at], rf[given]
            held = (old & bit) != 0
            scratch, order = self._host(first), np.arange(len(given))
            scratch[given] = order  # each entry's position survives only where the ids are distinct
            good = (scratch[given] == order) & ~self._host(reserved)[given] & (held if free else ~held & (r != 0))
            if all_true(good):  # the accepted call's checks, without the codes
                self._note(rec, None)  # counted, nothing refused
                self._apply(given, at, old, r, bt, rf, rec, stack, bit, free)
                return
        self._refuse_or_apply(given, rf, bt, rec, reserved, stack, num_blocks, words, word, bit, free)

    def _apply(
        self, ids: np.ndarray, at: np.ndarray, old: np.ndarray, r: np.ndarray, bt: np.ndarray, rf: np.ndarray,
        rec: np.ndarray, stack: Array, bit: int, free: bool,
    ) -> None:  # fmt: skip
        """The writes of an accepted call of distinct ``ids``: the holding bits, the references, and for a
        ``free`` the push of each block left with none, in the order of the call."""
        if not free:
            bt[at] = old | bit
            rf[ids] = r + 1
            return
        bt[at] = old & ~bit
        rf[ids] = r - 1
        zero = ids[r == 1]
        count = int(rec[_STACK])
        self._host(stack)[count : count + len(zero)] = zero
        rec[_STACK] = count + len(zero)

    def _refuse_or_apply(
        self, given: np.ndarray, rf: np.ndarray, bt: np.ndarray, rec: np.ndarray, reserved: Array, stack: Array,
        num_blocks: int, words: int, word: int, bit: int, free: bool,
    ) -> None:  # fmt: skip
        """The whole check with every entry's code, for a call that may be refused (ERR-511)."""
        out = (given < 0) | (given >= num_blocks)
        safe = np.where(out, num_blocks, given)
        at = safe * words + word
        old = bt[at]
        held = (old & bit) != 0
        r = rf[safe]
        first_seen = np.zeros(len(safe), dtype=np.bool_)
        first_seen[np.unique(safe, return_index=True)[1]] = True
        reserved_flag = self._host(reserved)[safe] != 0
        if free:
            ok = np.where(held, np.where(first_seen, 0, TWICE), NOT_HELD)
        else:
            ok = np.where(r == 0, FREE_BLOCK, np.where(held | ~first_seen, HELD_ALREADY, 0))
        code = np.where(out, RANGE, np.where(reserved_flag, RESERVED, ok))
        if self._note(rec, first_refusal(code, given)):
            self._apply(safe, at, old, r, bt, rf, rec, stack, bit, free)

    def _call_few(
        self, given: list[int], rf: np.ndarray, bt: np.ndarray, rs: np.ndarray, rec: np.ndarray, stack: Array,
        num_blocks: int, words: int, word: int, bit: int, free: bool,
    ) -> None:  # fmt: skip
        """:meth:`call` element by element, for a few entries: the same checks and writes."""
        seen: set[int] = set()
        codes: list[int] = []
        for b in given:
            if not 0 <= b < num_blocks:
                codes.append(RANGE)
                continue
            first = b not in seen
            seen.add(b)
            held = (int(bt[b * words + word]) & bit) != 0
            if rs[b]:
                codes.append(RESERVED)
            elif free:
                codes.append(NOT_HELD if not held else 0 if first else TWICE)
            else:
                codes.append(FREE_BLOCK if rf[b] == 0 else HELD_ALREADY if held or not first else 0)
        if not self._note(rec, next(((at, c, given[at]) for at, c in enumerate(codes) if c), None)):
            return
        if not free:
            for b in given:
                bt[b * words + word] |= bit
                rf[b] += 1
            return
        out, count = self._host(stack), int(rec[_STACK])
        for b in given:
            bt[b * words + word] &= ~bit
            rf[b] -= 1
            if rf[b] == 0:
                out[count] = b
                count += 1
        rec[_STACK] = count
