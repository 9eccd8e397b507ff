"""What every fused kernel of an array surface writes into the deferred record (ERR-511, ERR-512).

:func:`note_first_error` is :meth:`kvref_arraypool.deferred.DeviceErrorRecord.note` inside a Triton
program: given one code per entry of the call (0: fine), it writes the first offending entry into
the record if no earlier error waits there, counts the call (and the refusal), and returns the
position of the first offending entry (``BLOCK`` when the call is accepted). The record's layout is
:mod:`kvref_arraypool.deferred`'s: code, call, position, value, refused calls, calls.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["note_first_error"]


@triton.jit
def note_first_error(rec_ptr, code, values, i, BLOCK: tl.constexpr):
    """Record the first nonzero ``code`` (entry ``i``, value ``values``) of a refused call; its position."""
    pos = tl.min(tl.where(code != 0, i, BLOCK), axis=0)
    refused = pos < BLOCK
    code_at = tl.sum(tl.where(i == pos, code, 0), axis=0).to(tl.int64)
    value_at = tl.sum(tl.where(i == pos, values, 0), axis=0)
    old_code = tl.load(rec_ptr + 0)
    calls = tl.load(rec_ptr + 5)
    fresh = refused & (old_code == 0)
    tl.store(rec_ptr + 0, tl.where(fresh, code_at, old_code))
    tl.store(rec_ptr + 1, tl.where(fresh, calls, tl.load(rec_ptr + 1)))
    tl.store(rec_ptr + 2, tl.where(fresh, pos.to(tl.int64), tl.load(rec_ptr + 2)))
    tl.store(rec_ptr + 3, tl.where(fresh, value_at, tl.load(rec_ptr + 3)))
    tl.store(rec_ptr + 4, tl.load(rec_ptr + 4) + refused.to(tl.int64))
    tl.store(rec_ptr + 5, calls + 1)
    return pos
