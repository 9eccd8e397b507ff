"""Old module paths, from before kvref/ was split into rooms, kept importable as aliases.

``import kvref.errors`` (or ``from kvref.registry import create_pool``) still works: a finder on
``sys.meta_path`` answers each old name in :data:`MOVED` with the module that now holds the code,
the very same module object, so classes and functions compare identical under both names. The
aliases load nothing until they are imported. New code imports the new paths; ARCHITECTURE.md
lists the rooms.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED", "install"]

#: Old module name -> the module that holds its code now.
MOVED: dict[str, str] = {
    "kvref.protocol": "kvref.contract.protocol",
    "kvref.errors": "kvref.contract.errors",
    "kvref.events": "kvref.contract.events",
    "kvref.validate": "kvref.contract.validate",
    "kvref.shape": "kvref.contract.shape",
    "kvref.policies": "kvref.contract.policies",
    "kvref.pausing": "kvref.contract.pausing",
    "kvref.hashing": "kvref.contract.hashing",
    "kvref.registry": "kvref.config.registry",
    "kvref.traces": "kvref.simulation.traces",
    "kvref.workloads": "kvref.simulation.workloads",
    "kvref.replay": "kvref.simulation.replay",
    "kvref.belady": "kvref.simulation.belady",
    "kvref.report": "kvref.reports.summary",
    "kvref.replay_report": "kvref.reports.replay",
    "kvref.bench_plots": "kvref.reports.bench_plots",
    "kvref.speclint": "kvref.cli.speclint",
    "kvref.oracle.pool": "kvref.oracle.blockpool.pool",
    "kvref.oracle.replaying": "kvref.oracle.blockpool.replaying",
    "kvref.oracle.invariants": "kvref.oracle.blockpool.invariants",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name of :data:`MOVED` and loads it as the module of its new name."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was loaded under its new name."""


_FINDER = _Alias()


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` once (``import kvref`` does it)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
