"""kvref's conformance suite: rule-tagged tests and differential state machines for any implementation.

Adopt it in a few lines, as with zarr.testing or fsspec's abstract tests::

    from kvref_conformance import Target, PoolSuite, PrefixCacheSuite, StatefulSuite

    MINE = Target.from_factory("mine", make_my_pool, capabilities={"prefix-cache", "policy-lru"})

    class TestMyPool(PoolSuite):
        target = MINE

    class TestMyCache(PrefixCacheSuite):
        target = MINE

or run it on a registered backend: ``kvref conformance --backend NAME``, or
``pytest --pyargs kvref_conformance --kvref-backend NAME``. Importing this package is light; the
suite classes (which need pytest, Hypothesis and NumPy: ``pip install 'kvref[conformance]'``)
load on first use.
"""

from __future__ import annotations

from typing import Any

from kvref_conformance.target import PROFILES, Target

__all__ = [
    "PROFILES",
    "ErrorOrderSuite",
    "ErrorSuite",
    "EvictionSuite",
    "HashingSuite",
    "PoolSuite",
    "PrefixCacheSuite",
    "StatefulSuite",
    "Target",
]

_SUITES = {
    "PoolSuite": "kvref_conformance.suites.pool",
    "PrefixCacheSuite": "kvref_conformance.suites.prefix_cache",
    "EvictionSuite": "kvref_conformance.suites.eviction",
    "HashingSuite": "kvref_conformance.suites.hashing",
    "ErrorSuite": "kvref_conformance.suites.errors",
    "ErrorOrderSuite": "kvref_conformance.suites.error_order",
    "StatefulSuite": "kvref_conformance.suites.stateful",
}


def __getattr__(name: str) -> Any:
    module = _SUITES.get(name)
    if module is None:
        raise AttributeError(f"module 'kvref_conformance' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
