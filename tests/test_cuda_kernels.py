"""The CUDA C kernels of ``kvref_cuda`` do exactly what the array paths do, in one launch a call.

The machines of ``tests/kernel_support.py`` drive two allocators side by side, one with
:class:`~kvref_cuda.kernels.CudaSlotKernels` (or :class:`~kvref_cuda.kernels.CudaBlockKernels`)
and one without, and compare the state both keep and the error each check raises after every
step: on a CUDA device on CuPy arrays and on torch tensors, and anywhere a C++20 compiler is found
on NumPy arrays with the kernels' CUDA C run as threads on the CPU (``tests/cuda_emulation.py``),
the very launches ``kvref_cuda`` packs. What else runs without CUDA checks how a backend falls
back to the array path. Every surface also reads ids given as a strided view by value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from tests.kernel_support import BlocksFusedBesideArrays, SlotsFusedBesideArrays, outcome

rule = pytest.mark.rule


def cuda_library(library: str) -> dict[str, Any]:
    """What the machines need for ``library``'s arrays on ``cuda:0``, or for ``"emulated"`` (NumPy arrays,
    the kernels run as threads on the CPU: ``tests/cuda_emulation.py``); a skip where they cannot run."""
    if library == "emulated":
        from kvref_arraypool.ops import NumpyLikeOps

        from tests.cuda_emulation import emulated

        emulated("slot")  # skips here where no compiler builds the emulation
        as_array: Any = lambda named, dtype="int32": np.array(named, dtype=dtype)  # noqa: E731
        return {
            "ops": staticmethod(lambda: NumpyLikeOps(np, device="host", is_device=False)),
            "slot_kernels": staticmethod(lambda: emulated("slot")),
            "block_kernels": staticmethod(lambda: emulated("block")),
            "as_input": staticmethod(as_array),
            "as_ids": staticmethod(as_array),
            "as_slots": staticmethod(lambda n, slot: as_array([slot] * n, "int64")),
        }
    cupy = pytest.importorskip("cupy")
    if not cupy.cuda.is_available():
        pytest.skip("the CUDA kernels need a CUDA device (CuPy sees none here)")
    from kvref_cuda.kernels import CudaBlockKernels, CudaSlotKernels, cupy_arrays, torch_arrays

    if library == "cupy":
        from kvref_arraypool.ops import NumpyLikeOps

        arrays = cupy_arrays(0)
        ops: Any = lambda: NumpyLikeOps(cupy, device="cuda:0", is_device=True)  # noqa: E731
        as_ints: Any = lambda named, dtype="int32": cupy.asarray(np.array(named, dtype=dtype))  # noqa: E731
    else:
        torch = pytest.importorskip("torch")
        from kvref_torch.ops import TorchOps

        arrays = torch_arrays(0)
        ops = lambda: TorchOps("cuda:0")  # noqa: E731
        as_ints = lambda named, dtype="int32": torch.tensor(named, dtype=getattr(torch, dtype), device="cuda:0")  # noqa: E731
    return {
        "ops": staticmethod(ops),
        "slot_kernels": staticmethod(lambda: CudaSlotKernels(arrays)),
        "block_kernels": staticmethod(lambda: CudaBlockKernels(arrays)),
        "as_input": staticmethod(as_ints),
        "as_ids": staticmethod(as_ints),
        "as_slots": staticmethod(lambda n, slot: as_ints([slot] * n, "int64")),
    }


LIBRARIES = pytest.mark.parametrize("library", ["cupy", "torch", "emulated"])


@rule("ERR-511", "ERR-512", "ERR-513", "RADIX-606", "RADIX-607", "RADIX-610")
@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("page", [1, 4])
@LIBRARIES
def test_the_cuda_slot_kernels_agree_with_the_array_path(library: str, page: int, sort: bool) -> None:
    setup = cuda_library(library)
    attrs = {"page": page, "sort": sort, "kernels": setup["slot_kernels"], **setup}
    machine = type("CudaSlots", (SlotsFusedBesideArrays,), attrs)
    run_state_machine_as_test(machine, settings=settings(max_examples=30, stateful_step_count=30, deadline=None))


@rule("ERR-511", "ERR-512", "ERR-513", "ERR-518", "ERR-519", "ERR-520")
@LIBRARIES
def test_the_cuda_block_kernels_agree_with_the_array_path(library: str) -> None:
    setup = cuda_library(library)
    machine = type("CudaBlocks", (BlocksFusedBesideArrays,), {**setup, "kernels": setup["block_kernels"]})
    run_state_machine_as_test(machine, settings=settings(max_examples=40, stateful_step_count=30, deadline=None))


@rule("ERR-510", "RADIX-606")
@pytest.mark.parametrize("n", [1, 4096, 4097])
@LIBRARIES
def test_an_alloc_and_free_of_n_slots_take_one_launch_each_and_match_the_array_path(library: str, n: int) -> None:
    from kvref_arraypool.slot_arrays import DeviceSlotAllocator

    setup = cuda_library(library)
    kernels = setup["slot_kernels"]()
    fused = DeviceSlotAllocator(8192, ops=setup["ops"](), kernels=kernels)
    plain = DeviceSlotAllocator(8192, ops=setup["ops"]())
    a, b = fused.alloc(n), plain.alloc(n)
    assert a is not None and b is not None and a.tolist() == b.tolist(), (
        f"{library}: alloc({n}) handed out different slots with the CUDA kernels than the array path"
    )
    fused.free(a)
    plain.free(b)
    fused.check()
    assert fused.snapshot() == plain.snapshot(), f"{library}: after a free of {n} the kernels' state differs"
    launches = 2 if n <= 4096 else 1  # a free beyond one block's call takes the array path
    assert kernels.launches == launches, (
        f"{library}: alloc({n}) + free made {kernels.launches} CUDA kernel launches; expected {launches}"
    )


@rule("RADIX-616", "ERR-513")
@pytest.mark.parametrize("n", [1, 4096])
@LIBRARIES
def test_a_step_of_n_slots_is_one_launch_and_matches_free_then_alloc(library: str, n: int) -> None:
    from kvref_arraypool.slot_arrays import DeviceSlotAllocator

    setup = cuda_library(library)
    kernels = setup["slot_kernels"]()
    fused = DeviceSlotAllocator(3 * n, ops=setup["ops"](), kernels=kernels, sort=False)
    plain = DeviceSlotAllocator(3 * n, ops=setup["ops"](), sort=False)
    a, b = fused.alloc(n), plain.alloc(n)
    assert a is not None and b is not None
    before = kernels.launches
    got = fused.free_then_alloc(a, n)
    plain.free(b)
    want = plain.alloc(n)
    assert got is not None and want is not None and got.tolist() == want.tolist(), (
        f"{library}: free_then_alloc of {n} slots handed out other slots than free then alloc on the array path"
    )
    assert kernels.launches - before == 1, (
        f"{library}: free_then_alloc of {n} slots made {kernels.launches - before} launches; the fused step makes 1"
    )
    fused.check()
    assert fused.snapshot() == plain.snapshot(), f"{library}: after a step of {n} slots the kernels' state differs"


@rule("RADIX-606", "ERR-511")
@LIBRARIES
def test_a_free_of_a_strided_view_releases_the_slots_it_shows(library: str) -> None:
    from kvref_arraypool.slot_arrays import DeviceSlotAllocator

    setup = cuda_library(library)
    fused = DeviceSlotAllocator(64, ops=setup["ops"](), kernels=setup["slot_kernels"]())
    got = fused.alloc(8)
    assert got is not None
    fused.free(got[::2])
    fused.check()
    freed = [bool(fused.is_allocated(s)) for s in got.tolist()]
    assert freed == [False, True] * 4, (
        f"{library}: free(slots[::2]) left allocated flags {freed}; it must free every other slot it shows"
    )


@rule("CONF-901")
def test_without_cuda_the_backends_build_no_cuda_kernels() -> None:
    from kvref_cuda import cuda_kernels

    cupy = pytest.importorskip("cupy")
    if cupy.cuda.is_available():
        pytest.skip("CUDA is here: the kernels load")
    for library in ("cupy", "torch"):
        got = cuda_kernels("slot", library, "cuda:0")
        assert got is None, f"cuda_kernels('slot', {library!r}) gave {got!r} with no CUDA device; expected None"


@rule("CONF-901")
def test_kvref_cuda_kernels_0_asks_for_the_array_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvref_cuda import cuda_kernels

    monkeypatch.setenv("KVREF_CUDA_KERNELS", "0")
    got = cuda_kernels("block", "cupy", "cuda:0")
    assert got is None, f"KVREF_CUDA_KERNELS=0 still gave kernels {got!r}; the array path was asked for"


@rule("ERR-513")
def test_every_cuda_kernel_takes_the_parameters_its_launcher_packs() -> None:
    import re

    from kvref_cuda.source import KERNELS, PARAMETERS, SOURCE

    macro = SOURCE[SOURCE.index("#define KVREF_ENTRIES") :]
    for name, count in PARAMETERS.items():
        signature = re.search(rf"void (?:KVREF_ONE_BLOCK )?{name}_##SUFFIX\(([^)]*)\)", macro)
        assert signature is not None, f"no entry point {name}_##SUFFIX in kvref_cuda.source.SOURCE"
        params = [p.strip().rstrip("\\").strip() for p in signature.group(1).replace("\\\n", " ").split(",")]
        assert len(params) == count, f"{name} takes {len(params)} parameters; the launcher packs {count}"
        wide = [p for p in params if not (p.split()[-1].startswith("*") or "*" in p or p.startswith("i64 "))]
        assert not wide, f"{name}: parameters {wide} are not 8 bytes; the launcher passes one 8-byte slot each"
    assert set(KERNELS.values()) == set(PARAMETERS), f"kernels {sorted(KERNELS)} are not forms of {sorted(PARAMETERS)}"
    for name in KERNELS:
        assert f"void {name}(" in SOURCE or re.search(
            rf"KVREF_\w+\({name.removeprefix(KERNELS[name] + '_')}\b", macro
        ), f"kernel {name} is named by kvref_cuda.source.KERNELS but no entry macro defines it"


def same(got: Any, want: Any) -> bool:
    """Whether two allocations' results agree: both None, or the same ids."""
    if got is None or want is None:
        return got is None and want is None
    return bool(got.tolist() == want.tolist())


@rule("ERR-511", "ERR-512", "RADIX-606", "RADIX-607", "RADIX-610", "RADIX-616")
@pytest.mark.parametrize(("page", "sort"), [(1, False), (4, True)])
@LIBRARIES
def test_calls_of_thousands_of_slots_agree_with_the_array_path(library: str, page: int, sort: bool) -> None:
    """Calls of 1,000-4,096 entries: each thread a run of several, the scan across warps, duplicate
    pages, an offending entry near the end, a group, the ring wrapping (sort off)."""
    from kvref_arraypool.slot_arrays import DeviceSlotAllocator

    setup = cuda_library(library)
    make = setup["ops"]
    fused = DeviceSlotAllocator(6000 * page, ops=make(), page_size=page, sort=sort, kernels=setup["slot_kernels"]())
    plain = DeviceSlotAllocator(6000 * page, ops=make(), page_size=page, sort=sort)
    rng = np.random.default_rng(616)
    held: list[list[int]] = []
    for call in range(14):
        kind = ["alloc", "alloc", "free", "bad", "step", "group"][call % 6] if held else "alloc"
        n = int(rng.integers(250, 1024)) * page
        if kind == "alloc":
            got, want = fused.alloc(n), plain.alloc(n)
            assert same(got, want), (
                f"{library}: call {call}, alloc({n}) differs between the CUDA kernels and the array path"
            )
            if got is not None:
                held.append(got.tolist())
            continue
        named = held.pop(int(rng.integers(len(held))))
        if kind == "bad":
            named = [*named, named[0], -1] if len(named) < 4000 else [*named[:-2], named[0], -1]
        if kind == "step":
            got = fused.free_then_alloc(setup["as_input"](named), n)
            plain.free(setup["as_input"](named))
            want = plain.alloc(n)
            assert same(got, want), (
                f"{library}: call {call}, free_then_alloc of {len(named)} slots and {n} differs from free then alloc"
            )
            if got is not None:
                held.append(got.tolist())
        else:
            for a in (fused, plain):
                if kind == "group":
                    a.free_group_begin()
                a.free(setup["as_input"](named))
                if kind == "group":
                    a.free(setup["as_input"](named[: len(named) // 2]))  # again in the group: refused
                    a.free_group_end()
        errors = outcome(fused.check), outcome(plain.check)
        assert errors[0] == errors[1], (
            f"{library}: call {call} ({kind}): check() raised {errors[0]}, expected {errors[1]}"
        )
        assert fused.snapshot() == plain.snapshot(), f"{library}: after call {call} ({kind}) the kernels' state differs"
    launches = getattr(fused.kernels, "launches", 0)
    assert launches >= 10, f"{library}: the calls made {launches} CUDA kernel launches; they did not reach the kernels"


def message(call: Any) -> str | None:
    """The words of the error a call raised (the offending entry's position and value among them), or None."""
    try:
        call()
    except Exception as exc:
        return str(exc)
    return None


@rule("ERR-511", "ERR-512")
@pytest.mark.parametrize("m", [1025, 4096])
@LIBRARIES
def test_a_call_whose_every_entry_offends_names_its_first_entry(library: str, m: int) -> None:
    """Each thread holds a run of several entries here, every one offending: the record must name
    the call's first entry (position 0, its value), as the array path does, for slots and blocks."""
    from kvref_arraypool.block_arrays import DeviceBlockPool
    from kvref_arraypool.slot_arrays import DeviceSlotAllocator

    setup = cuda_library(library)
    fused_slots = DeviceSlotAllocator(8192, ops=setup["ops"](), kernels=setup["slot_kernels"]())
    plain_slots = DeviceSlotAllocator(8192, ops=setup["ops"]())
    fused_blocks = DeviceBlockPool(8192, ops=setup["ops"](), max_requests=4, kernels=setup["block_kernels"]())
    plain_blocks = DeviceBlockPool(8192, ops=setup["ops"](), max_requests=4)
    offending = [-(i + 1) for i in range(m)]
    for slots in (fused_slots, plain_slots):
        slots.free(setup["as_input"](offending))
    for blocks in (fused_blocks, plain_blocks):
        blocks.free(setup["as_ids"](offending), 1)
    for fused, plain in ((fused_slots.check, plain_slots.check), (fused_blocks.check, plain_blocks.check)):
        got, want = message(fused), message(plain)
        assert want is not None and "-1" in want, f"the array path's error names no first entry: {want}"
        assert got == want, f"{library}: a free of {m} offending entries raised {got!r}, expected {want!r}"


@rule("ERR-511", "ERR-512", "ERR-518", "ERR-519")
@LIBRARIES
def test_block_calls_of_thousands_of_entries_agree_with_the_array_path(library: str) -> None:
    from kvref_arraypool.block_arrays import DeviceBlockPool

    setup = cuda_library(library)
    fused = DeviceBlockPool(9000, ops=setup["ops"](), max_requests=64, kernels=setup["block_kernels"]())
    plain = DeviceBlockPool(9000, ops=setup["ops"](), max_requests=64)
    got, want = fused.allocate([4000], [5])[0], plain.allocate([4000], [5])[0]
    assert got.tolist() == want.tolist(), f"{library}: allocate([4000], [5]) differs from the array path"
    ids = got.tolist()
    calls = [
        ("acquire", ids[:3000], 6),
        ("free", [*ids[:2000], ids[10]], 5),  # a pair named twice, at the end: refused
        ("acquire", [*ids[2000:2100], 9000], 7),  # out of range at the end: refused
        ("free", ids[:2000], 5),
        ("free", ids[:3000], 6),  # blocks 0..1999 reach zero and go back to the stack
    ]
    for op, named, slot in calls:
        for pool in (fused, plain):
            getattr(pool, op)(setup["as_ids"](named), slot)
        errors = outcome(fused.check), outcome(plain.check)
        assert errors[0] == errors[1], (
            f"{library}: {op} of {len(named)} by {slot}: check() raised {errors[0]}, expected {errors[1]}"
        )
        assert fused.snapshot() == plain.snapshot(), (
            f"{library}: after {op} of {len(named)} by {slot} the state differs"
        )
