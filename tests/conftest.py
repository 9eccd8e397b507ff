"""What the array-surface tests share: the array library each runs on, and a guard on the host path."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest
from kvref_arraypool.ops import ArrayOps, NumpyLikeOps


@pytest.fixture(params=["numpy", "torch"])
def ops(request: pytest.FixtureRequest) -> ArrayOps:
    """The array library under test: NumPy (CuPy's operations on the host) or torch on the CPU
    (skipped without torch); the same operations a device runs."""
    if request.param == "torch":
        pytest.importorskip("torch")
        from kvref_torch.ops import TorchOps

        return TorchOps("cpu")
    return NumpyLikeOps(np, device="host", is_device=False)


@pytest.fixture
def no_host_path(monkeypatch: pytest.MonkeyPatch) -> Callable[[ModuleType, str], None]:
    """``no_host_path(module, name)``: make ``module.name`` (the function that copies an argument to the
    host and checks it there) fail the test if called: a device array must be taken as it is (ERR-514)."""

    def forbid(module: ModuleType, name: str) -> None:
        def called(*args: object, **kwargs: object) -> object:
            raise AssertionError(f"[ERR-514] {module.__name__}.{name} read a device argument on the host: {args!r}")

        monkeypatch.setattr(module, name, called)

    return forbid
