"""What one pytest run of the suite keeps between its plugin and its suites.

The plugin (:mod:`kvref_conformance.plugin`) fills it in ``pytest_configure`` and reads it in its
report hooks; the suites' gates (:mod:`kvref_conformance.suites.base`) read and write it per
test. Both import this module and neither imports the other's internals, so the two stay free of
an import circle.
"""

from __future__ import annotations

import pytest

from kvref_conformance.target import Target

__all__ = ["FAILED_RULES", "PROFILE", "TARGET_KEY", "failed_rules"]

#: The target a test ran against, stashed on its item by the suites' gates.
TARGET_KEY = pytest.StashKey[Target]()
#: Target name -> rules with a failed test so far in this run.
FAILED_RULES = pytest.StashKey[dict[str, set[str]]]()
#: The Hypothesis profile this run loaded (``ci``, ``dev``, ``deep``, maybe ``-no-shrink``).
PROFILE = pytest.StashKey[str]()


def failed_rules(config: pytest.Config, target_name: str) -> set[str]:
    """Rules with a failed test so far for ``target_name`` (a failed prerequisite skips its dependents)."""
    return config.stash[FAILED_RULES].setdefault(target_name, set())
