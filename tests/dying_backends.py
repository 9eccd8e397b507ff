"""Backends that fail the way a real one can, for the sweep's error reports: by ending their process
or running out of memory at capacities of 100 to 130 blocks (``module:Class`` names for the tests)."""

from __future__ import annotations

import os
from typing import Any

from kvref.oracle.backend import OracleBackend


class EndsItsProcess(OracleBackend):
    """The oracle, but a pool of 100 to 130 blocks ends the process with status 3 (a crash in native code)."""

    name = "ends-its-process"

    def create(self, num_blocks: int, *args: Any, **kwargs: Any) -> Any:
        if 100 <= num_blocks <= 130:
            os._exit(3)
        return super().create(num_blocks, *args, **kwargs)


class RunsOutOfMemory(OracleBackend):
    """The oracle, but a pool of 100 to 130 blocks raises a bare MemoryError."""

    name = "runs-out-of-memory"

    def create(self, num_blocks: int, *args: Any, **kwargs: Any) -> Any:
        if 100 <= num_blocks <= 130:
            raise MemoryError()
        return super().create(num_blocks, *args, **kwargs)


class CannotStart:
    """A backend class whose constructor raises, as one missing a licence or a device would."""

    def __init__(self) -> None:
        raise RuntimeError("this backend cannot start: no licence")
