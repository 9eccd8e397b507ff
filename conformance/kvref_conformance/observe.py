"""The observable state of any implementation, read through the protocol alone.

Used to check that a failed call changed nothing (ERR-501) on implementations that do not offer
``snapshot()``. Events are not read here (reading them consumes them); the suite drains them
before a call and checks afterwards that a failed call emitted none.
"""

from __future__ import annotations

from typing import Any

__all__ = ["describe_change", "observe"]


def observe(pool: Any) -> dict[str, Any]:
    """Every observable part of ``pool``'s state, as a comparable dict."""
    blocks = []
    caching = hasattr(pool, "resident_hashes")
    for b in range(pool.num_blocks):
        row: dict[str, Any] = {
            "state": str(pool.block_state(b)),
            "ref": pool.ref_count(b),
            "holders": pool.holders(b),
            "generation": pool.generation(b),
        }
        if caching:
            row["hash"] = pool.block_hash(b)
        blocks.append(row)
    out: dict[str, Any] = {
        "blocks": blocks,
        "num_free": pool.num_free,
        "num_in_use": pool.num_in_use,
        "num_available": pool.num_available,
    }
    if caching:
        out["resident"] = set(pool.resident_hashes())
        out["num_cached"] = pool.num_cached
        out["stats"] = pool.stats
    if hasattr(pool, "paused_used"):
        out["paused_used"] = pool.paused_used
    return out


def describe_change(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A short account of what differs between two observations, for an assertion message."""
    parts = []
    for key in before:
        if key == "blocks":
            for b, (x, y) in enumerate(zip(before[key], after[key], strict=True)):
                if x != y:
                    parts.append(f"block {b}: {x} -> {y}")
        elif before[key] != after.get(key):
            parts.append(f"{key}: {before[key]!r} -> {after.get(key)!r}")
    return "; ".join(parts[:6]) + (" ..." if len(parts) > 6 else "")
