"""The oracle adopts the conformance suite exactly as a third party would: by subclassing.

Every rule-tagged test of ``kvref_conformance`` runs here on the oracle, so kvref's own test run
checks the oracle against every rule and the suite against the oracle.
"""

from __future__ import annotations

from kvref_conformance import Target
from kvref_conformance.suites.errors import ErrorSuite
from kvref_conformance.suites.eviction import EvictionSuite
from kvref_conformance.suites.hashing import HashingSuite
from kvref_conformance.suites.pool import PoolSuite
from kvref_conformance.suites.prefix_cache import PrefixCacheSuite
from kvref_conformance.suites.stateful import StatefulSuite

ORACLE = Target.from_backend("oracle")


class TestOraclePool(PoolSuite):
    target = ORACLE


class TestOracleHashing(HashingSuite):
    target = ORACLE


class TestOraclePrefixCache(PrefixCacheSuite):
    target = ORACLE


class TestOracleEviction(EvictionSuite):
    target = ORACLE


class TestOracleErrors(ErrorSuite):
    target = ORACLE


class TestOracleStateful(StatefulSuite):
    target = ORACLE
