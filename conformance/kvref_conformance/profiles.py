"""Hypothesis profiles of the suite: ``ci``, ``dev`` and ``deep``.

``ci`` runs the whole suite for one backend in well under 3 minutes on 2 cores and is
derandomized, so CI cannot flake; ``dev`` explores new examples on every run; ``deep`` runs at
least 100,000 state-machine steps per machine (5,000 examples of up to 60 steps), for long runs.
Selection: ``--kvref-profile``, else ``KVREF_HYPOTHESIS_PROFILE``, else ``ci`` when ``CI`` is
set, else ``dev``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["PROFILES", "register_profiles", "selected_profile"]

PROFILES = {
    "ci": {"derandomize": True, "max_examples": 40, "stateful_step_count": 40, "report_multiple_bugs": False},
    "dev": {"max_examples": 100, "stateful_step_count": 50},
    "deep": {"max_examples": 5_000, "stateful_step_count": 60},
}


def register_profiles() -> None:
    """Register the profiles with Hypothesis (idempotent)."""
    for name, values in PROFILES.items():
        settings.register_profile(
            name,
            deadline=None,
            print_blob=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            **values,  # type: ignore[arg-type]
        )


def selected_profile(option: str | None = None) -> str:
    """The profile to load, by the precedence in the module docstring."""
    name = option or os.environ.get("KVREF_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
    if name not in PROFILES:
        raise ValueError(f"unknown Hypothesis profile {name!r}; known: {sorted(PROFILES)}")
    return name
