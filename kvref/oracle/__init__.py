"""The strict pure-Python oracle every implementation is compared with (spec chapters 00-05)."""

from kvref.oracle.blockpool.pool import OracleBlockPool

__all__ = ["OracleBlockPool"]
