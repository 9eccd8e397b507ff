"""kvref: an executable, spec-driven reference for paged KV-cache management.

``import kvref`` is light: it loads the errors, the protocol and the argument checks only. The
oracle (:mod:`kvref.oracle`), hashing (:mod:`kvref.hashing`), backends (:mod:`kvref.registry`)
and the command line (:mod:`kvref.cli`) load on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"

from kvref.errors import KVRefError
from kvref.policies import EvictionPolicy
from kvref.protocol import BlockPool, BlockState, PrefixCache

__all__ = ["BlockPool", "BlockState", "EvictionPolicy", "KVRefError", "PrefixCache", "__version__"]
