"""The oracle of chapters 00-05: block pool, reference counts, hash prefix cache, eviction.

:class:`~kvref.oracle.blockpool.pool.OracleBlockPool` composes its parts, one object per concern:
blocks, cache orders, prefix index, eviction, references, batched calls and the fused replay.
"""

from kvref.oracle.blockpool.pool import OracleBlockPool

__all__ = ["OracleBlockPool"]
