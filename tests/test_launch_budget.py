"""The launch/sync budget: no call of the array core on torch costs more kernel launches or host
syncs than ``tests/launch_budget.toml`` allows (CONF-911; the GPU issue's counts).

The counts come from :mod:`tests.launch_counting`, a torch dispatch mode that sees every aten
operation on the CPU as on CUDA, so this runs in CI without a GPU. The budget is rewritten on
purpose (``python -m tests.launch_counting --write``), never by this test.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kvref_torch.ops import TorchOps  # noqa: E402
from tests.launch_counting import (  # noqa: E402
    ARRAY_SCENARIOS,
    BATCHES,
    CUDA_SCENARIOS,
    SCENARIOS,
    SLOT_SCENARIOS,
    CountLaunches,
    load_budget,
    measure,
)

BUDGET = load_budget()
COSTS = measure("cpu")


def test_the_budget_names_every_scenario_at_every_batch_size() -> None:
    missing = [
        (op, n)
        for op in [*SCENARIOS, *SLOT_SCENARIOS, *ARRAY_SCENARIOS, *CUDA_SCENARIOS]
        for n in BATCHES
        if n not in BUDGET.get(op, {})
    ]
    assert not missing, f"launch_budget.toml has no budget for {missing}; rewrite it with --write"


@pytest.mark.rule("CONF-911")
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("op", [*SCENARIOS, *SLOT_SCENARIOS, *ARRAY_SCENARIOS, *CUDA_SCENARIOS])
def test_a_call_stays_within_its_launch_and_sync_budget(op: str, batch: int) -> None:
    cost, allowed = COSTS[op][batch], BUDGET[op][batch]
    top = ", ".join(f"{name} x{k}" for name, k in cost.by_op.most_common(5))
    assert cost.launches <= allowed["launches"] and cost.syncs <= allowed["syncs"], (
        f"{op} at batch {batch}: {cost.launches} kernel launches and {cost.syncs} host syncs, the budget allows "
        f"{allowed['launches']} and {allowed['syncs']} (most launched: {top}); make the call cheaper, or raise "
        "the budget on purpose with `python -m tests.launch_counting --write`"
    )


@pytest.mark.rule("ERR-513")
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("op", [*ARRAY_SCENARIOS, *CUDA_SCENARIOS])
def test_the_array_surface_never_waits_for_the_device_on_the_success_path(op: str, batch: int) -> None:
    cost = COSTS[op][batch]
    assert cost.syncs == 0, (
        f"{op} at batch {batch} waited for the device {cost.syncs} time(s); an array-surface alloc within the "
        "host's free count and every free must not (ERR-513)"
    )


def test_the_counter_sees_launches_and_the_syncs_a_gpu_would_make() -> None:
    ops = TorchOps("cpu")
    a = ops.arange(10)
    with CountLaunches(ops) as counter:
        picked = a[a > 3]  # a comparison, then a boolean mask: its output size waits for the device
        _ = int(picked[0])  # a scalar read
        ops.tolist(picked)  # a copy to the host
    cost = counter.cost
    assert cost.launches >= 2, f"a comparison and a masked index counted as {cost.launches} launches"
    assert cost.syncs == 3, f"a boolean mask, a scalar read and a host copy counted as {cost.syncs} syncs, not 3"
    assert cost.by_op["gt"] == 1, f"launches by operation: {dict(cost.by_op)}"


@pytest.mark.rule("DATA-815")
@pytest.mark.parametrize("batch", BATCHES)
def test_kv_calls_with_device_slots_never_wait_for_the_device(batch: int) -> None:
    from kvref_torch.backend import backend

    kv = backend.data_plane("cpu").kv_buffers(2 * batch + 8, 2, 2, 8, dtype="float16", checks="device")
    slots = torch.arange(1, batch + 1)
    k, v = torch.ones(batch, 2, 8), torch.ones(batch, 2, 8)
    calls: dict[str, Any] = {
        "set_kv": lambda: kv.set_kv(1, slots, k, v),
        "get_kv": lambda: kv.get_kv(1, slots),
        "copy_kv": lambda: kv.copy_kv(slots, slots + batch),
    }
    for name, call in calls.items():
        checks: Any = kv.device_checks
        with CountLaunches(checks.ops) as counter:
            call()
        assert counter.cost.syncs == 0, (
            f"{name} of {batch} device slots waited for the device {counter.cost.syncs} time(s) "
            f"({dict(counter.cost.by_op)}); checked on the device it must not (DATA-815)"
        )
    kv.check()
