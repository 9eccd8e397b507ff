"""Backends by name: entry points of the group ``kvref.backends``, loaded lazily (CONF-901).

``load_backend("torch")`` imports only the torch backend's entry point; nothing else is imported
until asked for. A name that is not registered, or whose package cannot load here, raises
:class:`~kvref.contract.errors.BackendUnavailableError` with the reason and the command that fixes it
(CONF-902); nothing ever falls back to another backend. ``module:attribute`` names an
implementation that is not registered (a class is instantiated without arguments).
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from kvref.contract.errors import BackendUnavailableError, KVRefError
from kvref.contract.protocol import Backend

__all__ = [
    "GROUP",
    "INSTALL_HINTS",
    "BackendStatus",
    "backend_names",
    "backend_statuses",
    "create_pool",
    "load_backend",
]

GROUP = "kvref.backends"

#: How to get each backend kvref knows of, when it is missing.
INSTALL_HINTS: dict[str, str] = {
    "oracle": "pip install kvref",
    "torch": "pip install 'kvref[torch]' (CPU-only: pip install torch==2.13.0)",
    "cupy": "pip install 'kvref[cupy]' (runs on NumPy on a host without CUDA)",
}

# Used only when kvref runs from a source tree without installed metadata.
_BUILTIN = {"oracle": "kvref.oracle.backend:backend"}


def _entry_points() -> dict[str, EntryPoint]:
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    for name, value in _BUILTIN.items():
        found.setdefault(name, EntryPoint(name=name, value=value, group=GROUP))
    return found


def backend_names() -> list[str]:
    """Registered backend names, sorted, without importing any of them."""
    return sorted(_entry_points())


def _instantiate(obj: Any, name: str) -> Backend:
    if isinstance(obj, type):
        try:
            obj = obj()
        except TypeError as exc:
            raise BackendUnavailableError(
                "CONF-902", f"backend {name!r}: {obj.__name__} cannot be created without arguments ({exc})"
            ) from exc
        except Exception as exc:  # the backend's own constructor failed: say so, in its words
            raise BackendUnavailableError(
                "CONF-902", f"backend {name!r}: creating {obj.__name__} raised {type(exc).__name__}: {exc}"
            ) from exc
    if not isinstance(obj, Backend):
        raise BackendUnavailableError("CONF-901", f"backend {name!r} resolves to {obj!r}, which is not a kvref Backend")
    return obj


def _import_from_here(module_name: str) -> Any:
    """``module_name`` imported, looking in the current directory too, as pytest does for a test's
    own modules: ``kvref conformance --backend mypool:MyBackend`` from the directory of ``mypool.py``."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        if exc.name != module_name.partition(".")[0] or here in sys.path:
            raise
        sys.path.insert(0, here)
        return importlib.import_module(module_name)


def load_backend(name: str) -> Backend:
    """The backend called ``name`` (or at ``module:attribute``), imported now (CONF-901, CONF-902)."""
    if not isinstance(name, str) or not name:
        raise BackendUnavailableError("CONF-902", f"backend name must be a non-empty str, got {name!r}")
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            module = _import_from_here(module_name)
            obj = getattr(module, attr)
        except Exception as exc:  # any import-time failure means "cannot load"
            raise BackendUnavailableError(
                "CONF-902", f"backend {name!r} cannot be loaded: {type(exc).__name__}: {exc}"
            ) from exc
        return _instantiate(obj, name)
    points = _entry_points()
    point = points.get(name)
    if point is None:
        hint = INSTALL_HINTS.get(name)
        known = ", ".join(sorted(points)) or "none"
        fix = f"; to install it: {hint}" if hint else ""
        raise BackendUnavailableError("CONF-902", f"no backend named {name!r} is registered (registered: {known}){fix}")
    try:
        obj = point.load()
    except Exception as exc:  # any import-time failure means "cannot load"
        hint = INSTALL_HINTS.get(name, f"install the package that provides {point.value}")
        raise BackendUnavailableError(
            "CONF-902", f"backend {name!r} is registered but cannot be imported ({exc}); to fix: {hint}"
        ) from exc
    return _instantiate(obj, name)


@dataclass(frozen=True)
class BackendStatus:
    """One line of ``kvref backends`` (CONF-906)."""

    name: str
    usable: bool
    reason: str
    version: str
    device: str
    capabilities: frozenset[str]


def backend_statuses() -> list[BackendStatus]:
    """Load every registered backend and say whether it is usable here, and why not."""
    out = []
    for name in backend_names():
        try:
            backend = load_backend(name)
            reason = backend.availability()
            usable = reason is None
            out.append(
                BackendStatus(
                    name,
                    usable,
                    reason or "",
                    backend.version(),
                    backend.device() if usable else "-",
                    backend.capabilities() if usable else frozenset(),
                )
            )
        except KVRefError as exc:
            out.append(BackendStatus(name, False, str(exc), "-", "-", frozenset()))
    return out


def create_pool(num_blocks: int, **overrides: Any) -> Any:
    """A pool from the resolved settings (CONF-903): ``overrides`` win over every other source.

    Accepts ``backend``, ``device``, ``policy``, ``events`` and the pool's own keywords
    (``reserved_ids``, ``paused_limit``).
    """
    from kvref.config.settings import load_settings

    pool_kw = {k: overrides.pop(k) for k in ("reserved_ids", "paused_limit") if k in overrides}
    settings = load_settings(overrides)
    backend = load_backend(settings.backend)
    reason = backend.availability()
    if reason is not None:
        raise BackendUnavailableError("CONF-902", f"backend {settings.backend!r} is not usable here: {reason}")
    return backend.create(
        num_blocks,
        policy=settings.policy,
        device=settings.device,
        enable_events=settings.events,
        **pool_kw,
    )
