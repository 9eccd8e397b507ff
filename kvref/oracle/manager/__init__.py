"""The oracle of chapter 07: the request-level manager over any chapter 03 prefix cache.

:class:`RequestManager` (``manager.py``) is vLLM's ``KVCacheManager``, strict, for one or several
KV cache groups (``groups.py``: full attention, sliding windows); ``checks.py`` checks the hits a
scheduler hands back; ``ledger.py`` keeps its statistics in tokens and its events with tokens;
``tables.py`` reads its tables (common prefix, invariants).
"""

from kvref.contract.manager import KVCacheBlocks, RequestBlockStored, RequestPrefixStats
from kvref.contract.requests import Request, RequestStatus
from kvref.oracle.manager.manager import RequestManager

__all__ = ["KVCacheBlocks", "Request", "RequestBlockStored", "RequestManager", "RequestPrefixStats", "RequestStatus"]
