"""The Triton launcher of the fused kernels (kvref_torch.launching): one dispatch per specialisation.

Run on any machine: the kernel here is a stand-in that records how it was called, so the tests
check what :class:`Launcher` decides (dispatch through Triton, or call the compiled kernel's
launcher) and with which arguments, not Triton itself. The real kernels are checked compiled on a
GPU (``scripts/gpu_check.py``) and under the interpreter in CI (``nox -s kernels``).
"""

from __future__ import annotations

import types
from typing import Any

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from kvref_torch import launching  # noqa: E402

# A kernel compiled for one specialisation run with arguments of another breaks the oracle's results
# (CONF-910); the direct launch is how the fused calls avoid Triton's per-call dispatch (ERR-513).
pytestmark = pytest.mark.rule("CONF-910", "ERR-513")


class Compiled:
    """A compiled kernel: its launcher records every launch."""

    packed_metadata = "meta"

    def __init__(self) -> None:
        self.function = "fn"
        self.launches: list[tuple[Any, ...]] = []

    @property
    def run(self) -> Any:
        return lambda *args: self.launches.append(args)


class Kernel:
    """A JIT function: ``kernel[grid](...)`` dispatches, compiling once per distinct call here."""

    def __init__(self) -> None:
        self.arg_names = ["x_ptr", "n", "FLAG", "BLOCK"]
        self.dispatches: list[tuple[Any, ...]] = []
        self.compiled: list[Compiled] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def dispatch(*args: Any, **keywords: Any) -> Compiled:
            self.dispatches.append((grid, args, keywords))
            self.compiled.append(Compiled())
            return self.compiled[-1]

        return dispatch


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> tuple[launching.Launcher, Kernel]:
    """A launcher that calls compiled kernels directly (as on a GPU), over a stand-in driver."""
    fake = types.SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: 1234)
    monkeypatch.setattr(launching, "driver", types.SimpleNamespace(active=fake))
    kernel = Kernel()
    launcher = launching.Launcher(kernel)
    launcher.direct = True
    return launcher, kernel


def test_the_first_call_of_a_specialisation_dispatches_and_the_next_call_launches_directly(direct: Any) -> None:
    launcher, kernel = direct
    x = torch.zeros(8, dtype=torch.int64)
    launcher((1,), x, 5, FLAG=True, BLOCK=16, num_warps=4)
    launcher((2,), x, 7, FLAG=True, BLOCK=16, num_warps=4)
    assert len(kernel.dispatches) == 1, f"a second call of one specialisation dispatched again: {kernel.dispatches}"
    [launch] = kernel.compiled[0].launches
    assert launch == (2, 1, 1, 1234, "fn", "meta", None, None, None, x, 7, True, 16), (
        f"the direct launch got {launch}; Triton's own dispatch passes the grid as three numbers, the stream, "
        "the function, its metadata, no launch metadata or hooks, then every parameter in order"
    )


@pytest.mark.parametrize(
    "change",
    [
        "dtype",
        "misaligned",
        "wide int",
        "constexpr",
        "num_warps",
    ],
)
def test_a_call_of_another_specialisation_dispatches(direct: Any, change: str) -> None:
    launcher, kernel = direct
    x = torch.zeros(8, dtype=torch.int64)
    launcher((1,), x, 5, FLAG=True, BLOCK=16, num_warps=4)
    args: list[Any] = [x, 5]
    keywords: dict[str, Any] = {"FLAG": True, "BLOCK": 16, "num_warps": 4}
    if change == "dtype":
        args[0] = torch.zeros(8, dtype=torch.int32)
    elif change == "misaligned":
        args[0] = x[1:]  # 8 bytes past an aligned start: Triton specialises on 16-byte alignment
    elif change == "wide int":
        args[1] = 2**31  # an i64 where the first call had an i32
    elif change == "constexpr":
        keywords["BLOCK"] = 32
    else:
        keywords["num_warps"] = 8
    launcher((1,), *args, **keywords)
    assert len(kernel.dispatches) == 2, f"a call with another {change} reused the first call's compiled kernel"
    assert not kernel.compiled[0].launches, "the first call's kernel was launched for another specialisation"


@pytest.mark.parametrize(
    ("calls", "dispatches"),
    [([print], 3), ([], 1)],
    ids=["a profiler's hook: every call dispatches", "an empty HookChain is no hook"],
)
def test_launch_hooks_send_calls_through_tritons_dispatch_only_when_they_hold_a_hook(
    direct: Any, monkeypatch: pytest.MonkeyPatch, calls: list[Any], dispatches: int
) -> None:
    launcher, kernel = direct
    chain = types.SimpleNamespace(calls=calls)  # Triton 3.5+ keeps its launch hooks in a HookChain
    runtime = types.SimpleNamespace(launch_enter_hook=chain, launch_exit_hook=None)
    monkeypatch.setattr(triton, "knobs", types.SimpleNamespace(runtime=runtime), raising=False)
    x = torch.zeros(8, dtype=torch.int64)
    for _ in range(3):
        launcher((1,), x, 5, FLAG=True, BLOCK=16, num_warps=4)
    assert len(kernel.dispatches) == dispatches, (
        f"3 calls with hooks {calls} dispatched {len(kernel.dispatches)} times through Triton; expected "
        f"{dispatches} (a set hook must see every call; an empty chain must not slow calls down)"
    )


def test_under_the_interpreter_every_call_dispatches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = Kernel()
    launcher = launching.Launcher(kernel)
    x = torch.zeros(8, dtype=torch.int64)
    for _ in range(2):
        launcher((1,), x, 5, FLAG=True, BLOCK=16, num_warps=4)
    assert len(kernel.dispatches) == 2, "under TRITON_INTERPRET a call bypassed the interpreter"


def test_a_call_on_another_device_dispatches(direct: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    launcher, kernel = direct
    x = torch.zeros(8, dtype=torch.int64)
    launcher((1,), x, 5, FLAG=True, BLOCK=16, num_warps=4)
    fake = types.SimpleNamespace(get_current_device=lambda: 1, get_current_stream=lambda device: 99)
    monkeypatch.setattr(launching, "driver", types.SimpleNamespace(active=fake))
    launcher((1,), x, 5, FLAG=True, BLOCK=16, num_warps=4)
    assert len(kernel.dispatches) == 2, "a kernel compiled and loaded on device 0 was launched on device 1"


def test_a_bool_and_an_int_in_one_position_are_two_specialisations(direct: Any) -> None:
    launcher, kernel = direct
    x = torch.zeros(8, dtype=torch.int64)
    launcher((1,), x, 5, FLAG=True, BLOCK=16, num_warps=4)
    launcher((1,), x, True, FLAG=True, BLOCK=16, num_warps=4)
    assert len(kernel.dispatches) == 2, "a bool reused the kernel compiled for an i32 in its place"
