"""The array core shared by kvref's device backends (torch, CuPy): one implementation, thin library layers.

:class:`ArrayBlockPool` keeps a pool's whole state in 1-d int64 arrays and does each call in a
constant number of vectorized operations; :class:`ArrayOps` is the layer a library supplies
(:class:`NumpyLikeOps` for NumPy and CuPy; ``kvref_torch.ops.TorchOps`` for torch);
:class:`kvref_arraypool.backend.ArrayBackend` is the backend object both build on. Importing the
package loads no array library: the names below load on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["ArrayBlockPool", "ArrayOps", "NumpyLikeOps"]

_HOMES = {
    "ArrayBlockPool": "kvref_arraypool.pool",
    "ArrayOps": "kvref_arraypool.ops",
    "NumpyLikeOps": "kvref_arraypool.ops",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'kvref_arraypool' has no attribute {name!r}")
