"""kvref: an executable, spec-driven reference for paged KV-cache management.

``import kvref`` is light: it loads the contract's errors, protocol and argument checks only. The
oracle (:mod:`kvref.oracle`), hashing (:mod:`kvref.contract.hashing`), backends
(:mod:`kvref.config.registry`) and the command line (:mod:`kvref.cli`) load on first use.
ARCHITECTURE.md at the repository's root maps the rooms.
"""

from __future__ import annotations

__version__ = "0.1.0"

from kvref.contract.errors import KVRefError
from kvref.contract.policies import EvictionPolicy
from kvref.contract.protocol import BlockPool, BlockState, PrefixCache

__all__ = ["BlockPool", "BlockState", "EvictionPolicy", "KVRefError", "PrefixCache", "__version__"]
