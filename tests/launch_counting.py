"""What one call costs a GPU, counted on any device: kernel launches and host synchronizations.

:class:`CountLaunches` is a torch dispatch mode: it sees every aten operation a call dispatches,
on ``cpu`` as on ``cuda``, so the counts measured on a CPU-only machine are those a GPU would see.

- **launches**: aten operations that run a kernel on CUDA (views, allocations and metadata do not);
- **syncs**: points where the host must wait for the device: a scalar read
  (``int(t)``, ``bool(t)``), an output whose size depends on the data (``nonzero``, a boolean
  mask, ``unique``), every array the array core copies to the host (``ArrayOps.host_reads``), and
  every tensor torch makes of a Python scalar (``lift_fresh``: ``a[idx] = 1`` makes one), which it
  copies in from pageable memory and waits for (CUPTI shows a ``cudaStreamSynchronize`` after each);
  the array core's own host arrays go in through pinned memory, queued (``ArrayOps.asarray``);
- **copies in**: host arrays (``ArrayOps.host_writes``) and Python scalars copied to the device.

:func:`measure` runs the scenarios of the launch budget (``tests/launch_budget.toml``): each
operation of the array core at several batch sizes. ``python -m tests.launch_counting`` prints
them; ``--write`` rewrites the budget file, on purpose (the test never does).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from kvref_arraypool.ops import ArrayOps
from torch.utils._python_dispatch import TorchDispatchMode

from tests.launch_scenarios import (
    ARRAY_SCENARIOS,
    BATCHES,
    BLOCK_SCENARIOS,
    CUDA_SCENARIOS,
    SCENARIOS,
    SLOT_SCENARIOS,
    TABLE_SCENARIOS,
)

__all__ = [
    "BUDGET_FILE",
    "SCENARIOS",
    "ARRAY_SCENARIOS",
    "BLOCK_SCENARIOS",
    "CUDA_SCENARIOS",
    "SLOT_SCENARIOS",
    "BATCHES",
    "CallCost",
    "CountLaunches",
    "load_budget",
    "measure",
    "write_budget",
]

#: The budget, shipped inside this package (so an installed kvref finds it too).
BUDGET_FILE = Path(__file__).with_name("launch_budget.toml")

#: aten operations after which the host waits for the device on CUDA: a scalar read, or an output
#: whose size depends on the data.
_SYNCING = frozenset(
    {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive"}
)
#: aten operations that launch no kernel: allocation and metadata only.
_NO_KERNEL = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "lift_fresh", "detach", "alias"})


@dataclass
class CallCost:
    """Launches, syncs and host-to-device copies of one measured call, and the launches by operation."""

    launches: int = 0
    syncs: int = 0
    copies_in: int = 0
    by_op: Counter[str] = field(default_factory=Counter)


def _boolean_index(args: tuple[Any, ...]) -> bool:
    """Whether an ``index`` / ``index_put`` call indexes with a boolean mask (a sync on CUDA)."""
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in indices or ())


def _host_scalar(name: str, kwargs: dict[str, Any] | None) -> bool:
    """A Python number wrapped as a host 0-d tensor (``torch.where(mask, 0, x)``): a kernel argument, no launch."""
    if name != "scalar_tensor":
        return False
    device = (kwargs or {}).get("device")
    return device is None or torch.device(device).type == "cpu"


class CountLaunches(TorchDispatchMode):  # type: ignore[misc]  # torch is not type-checked here
    """Count the kernel launches and host syncs of everything run inside ``with`` (see the module)."""

    def __init__(self, ops: ArrayOps) -> None:
        super().__init__()
        self.ops = ops
        self.cost = CallCost()
        self._reads = self._writes = self._lifts = 0

    def __enter__(self) -> CountLaunches:
        self._reads, self._writes = self.ops.host_reads, self.ops.host_writes
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        writes = self.ops.host_writes - self._writes
        # Each asarray lifts its host array once (a pinned copy, queued); every other lift is a
        # Python scalar (``a[idx] = x``), copied from pageable memory: the host waits for it.
        scalars = max(0, self._lifts - writes)
        self.cost.syncs += self.ops.host_reads - self._reads + scalars
        self.cost.copies_in += writes + scalars

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        name = func.overloadpacket.__name__
        if name in _SYNCING or (name in ("index", "index_put", "index_put_") and _boolean_index(args)):
            self.cost.syncs += 1
        if name == "lift_fresh":  # a tensor made of host data: ``ArrayOps.asarray``'s, or a Python scalar's
            self._lifts += 1
        if not func.is_view and name not in _NO_KERNEL and not _host_scalar(name, kwargs):
            self.cost.launches += 1
            self.cost.by_op[name] += 1
        return func(*args, **(kwargs or {}))


def measure(device: str = "cpu", batches: tuple[int, ...] = BATCHES) -> dict[str, dict[int, CallCost]]:
    """The cost of one call of every scenario at every batch size, each on a fresh lru pool.

    Every target runs torch's own operations, as on CUDA; the array surfaces' CUDA C kernels are
    counted with a stand-in for the driver (their launches counted, not made).
    """
    from kvref_arraypool.block_arrays import DeviceBlockPool
    from kvref_arraypool.block_tables import DeviceBlockTables
    from kvref_arraypool.pool import ArrayBlockPool
    from kvref_arraypool.slot_arrays import DeviceSlotAllocator
    from kvref_arraypool.slots import ArraySlotAllocator

    from kvref_torch.backend import backend
    from kvref_torch.ops import TorchOps

    where = backend.device(device)
    out: dict[str, dict[int, CallCost]] = {}
    for op, scenario in {**SCENARIOS, **SLOT_SCENARIOS, **ARRAY_SCENARIOS, **CUDA_SCENARIOS}.items():
        for n in batches:
            size = 6 * n + 64 if op == "admission" else 2 * n + 16
            kernels: Any = None
            if op in CUDA_SCENARIOS:  # the CUDA kernels, their launches counted, not made
                from kvref_cuda import CudaBlockKernels, CudaSlotKernels
                from kvref_cuda.kernels import torch_arrays

                arrays = torch_arrays(0, tensors=where)
                slot_surface = op.startswith("cuda_slot")
                kind = CudaSlotKernels if slot_surface else CudaBlockKernels
                kernels = kind(arrays, launch=lambda *launch: None)
                surface = DeviceSlotAllocator if slot_surface else DeviceBlockPool
                target: Any = surface(size, ops=TorchOps(where), kernels=kernels)
            elif op in TABLE_SCENARIOS:
                pool = DeviceBlockPool(2 * n + 16, ops=TorchOps(where))
                target = DeviceBlockTables(pool, block_size=1, max_blocks=64)
            elif op in BLOCK_SCENARIOS:  # the array path, as KVREF_CUDA_KERNELS=0 runs it on CUDA
                target = DeviceBlockPool(size, ops=TorchOps(where))
            elif op in ARRAY_SCENARIOS:  # the array path, as KVREF_CUDA_KERNELS=0 runs it on CUDA
                target = DeviceSlotAllocator(size, ops=TorchOps(where))
            elif op in SLOT_SCENARIOS:
                target = ArraySlotAllocator(size, ops=TorchOps(where))
            else:  # the list-protocol pool
                target = ArrayBlockPool(size, ops=TorchOps(where), policy="lru")
            call = scenario(target, n)
            made = kernels.launches if kernels is not None else 0
            with CountLaunches(target.ops) as counter:
                call()
            if kernels is not None and kernels.launches > made:
                counter.cost.launches += kernels.launches - made
                counter.cost.by_op["kvref_cuda kernel"] += kernels.launches - made
            out.setdefault(op, {})[n] = counter.cost
    return out


def load_budget(path: Path = BUDGET_FILE) -> dict[str, dict[int, dict[str, int]]]:
    """The budget file as ``{operation: {batch: {"launches": L, "syncs": S}}}``."""
    import tomllib

    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    return {op: {int(n): dict(v) for n, v in per.items()} for op, per in raw.items()}


def write_budget(costs: dict[str, dict[int, CallCost]], path: Path = BUDGET_FILE) -> None:
    """Write ``costs`` as the new budget (on purpose, after a change that lowers or must raise them)."""
    lines = [
        "# Kernel launches and host syncs allowed per call of the array core on torch, counted on any",
        "# device by tests.launch_counting (the counts a CUDA run makes). tests/test_launch_budget.py",
        "# fails when a call costs more. Rewrite on purpose: python -m tests.launch_counting --write",
    ]
    for op, per in costs.items():
        for n, cost in per.items():
            lines += ["", f'[{op}."{n}"]', f"launches = {cost.launches}", f"syncs = {cost.syncs}"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Print the counts (and, with ``--write``, make them the budget)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", default="cpu", help="torch device (the counts do not depend on it)")
    parser.add_argument("--write", action="store_true", help=f"rewrite {BUDGET_FILE.name} with these counts")
    parser.add_argument("--json", help="also write the counts here as JSON (nox -s bench does)")
    args = parser.parse_args(argv)
    costs = measure(args.device)
    if args.json:
        import json

        table = {
            op: {str(n): {"launches": c.launches, "syncs": c.syncs, "copies_in": c.copies_in} for n, c in per.items()}
            for op, per in costs.items()
        }
        Path(args.json).write_text(
            json.dumps({"device": args.device, "costs": table}, indent=1) + "\n", encoding="utf-8"
        )
    width = max(len("operation"), *(len(op) for op in costs))
    print(f"{'operation':<{width}} {'batch':>6} {'launches':>9} {'syncs':>6} {'copies in':>9}  most launched")
    for op, per in costs.items():
        for n, cost in per.items():
            top = ", ".join(f"{name} {k}" for name, k in cost.by_op.most_common(3))
            print(f"{op:<{width}} {n:>6} {cost.launches:>9} {cost.syncs:>6} {cost.copies_in:>9}  {top}")
    if args.write:
        write_budget(costs)
        print(f"wrote {BUDGET_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
