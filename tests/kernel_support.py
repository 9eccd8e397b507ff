"""What the fused-kernel tests share: the outcome of a call, and the launch counter kept off the interpreter.

Triton's interpreter moves tensors with torch operations that a compiled kernel does not make;
:func:`outside_the_counter` hides them from :class:`kvref_torch.counting.CountLaunches` on the CPU,
so the counts the tests assert are those of a GPU.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kvref.contract.errors import KVRefError


def outcome(call: Any) -> tuple[str, str, Any] | None:
    """What a call raised (class, rule, call index), or None."""
    try:
        call()
    except KVRefError as exc:
        return type(exc).__name__, exc.rule, getattr(exc, "call_index", None)
    return None


def outside_the_counter(device: str) -> Any:
    """A context in which the launch counter sees nothing (on the CPU, where the interpreter runs)."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes() if device == "cpu" else contextlib.nullcontext()
