"""Which rules a rule's tests take for granted (so a broken foundation skips, not cascades).

When a test of a prerequisite rule fails, every later test whose rules depend on it is skipped
with "prerequisite failed: RULE" instead of failing for the same root cause. A test marked
``corner`` (``suites.base.corner``) checks what no dependent relies on; its failure skips nothing.
"""

from __future__ import annotations

__all__ = ["PREREQUISITES", "prerequisites_of"]

_ALLOCATE_AND_FREE = ("POOL-104", "POOL-107")
_CACHE = (*_ALLOCATE_AND_FREE, "PFX-301", "PFX-307")

#: Prerequisites by rule prefix; a rule never depends on itself.
PREREQUISITES: dict[str, tuple[str, ...]] = {
    "STATE": _ALLOCATE_AND_FREE,
    "POOL": _ALLOCATE_AND_FREE,
    "PFX": _CACHE,
    "EVICT": (*_CACHE, "PFX-311"),
    "ERR": _ALLOCATE_AND_FREE,
    "TIER": ("TIER-1104", "TIER-1110"),
}


def prerequisites_of(rules: tuple[str, ...]) -> set[str]:
    """The prerequisite rules of a test citing ``rules``, minus the rules it tests itself."""
    out: set[str] = set()
    for rid in rules:
        out.update(PREREQUISITES.get(rid.split("-")[0], ()))
    return out - set(rules)
