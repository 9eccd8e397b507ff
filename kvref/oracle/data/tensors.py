"""The tensor library under the data plane (spec chapter 08): NumPy for the reference, others in backends.

The data plane's classes (:mod:`.kv`, :mod:`.table`, :mod:`.states`, :mod:`.routing`) hold their
state in arrays of one library, reached through :class:`Tensors`: making zeroed arrays, moving
index arrays and values in, reading arrays back to the host. Indexing (``a[idx]`` to gather a
copy, ``a[idx] = values`` to scatter) and ``reshape`` are the same in NumPy, CuPy and torch, so
the classes use them directly. The checks of arguments (:func:`host_indices`) read them on the
host. NumPy is loaded by this room only, never by ``import kvref``.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from kvref.contract.errors import ConfigError, InvalidTypeError

__all__ = ["DeviceChecked", "DeviceSlotChecks", "NumpyTensors", "Tensors", "chosen_checks", "host_indices"]


class DeviceSlotChecks(Protocol):
    """The checks of slot indices a library makes on its device (DATA-815..DATA-817).

    Given the slots of a call as an array of the library (:meth:`take`), each method checks them
    with array operations, records the first refused call's error, and returns where the call
    reads or writes each entry: its slot, or slot 0 (padding) for every entry of a refused call.
    """

    def take(self, values: object) -> tuple[Any, tuple[int, ...]] | None:
        """The values flattened on the device and their shape, or None for the host path."""
        ...

    def writes(self, flat: Any, *, op: str, padding: int) -> Any:
        """Where ``set_kv`` writes each entry (DATA-804, DATA-807); padded entries to slot 0."""
        ...

    def reads(self, flat: Any, *, op: str, padding: int) -> Any:
        """Where ``get_kv`` reads each entry (DATA-802, DATA-804)."""
        ...

    def copies(self, src: Any, dst: Any, *, op: str, padding: int) -> tuple[Any, Any]:
        """Where ``copy_kv`` reads and writes each entry (DATA-802, DATA-804, DATA-809)."""
        ...

    def states(self, flat: Any, *, op: str) -> Any:
        """The slots ``reset_states`` zeroes (DATA-821, DATA-825); every entry slot 0 when refused."""
        ...

    def state_copies(self, src: Any, dst: Any, *, op: str) -> tuple[Any, Any]:
        """Where ``copy_states`` reads and writes each entry (DATA-821, DATA-823, DATA-825)."""
        ...

    def check(self) -> None:
        """Raise the first recorded error not yet raised, once (DATA-816)."""
        ...


class Tensors(Protocol):
    """A tensor library on one device, as the data plane uses it."""

    name: str
    device: str

    def zeros(self, shape: tuple[int, ...], dtype: str) -> Any:
        """A zeroed array of ``shape`` in ``dtype`` (a name: ``float16``, ``int32``, ...)."""
        ...

    def index(self, host: np.ndarray) -> Any:
        """An int64 index array on the device, from checked host indices."""
        ...

    def values(self, data: Any, dtype: str) -> Any:
        """``data`` (a NumPy array or an array of this library) as an array of this library in ``dtype``."""
        ...

    def to_host(self, a: Any) -> np.ndarray:
        """A NumPy copy of ``a`` (float types the host lacks come back as float32)."""
        ...

    def nbytes(self, a: Any) -> int:
        """The bytes ``a`` occupies."""
        ...

    def supports(self, dtype: str) -> bool:
        """Whether arrays of ``dtype`` can be made here (DATA-805)."""
        ...

    def device_checks(self, slots: int) -> DeviceSlotChecks | None:
        """Checks of indices into ``slots`` rows made on the device, or None where the library has none."""
        ...


_NUMPY_DTYPES = {"float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64"}


class NumpyTensors:
    """NumPy in host memory: the reference's tensors."""

    name = "numpy"
    device = "host"

    def zeros(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        """A zeroed NumPy array; ConfigError for a dtype NumPy lacks (DATA-805)."""
        if not self.supports(dtype):
            raise ConfigError("DATA-805", f"numpy cannot hold dtype {dtype!r}; it holds {sorted(_NUMPY_DTYPES)}")
        return np.zeros(shape, dtype=dtype)

    def index(self, host: np.ndarray) -> np.ndarray:
        """The host indices themselves, as int64."""
        return np.asarray(host, dtype=np.int64)

    def values(self, data: Any, dtype: str) -> np.ndarray:
        """``data`` as a NumPy array of ``dtype``."""
        return np.asarray(data).astype(dtype, copy=False)

    def to_host(self, a: Any) -> np.ndarray:
        """A copy of ``a``."""
        return np.array(a)

    def nbytes(self, a: Any) -> int:
        """``a.nbytes``."""
        return int(a.nbytes)

    def supports(self, dtype: str) -> bool:
        """NumPy's own dtypes: no bfloat16, no 8-bit floats."""
        return dtype in _NUMPY_DTYPES

    def device_checks(self, slots: int) -> None:
        """None: the reference checks every index on the host, at once."""
        return None


class DeviceChecked:
    """What a part of the data plane with device checks shows (DATA-815, DATA-816, DATA-825): the
    checks it was made with (``_checks``, from :func:`chosen_checks`) and ``check()``."""

    _checks: DeviceSlotChecks | None

    @property
    def device_checks(self) -> DeviceSlotChecks | None:
        """The checks made on the device, or None when every call is checked on the host."""
        return self._checks

    def check(self) -> None:
        """Raise the first error the device checks recorded since the last report, once (DATA-816)."""
        if self._checks is not None:
            self._checks.check()


def chosen_checks(
    tensors: Tensors, slots: int, checks: str | None, *, owner: str, rule: str
) -> DeviceSlotChecks | None:
    """The checks ``checks`` asks of ``owner`` over ``slots`` rows: ``"device"`` (the library's checks
    made on its device), ``"host"`` (None: every call checked at once), or None (device on CUDA);
    anything else, or device checks from a library without them, is ConfigError naming ``rule``."""
    if checks is None:
        checks = "device" if str(tensors.device).startswith("cuda") else "host"
    if checks not in ("host", "device"):
        raise ConfigError(rule, f"{owner}: checks must be 'host' or 'device', got {checks!r}")
    if checks == "host":
        return None
    made = tensors.device_checks(slots)
    if made is None:
        raise ConfigError(rule, f"{owner}: {tensors.name} checks slots on the host only")
    return made


def host_indices(values: object, *, op: str, arg: str = "indices") -> np.ndarray:
    """``values`` (ints, a list, a NumPy array or a device array) as a host int64 array of the same shape.

    Refuses what is not integer with InvalidTypeError (ERR-503). A device array is read back once.
    """
    if hasattr(values, "get") and not isinstance(values, dict):  # a CuPy array
        values = values.get()
    elif hasattr(values, "detach") and hasattr(values, "cpu"):  # a torch tensor
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        if array.size == 0:
            return array.astype(np.int64)
        raise InvalidTypeError("ERR-503", f"{op}: {arg} must be integers, got {array.dtype}")
    return array.astype(np.int64, copy=False)
