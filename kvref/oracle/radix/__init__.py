"""The oracle of chapter 06: a token-slot allocator with pages and a token radix cache over it.

:class:`OracleSlotAllocator` hands out token slots in pages (SGLang's token and paged allocators,
pymllm's, a bitmask slot allocator's versions); :class:`OracleRadixCache` is the radix tree whose nodes own
slots (SGLang's ``RadixCache``).
"""

from kvref.contract.errors import FreeGroupError
from kvref.oracle.radix.allocator import OracleSlotAllocator
from kvref.oracle.radix.records import LockReceipt, MatchResult, RadixStats
from kvref.oracle.radix.tree import OracleRadixCache

__all__ = ["FreeGroupError", "LockReceipt", "MatchResult", "OracleRadixCache", "OracleSlotAllocator", "RadixStats"]
