"""Benchmark set-up: every usable registered backend, the device option, versions in the machine info."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import pytest

from kvref.config.registry import backend_statuses, load_backend


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kvref-bench-device",
        default=None,
        help="device for the device backends (cuda:0 in `nox -s gpu`); the oracle stays on the host",
    )


def usable_backends() -> list[str]:
    """Registered backends that can run here (the oracle at least)."""
    return [s.name for s in backend_statuses() if s.usable]


@pytest.fixture(params=usable_backends())
def backend(request: pytest.FixtureRequest) -> Any:
    """Each usable backend in turn; benchmarks of all of them land in one run and one JSON."""
    return load_backend(request.param)


@pytest.fixture
def device(request: pytest.FixtureRequest, backend: Any) -> str | None:
    """The device asked for with --kvref-bench-device, for backends other than the oracle."""
    wanted: str | None = request.config.getoption("--kvref-bench-device")
    return None if backend.name == "oracle" else wanted


@pytest.fixture
def measuring(request: pytest.FixtureRequest) -> bool:
    """Whether this run measures (``--benchmark-enable``) rather than executing each benchmark once."""
    config = request.config
    return bool(config.getoption("benchmark_enable")) or not config.getoption("benchmark_disable")


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    packages = {}
    for name in ("kvref", "torch", "cupy-cuda12x", "numpy"):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            continue
    machine_info["kvref_packages"] = packages
    device = config.getoption("--kvref-bench-device")
    machine_info["kvref_backends"] = {
        s.name: (device if device and s.name != "oracle" else s.device) for s in backend_statuses() if s.usable
    }
    machine_info["kvref_platform"] = platform.platform()
