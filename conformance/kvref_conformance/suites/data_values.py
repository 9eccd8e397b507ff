"""What the data-plane suites write: values derived from (token, position, layer), exact in every dtype.

A token's K and V rows hold a pattern that depends only on the token, its position and the layer,
so a prefix hit must read back exactly the pattern its tokens were written with, and a single
wrong element is named by slot, layer and element. Values are small integers, exact in float32,
float16, bfloat16 and the 8-bit types (at most 15 for ``float8_e4m3fn``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["expected_routing", "expected_row", "expected_states", "first_mismatch", "modulus"]

_MODULI = {"float8_e4m3fn": 15, "int8": 127, "uint8": 251, "bfloat16": 251, "float16": 2039, "float32": 65_521}


def modulus(dtype: str) -> int:
    """The largest value-plus-one written in ``dtype``: every integer below it is exact there."""
    return _MODULI.get(dtype, 127)


def expected_row(token: int, position: int, layer: int, heads: int, dim: int, dtype: str, *, value: bool) -> np.ndarray:
    """The ``[heads, dim]`` K (``value=False``) or V row of ``token`` at ``position`` in ``layer``."""
    m = modulus(dtype)
    code = (token * 1_000_003 + position * 10_007 + layer * 101 + (7 if value else 0)) % m
    return ((code + np.arange(heads * dim)) % m + 1).astype(np.float32).reshape(heads, dim)


def expected_routing(token: int, position: int, num_layers: int, topk: int) -> np.ndarray:
    """The ``[num_layers, topk]`` expert ids of ``token`` at ``position``."""
    layers = np.arange(num_layers).reshape(-1, 1)
    ks = np.arange(topk).reshape(1, -1)
    return ((token * 13 + position * 7 + layers * 3 + ks * 5) % 64).astype(np.int32)


def expected_states(owner: int, recurrent_shape: tuple[int, ...], conv_shape: tuple[int, ...]) -> tuple[Any, Any]:
    """The recurrent (float32) and conv states request ``owner`` leaves in its slot, every layer."""
    r = ((owner * 31 + np.arange(int(np.prod(recurrent_shape)))) % 97 + 1).astype(np.float32)
    c = ((owner * 17 + np.arange(int(np.prod(conv_shape)))) % 61 + 1).astype(np.float32)
    return r.reshape(recurrent_shape), c.reshape(conv_shape)


def first_mismatch(seen: np.ndarray, want: np.ndarray) -> str | None:
    """Where ``seen`` first differs from ``want``: the index and both values, or None when equal."""
    if seen.shape != want.shape:
        return f"shape {seen.shape}, expected {want.shape}"
    bad = np.argwhere(np.asarray(seen, dtype=np.float64) != np.asarray(want, dtype=np.float64))
    if not len(bad):
        return None
    at = tuple(int(i) for i in bad[0])
    return f"element {at}: expected {want[at]}, saw {seen[at]} ({len(bad)} elements differ)"
