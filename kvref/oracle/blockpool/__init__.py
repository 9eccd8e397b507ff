"""The oracle of chapters 00-05: block pool, reference counts, hash prefix cache, eviction.

:class:`~kvref.oracle.blockpool.pool.OracleBlockPool` is composed of one mixin per concern over
the state declared in :mod:`~kvref.oracle.blockpool.state`.
"""

from kvref.oracle.blockpool.pool import OracleBlockPool

__all__ = ["OracleBlockPool"]
