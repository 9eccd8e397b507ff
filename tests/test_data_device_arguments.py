"""The request-to-token table takes a device array of slots as it is: no read back, no host sync (DATA-813).

SGLang's and pymllm's schedulers write a step's slots into ``req_to_token`` every step, from the
device array the allocator handed out. kvref's table writes such an array on its device and learns
its length from its shape; only other arguments (lists, another library's arrays) are read on the
host, where they are checked (ERR-503). Run on CuPy's NumPy host path and on torch's CPU tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvref.contract.errors import BlockIdError, InvalidTypeError, InvalidValueError
from kvref.oracle.data import ReqToTokenTable
from kvref.oracle.data import table as table_module

rule = pytest.mark.rule


def library(name: str) -> tuple[Any, Any]:
    """The data plane's tensors of ``name`` and a function making an int32 array of that library."""
    if name == "torch":
        torch = pytest.importorskip("torch")
        from kvref_torch.tensors import TorchTensors

        return TorchTensors("cpu"), lambda v: torch.tensor(v, dtype=torch.int32)
    from kvref_arraypool.tensors import LibraryTensors

    return LibraryTensors(np, name="numpy", device="host"), lambda v: np.array(v, dtype=np.int32)


@rule("DATA-813", "DATA-815")
@pytest.mark.parametrize("name", ["numpy", "torch"])
def test_a_device_array_of_slots_is_written_without_being_read_back(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tensors, array = library(name)
    table = ReqToTokenTable(4, 8, tensors=tensors)
    (row,) = table.alloc(1) or [0]

    def no_host_read(*args: object, **kwargs: object) -> object:
        raise AssertionError(f"[DATA-813] write read its slots back on the host: {args!r}")

    monkeypatch.setattr(table_module, "host_indices", no_host_read)
    table.write(row, 2, array([7, 8, 9]))
    table.write(row, 5, array([[10], [11]]))  # any shape: its entries in order
    table.write(row, 0, array([]))
    got = [int(x) for x in tensors.to_host(table.read(row, 0, 8))]
    assert got == [0, 0, 7, 8, 9, 10, 11, 0], f"[DATA-813] the row after three device writes: {got}"
    with pytest.raises(InvalidValueError, match=r"\[DATA-813\] write: positions from 7, 2 of them"):
        table.write(row, 7, array([1, 2]))  # past the row: refused from the shape alone
    monkeypatch.undo()
    with pytest.raises(InvalidTypeError, match=r"\[ERR-503\]"):
        table.write(row, 0, np.array([1.5]))  # not integers: the host path refuses them
    assert [int(x) for x in tensors.to_host(table.read(row, 0, 8))] == got, "a refused write changed the row"


@rule("DATA-825")
@pytest.mark.parametrize("name", ["numpy", "torch"])
def test_the_state_pool_resets_and_copies_device_slots_without_reading_them_back(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvref.oracle.data import states as states_module
    from kvref.oracle.data.states import StatePool

    tensors, array = library(name)
    pool = StatePool(3, 1, 1, 2, 2, 2, 2, dtype="float32", checks="device", tensors=tensors)
    for slot in (1, 2, 3):
        pool.write_states(slot, np.full((1, 1, 1, 2, 2), slot, np.float32), np.full((1, 1, 2, 1), slot, np.float32))

    def no_host_read(*args: object, **kwargs: object) -> object:
        raise AssertionError(f"[DATA-825] the state pool read its slots back on the host: {args!r}")

    monkeypatch.setattr(states_module, "host_indices", no_host_read)
    pool.copy_states(array([1]), array([3]))
    pool.reset_states(array([2]))
    pool.reset_states(array([[9]]))  # out of range: refused on the device, reported by check()
    monkeypatch.undo()
    got = [float(tensors.to_host(pool.recurrent_state)[0, s].max()) for s in (1, 2, 3)]
    assert got == [1.0, 0.0, 1.0], f"[DATA-825] slot 3 copied from 1, slot 2 zeroed: {got}"
    with pytest.raises(BlockIdError, match=r"\[DATA-821\] reset_states \(call 2\): entry 0 \(value 9\)"):
        pool.check()
