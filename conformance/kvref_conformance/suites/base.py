"""The base every suite class shares: how it gets its target, capability and prerequisite gates.

A subclass either sets ``target`` (a :class:`~kvref_conformance.target.Target`) or leaves it
None, in which case the plugin's selected backend (``--kvref-backend``) is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from kvref.contract.errors import KVRefError
from kvref.contract.protocol import CAPABILITIES
from kvref_conformance.observe import describe_change, observe
from kvref_conformance.prerequisites import prerequisites_of
from kvref_conformance.session import TARGET_KEY, failed_rules
from kvref_conformance.target import Target

__all__ = [
    "LEAF_POLICIES",
    "ConformanceSuite",
    "cache_chain",
    "corner",
    "fails_unchanged",
    "first_policy",
    "requires",
    "rule",
]

rule = pytest.mark.rule

#: A test of a corner of its rules that the tests depending on those rules never reach (an id listed
#: twice in one call, say). Its failure fails its rules as any other does, but skips no dependent:
#: one broken corner must not hide the chapters built on the rule's common case.
corner = pytest.mark.kvref_corner


def requires(*capabilities: str) -> pytest.MarkDecorator:
    """Mark a test as needing ``capabilities``; it is skipped, with their descriptions, without."""
    for cap in capabilities:
        if cap not in CAPABILITIES:
            raise ValueError(f"unknown capability {cap!r}")
    return pytest.mark.kvref_requires(*capabilities)


#: The policies that evict leaves only and keep the resident hashes prefix-closed (EVICT-404):
#: by release order (EVICT-403) and by access order (EVICT-411).
LEAF_POLICIES = ("lru-leaf", "lru-leaf-access")


def first_policy(target: Target) -> str:
    """The first of lru, lru-leaf, lru-leaf-access, ref-zero, fifo that ``target`` offers (lru when it
    declares none).

    For tests where the policy does not matter (no prefix cache, or bad input), so that a target
    without lru (Megatron offers ref-zero and lru-leaf-access) still runs them.
    """
    offered = [p for p in ("lru", *LEAF_POLICIES, "ref-zero", "fifo") if target.has(f"policy-{p}")]
    return offered[0] if offered else "lru"


def skip_without(target: Target, capability: str) -> None:
    """Skip the running test unless ``target`` has ``capability``."""
    if not target.has(capability):
        pytest.skip(f"{target.name} lacks {capability!r}: {CAPABILITIES[capability]}")


class ConformanceSuite:
    """Shared fixtures: ``impl`` (the Target) and the gates run before every test."""

    target: ClassVar[Target | None] = None

    @pytest.fixture
    def impl(self, request: pytest.FixtureRequest) -> Target:
        """The implementation under test."""
        own = type(self).target
        if own is not None:
            return own
        selected: Target = request.getfixturevalue("kvref_target")
        return selected

    @pytest.fixture(autouse=True)
    def _kvref_gates(self, impl: Target, request: pytest.FixtureRequest) -> None:
        node = request.node
        node.stash[TARGET_KEY] = impl
        needed = [cap for marker in node.iter_markers("kvref_requires") for cap in marker.args]
        for cap in needed or ["block-pool"]:  # a test that names no capability drives a block pool
            skip_without(impl, cap)
        rules = tuple(r for m in node.iter_markers("rule") for r in m.args)
        broken = sorted(prerequisites_of(rules) & failed_rules(request.config, impl.name))
        if broken:
            pytest.skip(f"prerequisite failed: {', '.join(broken)}")

    @staticmethod
    def check(pool: Any) -> None:
        """Run the implementation's own invariant check, where it has one (ERR-508)."""
        check = getattr(pool, "check_invariants", None)
        if check is not None:
            check()

    @staticmethod
    def pool(impl: Target, num_blocks: int = 8, *, policy: str | None = None, **kwargs: Any) -> Any:
        """A new pool of ``impl`` under ``policy``; skips if ``impl`` lacks that policy.

        Without ``policy``: lru, or the first leaf policy a target without lru offers. A test whose
        expectations hold only under lru eviction order names ``policy="lru"``; the others run on
        leaf-only targets too (Megatron-Core offers ref-zero and lru-leaf-access only).
        """
        if policy is None:
            leaf = [p for p in LEAF_POLICIES if impl.has(f"policy-{p}")]
            policy = "lru" if impl.has("policy-lru") or not leaf else leaf[0]
        skip_without(impl, f"policy-{policy}")
        return impl.create(num_blocks, policy=policy, **kwargs)


def fails_unchanged(pool: Any, call: Callable[[], Any], error: type[KVRefError], rule_id: str) -> KVRefError:
    """``call`` raises ``error`` citing ``rule_id`` and leaves the observable state as it was."""
    if hasattr(pool, "take_events"):
        pool.take_events()
    before = observe(pool)
    snapshot = getattr(pool, "snapshot", None)
    deep_before = snapshot() if snapshot is not None else None
    try:
        call()
    except Exception as raised:
        exc = raised
    else:
        pytest.fail(f"[{rule_id}] no error raised; the rule requires {error.__name__}")
    assert isinstance(exc, error), (
        f"[{rule_id}] raised {type(exc).__name__} ({exc}); the rule requires {error.__name__}"
    )
    assert isinstance(exc, KVRefError), f"[ERR-502] {type(exc).__name__} is not a KVRefError"
    assert exc.rule == rule_id, f"[{rule_id}] raised {type(exc).__name__} citing {exc.rule}, expected {rule_id}: {exc}"
    assert str(exc).startswith(f"[{rule_id}]"), f"[ERR-502] message {str(exc)!r} does not start with [{rule_id}]"
    after = observe(pool)
    assert after == before, f"[ERR-501] a failed call changed the state: {describe_change(before, after)}"
    if snapshot is not None:
        deep_after = snapshot()
        changed = sorted(k for k in deep_before or {} if deep_before[k] != deep_after.get(k))  # type: ignore[index]
        assert not changed, f"[ERR-501] a failed call changed the internal state: {changed}"
    if hasattr(pool, "take_events"):
        events = pool.take_events()
        assert events == [], f"[ERR-501] a failed call emitted events {events}"
    return exc


def cache_chain(pool: Any, hashes: list[int], holder: object = None) -> list[int]:
    """Allocate one block per hash, register them as a chain and release them tail first."""
    ids: list[int] = pool.allocate(len(hashes), holder=holder)
    pool.register(ids, hashes)
    pool.free(ids[::-1], holder=holder)
    return ids
