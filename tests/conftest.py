"""Shared fixtures of kvref's own tests: pools under each policy and the atomicity check."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from kvref.errors import KVRefError
from kvref.oracle import OracleBlockPool

# Hypothesis profiles: `ci` is derandomized so CI cannot flake; `dev` explores; `deep` is long.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=60,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=100)
settings.register_profile("deep", deadline=None, max_examples=5_000, stateful_step_count=100)
settings.load_profile(os.environ.get("KVREF_HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

POLICIES = ("lru", "lru-leaf", "ref-zero", "fifo")
CACHING_POLICIES = ("lru", "lru-leaf", "fifo")


@pytest.fixture
def pool() -> OracleBlockPool:
    """Eight blocks, block 0 reserved, lru, events on."""
    return OracleBlockPool(8, enable_events=True)


@pytest.fixture(params=POLICIES)
def any_policy_pool(request: pytest.FixtureRequest) -> OracleBlockPool:
    """Eight blocks under each policy in turn, events on."""
    return OracleBlockPool(8, policy=request.param, enable_events=True)


def fails_unchanged(
    pool: OracleBlockPool,
    call: Callable[[], Any],
    error: type[KVRefError],
    rule: str,
) -> KVRefError:
    """Run ``call``; it must raise ``error`` citing ``rule`` and leave ``pool`` as it was (ERR-501)."""
    before = pool.snapshot()
    with pytest.raises(error) as info:
        call()
    exc = info.value
    assert exc.rule == rule, f"raised {type(exc).__name__} citing {exc.rule}, expected rule {rule}: {exc}"
    assert str(exc).startswith(f"[{rule}]"), f"message {str(exc)!r} does not start with [{rule}] (ERR-502)"
    after = pool.snapshot()
    changed = {k for k in before if before[k] != after[k]}
    assert not changed, f"failed call changed {sorted(changed)}; ERR-501 requires the state unchanged"
    pool.check_invariants()
    return exc


def cache_chain(pool: OracleBlockPool, hashes: list[int], holder: object = None) -> list[int]:
    """Allocate one block per hash, register them as a chain and release them tail first."""
    ids = pool.allocate(len(hashes), holder=holder)
    pool.register(ids, hashes)
    pool.free(ids[::-1], holder=holder)
    return ids
