"""kvref's CUDA C kernels: the array surfaces' fused calls in one launch each, launched through CuPy.

:func:`cuda_kernels` gives a CUDA build of a backend (``cupy``, or ``torch`` where CuPy is
installed) the slot or block kernels for its arrays on ``cuda:N``, or None where they cannot run
there (the array path then does the same work in many launches). ``KVREF_CUDA_KERNELS=0`` asks for
the array path, to compare the two (``0``, ``false``, ``no`` or ``off``).
"""

from __future__ import annotations

import os
import warnings
from typing import Literal

from kvref_cuda.kernels import CudaBlockKernels, CudaSlotKernels, cupy_arrays, torch_arrays

__all__ = ["CudaBlockKernels", "CudaSlotKernels", "cuda_kernels"]

_OFF = ("0", "", "false", "no", "off")
#: Devices where the kernels failed to load, and why (said once, then the array path quietly).
_FAILED: dict[str, str] = {}


def cuda_kernels(
    surface: Literal["slot", "block"], library: Literal["cupy", "torch"], device: str
) -> CudaSlotKernels | CudaBlockKernels | None:
    """The fused kernels of ``surface`` for ``library``'s arrays on ``device`` (``cuda:N``), compiled now.

    None where ``KVREF_CUDA_KERNELS=0``, where CuPy sees no CUDA device, or (with a warning that
    says why, once per device and process) where the kernels fail to compile or load.
    """
    if os.environ.get("KVREF_CUDA_KERNELS", "1").strip().lower() in _OFF:
        return None
    if device in _FAILED:  # said once already
        return None
    index = int(device.partition(":")[2] or 0)
    try:
        import cupy

        if not cupy.cuda.is_available():
            return None
        arrays = cupy_arrays(index) if library == "cupy" else torch_arrays(index)
        return CudaSlotKernels(arrays) if surface == "slot" else CudaBlockKernels(arrays)
    except ImportError:
        return None
    except Exception as exc:  # NVRTC missing, a driver too old for the CUDA build: the array path
        _FAILED[device] = f"{type(exc).__name__}: {exc}"
        warnings.warn(
            f"kvref: the CUDA kernels do not load on {device} ({_FAILED[device]}); the array path runs "
            "instead (many launches a call) in this process",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
