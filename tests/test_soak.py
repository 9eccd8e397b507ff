"""Soak, the CI-sized version (issue: 10**5 operations): invariants hold and memory stays flat.

``nox -s soak`` runs 10**7 operations per policy on the oracle and 10**6 on each device backend.
"""

from __future__ import annotations

import pytest

from kvref.config.registry import backend_statuses
from kvref_conformance.soak import run_soak

rule = pytest.mark.rule

DEVICE_BACKENDS = [s.name for s in backend_statuses() if s.usable and s.name in ("torch", "cupy")]


@rule("STATE-001", "STATE-002", "STATE-003")
@pytest.mark.parametrize("policy", ["lru", "lru-leaf", "fifo", "ref-zero"])
def test_a_hundred_thousand_mixed_operations_on_the_oracle_keep_invariants_and_memory_flat(policy: str) -> None:
    report = run_soak("oracle", ops=100_000, policy=policy, num_blocks=2048, check_every=10_000)
    assert report.checks == 10, "check_invariants ran every 10,000 operations and found nothing"
    assert report.counts.get("free", 0) > 20_000 and report.counts.get("match", 0) > 5_000, report.counts
    rss, state = report.growth()
    assert report.flat, f"{policy}: after the warm-up resident memory grew {rss:,} bytes and the state {state:,}"


@rule("STATE-001", "STATE-002", "STATE-003")
@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_mixed_operations_on_a_device_backend_keep_invariants_and_its_arrays_flat(backend: str) -> None:
    ops = 5_000 if backend == "torch" else 10_000
    report = run_soak(backend, ops=ops, policy="lru", num_blocks=2048, check_every=2_500)
    rss, state = report.growth()
    assert report.flat, f"{backend}: after the warm-up resident memory grew {rss:,} bytes and the arrays {state:,}"


@rule("STATE-003")
def test_a_state_that_keeps_growing_after_the_warm_up_is_reported() -> None:
    from kvref_conformance.soak import SoakReport

    samples = [(i * 1000, 50 << 20, 10_000 + i * 100) for i in range(1, 101)]  # +100 entries per sample
    leaking = SoakReport("x", "lru", 64, 100_000, 1.0, 10, samples=samples)
    assert not leaking.flat and leaking.growth()[1] == 9_000
    steady = SoakReport("x", "lru", 64, 100_000, 1.0, 10, samples=[(i * 1000, 50 << 20, 10_000) for i in range(1, 101)])
    assert steady.flat and steady.growth() == (0, 0)
