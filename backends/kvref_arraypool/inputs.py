"""Caller input to host int64 arrays, with exactly the oracle's errors for bad input (ERR-503, HASH-207).

NumPy arrays and tensors of an integer dtype are taken as they are, checked with array
operations; Python sequences go through :mod:`kvref.contract.validate` (the oracle's own checks), so a
bool, float or string anywhere is refused with the same exception and message as the oracle's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kvref.contract.errors import InvalidTypeError
from kvref.contract.validate import as_block_id_list, as_hash_list
from kvref_arraypool.ops import Array, ArrayOps

__all__ = ["device_array", "hash_array", "host_sequence", "index_array", "plain_ints"]

_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def plain_ints(values: object) -> list[int] | None:
    """``values`` as a new list when it is a list or tuple of Python ints (no bools, which are
    refused as the oracle refuses them), else None: a batch's counts or offsets taken in one pass in C."""
    if type(values) is not list and type(values) is not tuple:  # exactly: a subclass may answer differently
        return None
    if not set(map(type, values)) <= {int}:
        return None
    return list(values)


def _integer_array(values: Any) -> np.ndarray | None:
    """``values`` as a 1-d host int64 array when it is an integer array or tensor, else None."""
    if isinstance(values, np.ndarray):
        if values.ndim == 1 and values.dtype.kind in "iu" and (values.dtype.kind == "i" or values.dtype.itemsize < 8):
            return values.astype(np.int64, copy=False)
        return None
    module = type(values).__module__
    if module.startswith("torch") and getattr(values, "ndim", None) == 1:
        dtype = str(values.dtype)
        if dtype in ("torch.int64", "torch.int32", "torch.int16", "torch.int8", "torch.uint8"):
            on_host = values.device.type == "cpu" and not values.requires_grad  # no copy, no autograd: read as it is
            host: np.ndarray = (values if on_host else values.detach().cpu()).numpy()
            return host.astype(np.int64, copy=False)
    return None


def index_array(values: Any, *, op: str, arg: str = "block_ids") -> tuple[np.ndarray, list[int] | None]:
    """Block ids (or counts) as a host int64 array, and the Python list when one was built.

    Values beyond int64 are replaced by -1 in the array (still out of range); the list keeps the
    true values for error messages.
    """
    arr = _integer_array(values)
    if arr is not None:
        return arr, None
    items = as_block_id_list(values, op=op, arg=arg)
    try:
        return np.array(items, dtype=np.int64), items
    except OverflowError:
        clipped = [x if _I64_MIN <= x <= _I64_MAX else -1 for x in items]
        return np.array(clipped, dtype=np.int64), items


def device_array(ops: ArrayOps, values: Any, *, op: str, arg: str, any_width: bool = False) -> Array:
    """``values`` as a 1-d integer array on ``ops``' device: an integer array of that library on that
    device taken as it is (int64, or any width where ``any_width``: for a kernel that reads it),
    anything else checked at once (ERR-514) and copied in as int64 (ids beyond int64 become -1:
    still out of range)."""
    given = ops.device_ints(values, any_width=any_width)
    if given is not None:
        return given
    host, _ = index_array(values, op=op, arg=arg)
    return ops.asarray(host)


def hash_array(values: Any, *, op: str, arg: str = "block_hashes") -> np.ndarray:
    """Block hashes as a host int64 array; each must lie in ``[0, 2**63)`` (HASH-207)."""
    arr = _integer_array(values)
    if arr is not None and (len(arr) == 0 or int(arr.min()) >= 0):
        return arr
    return np.array(as_hash_list(values, op=op, arg=arg), dtype=np.int64)


def host_sequence(values: object, op: str, arg: str) -> Sequence[Any]:
    """A host sequence of a scheduler step's counts or request slots (ERR-503 for anything else, at once)."""
    if isinstance(values, (str, bytes, set, frozenset, dict)) or not isinstance(values, Sequence):
        raise InvalidTypeError("ERR-503", f"{op}: {arg} must be a sequence of ints, got {type(values).__name__}")
    return values
