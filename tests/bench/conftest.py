"""Benchmark set-up: every usable registered backend, and versions in the saved machine info."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import pytest

from kvref.registry import backend_statuses, load_backend


def usable_backends() -> list[str]:
    """Registered backends that can run here (the oracle at least)."""
    return [s.name for s in backend_statuses() if s.usable]


@pytest.fixture(params=usable_backends())
def backend(request: pytest.FixtureRequest) -> Any:
    """Each usable backend in turn; benchmarks of all of them land in one run and one JSON."""
    return load_backend(request.param)


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    packages = {}
    for name in ("kvref", "torch", "cupy-cuda12x", "numpy"):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            continue
    machine_info["kvref_packages"] = packages
    machine_info["kvref_backends"] = {s.name: s.device for s in backend_statuses() if s.usable}
    machine_info["kvref_platform"] = platform.platform()
