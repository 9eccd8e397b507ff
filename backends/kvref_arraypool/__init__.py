"""The array core shared by kvref's device backends (torch, CuPy): one implementation, thin library layers.

:class:`ArrayBlockPool` keeps a pool's whole state in 1-d int64 arrays and does each call in a
constant number of vectorized operations; :class:`ArrayOps` is the layer a library supplies
(:class:`NumpyLikeOps` for NumPy and CuPy; ``kvref_torch.ops.TorchOps`` for torch).
"""

from kvref_arraypool.ops import ArrayOps, NumpyLikeOps
from kvref_arraypool.pool import ArrayBlockPool

__all__ = ["ArrayBlockPool", "ArrayOps", "NumpyLikeOps"]
