"""Hypothesis profiles of the suite: ``ci``, ``dev`` and ``deep``.

``ci`` runs the whole suite for one backend in well under 3 minutes on 2 cores and is
derandomized, so CI cannot flake; ``dev`` explores new examples on every run; ``deep`` runs at
least 100,000 state-machine steps per machine (5,000 examples of up to 60 steps), for long runs.

Each profile gives Hypothesis's shrinking a budget per failing test (:data:`SHRINK_SECONDS`): ``ci``
10 s, so that a small implementation with a few bugs gets its verdict and a replay within a minute;
``dev`` a minute; ``deep`` Hypothesis's own five minutes. A replay shrunk within its budget is still
a replay of the failure, only maybe longer than the shortest; ``--no-shrink`` skips shrinking.

Selection: ``--kvref-profile``, else ``KVREF_HYPOTHESIS_PROFILE``, else ``ci`` when ``CI`` is
set, else ``dev``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["PROFILES", "SHRINK_SECONDS", "register_profiles", "selected_profile", "shrink_stop_said", "shrink_within"]

PROFILES = {
    "ci": {"derandomize": True, "max_examples": 40, "stateful_step_count": 40, "report_multiple_bugs": False},
    "dev": {"max_examples": 100, "stateful_step_count": 50},
    "deep": {"max_examples": 5_000, "stateful_step_count": 60},
}


#: Seconds Hypothesis may spend shrinking one failing test, per profile.
SHRINK_SECONDS = {"ci": 10, "dev": 60, "deep": 300}


def shrink_within(profile: str) -> int:
    """Give shrinking the budget of ``profile`` (a name of :data:`PROFILES`, maybe with ``-no-shrink``).

    Hypothesis keeps its budget in ``MAX_SHRINKING_SECONDS``, documented as the setting to change
    for a shorter or longer shrink; returns the seconds now allowed.
    """
    from hypothesis.internal.conjecture import engine

    seconds = SHRINK_SECONDS[profile.removesuffix("-no-shrink")]
    engine.MAX_SHRINKING_SECONDS = seconds
    return seconds


#: The start of what Hypothesis prints when shrinking runs out of its time budget.
_SHRINK_STOPPED = "WARNING: Hypothesis has spent more than five minutes working to shrink"


def shrink_stop_said(text: str, profile: str) -> str:
    """``text`` (a failing test's output) with Hypothesis's note on a shrink stopped at its time budget,
    which assumes its own five minutes and asks for a bug report, replaced by one naming ``profile``'s
    budget; any other text unchanged."""
    if _SHRINK_STOPPED not in text:
        return text
    name = profile.removesuffix("-no-shrink")
    ours = (
        f"kvref: shrinking stopped at profile {name}'s budget of {SHRINK_SECONDS[name]} s per failure: "
        "the replay above fails as shown but may not be the shortest (--profile deep shrinks for up to five minutes)"
    )
    kept = [block for block in text.split("\n\n") if "Hypothesis has spent more than" not in block]
    kept = [block for block in kept if not block.startswith("PLEASE REPORT THIS")]
    return "\n\n".join([ours, *kept]).strip() + "\n"


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
