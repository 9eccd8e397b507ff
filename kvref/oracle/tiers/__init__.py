"""Chapter 11, the tiered cache: one tier's store (:class:`OracleTierStore`) and the longest prefix over tiers."""

from kvref.oracle.tiers.prefix import TieredPrefix, tiered_prefix
from kvref.oracle.tiers.store import OracleTierStore, RequestUse

__all__ = ["OracleTierStore", "RequestUse", "TieredPrefix", "tiered_prefix"]
