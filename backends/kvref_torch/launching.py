"""Launch a Triton kernel through its compiled handle, without Triton's dispatch on every call.

A call of ``kernel[grid](...)`` binds the arguments, computes their specialisation and looks the
compiled kernel up before it launches: on an H100 with Triton 3.6 that costs several times the
launch itself, more than the whole alloc + free pair of SGLang's allocator. :class:`Launcher`
does that lookup once per specialisation and then calls the compiled kernel's launcher directly,
as Triton's own dispatch does at its end.

The key of a specialisation is what Triton specialises on, made coarse on purpose: the kernels
launched here name their integer arguments in ``do_not_specialize``, so an integer contributes
only whether it fits 32 bits (Triton then types it ``i32``, else ``i64``); a tensor contributes
its dtype and whether its address is a multiple of 16 (Triton's alignment specialisation);
constexprs and options (``num_warps``) contribute their values. A new key goes through Triton's
own dispatch, which compiles or finds the kernel, and the kernel it returns is kept for the key.

Under Triton's interpreter (``TRITON_INTERPRET=1``), or while Triton's launch hooks are set (a
profiler), every call goes through Triton's dispatch. ``KVREF_TRITON_DISPATCH=1`` forces that too,
to compare the two.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
from triton.runtime.driver import driver

__all__ = ["Launcher"]

_INT32_LOW, _INT32_HIGH = -(2**31), 2**31 - 1
_TENSOR = torch.Tensor


def _hook_set(hook: Any) -> bool:
    """Whether a launch hook of Triton's calls something: None, or (Triton 3.5 on) an empty ``HookChain``, does not."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _hooks_set() -> bool:
    """Whether Triton's launch hooks are set (a profiler): then its dispatch must run, as it calls them."""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    return _hook_set(getattr(runtime, "launch_enter_hook", None)) or _hook_set(
        getattr(runtime, "launch_exit_hook", None)
    )


def _key(args: tuple[Any, ...], keywords: dict[str, Any]) -> tuple[Any, ...]:
    """The key of a call's specialisation (see the module): per argument, in one comprehension (a hot path).

    A tensor: its dtype and whether its address is 16-aligned; an int (not a bool): whether it fits
    32 bits; anything else (a bool, a float, a NumPy int, a tensor subclass): its type and itself.
    Then the keywords, in order. The caller adds the device: Triton compiles and loads per device.
    """
    parts = [
        (a.dtype, a.data_ptr() & 15 == 0)
        if type(a) is _TENSOR
        else (("i32" if _INT32_LOW <= a <= _INT32_HIGH else "i64") if type(a) is int else (type(a), a))
        for a in args
    ]
    return (*parts, *keywords.items())


class Launcher:
    """``launcher(grid, *args, **constexprs_and_options)``: ``kernel[grid](*args, ...)``, dispatched once per key.

    ``args`` are the kernel's parameters in order up to its first constexpr; the constexprs (and
    ``num_warps``) come as keywords. A compiled kernel is reused only for arguments of the same key
    (see the module's docstring), so what runs is exactly what Triton's dispatch would run.
    """

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.names: list[str] = list(getattr(kernel, "arg_names", []))
        self.compiled: dict[tuple[Any, ...], Any] = {}
        interpreting = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        self.direct = not interpreting and os.environ.get("KVREF_TRITON_DISPATCH", "0") in ("", "0")

    def __call__(self, grid: tuple[int, ...], *args: Any, **keywords: Any) -> None:
        if not self.direct or _hooks_set():
            self.kernel[grid](*args, **keywords)
            return
        active = driver.active
        device = active.get_current_device()
        key = (device, *_key(args, keywords))
        compiled = self.compiled.get(key)
        if compiled is None:
            compiled = self.kernel[grid](*args, **keywords)
            if compiled is not None and hasattr(compiled, "packed_metadata"):
                self.compiled[key] = compiled
            return
        run = compiled.run  # loads the module on first use, which sets compiled.function
        stream = active.get_current_stream(device)
        grid_1 = grid[1] if len(grid) > 1 else 1
        grid_2 = grid[2] if len(grid) > 2 else 1
        constexprs = [keywords[name] for name in self.names[len(args) :]]
        run(
            grid[0],
            grid_1,
            grid_2,
            stream,
            compiled.function,
            compiled.packed_metadata,
            None,
            None,
            None,
            *args,
            *constexprs,
        )
