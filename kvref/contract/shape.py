"""The fixed shape of a block pool, as a mixin: its size and its reserved ids (POOL-101, POOL-102).

A class mixing this in sets ``_n`` and ``_reserved`` once, from :func:`kvref.contract.validate.as_pool_shape`,
and gets the three sizes every :class:`~kvref.contract.protocol.BlockPool` reports that follow from them.
The oracle, the array core of the device backends and the conformance suite's adapters share it.
"""

from __future__ import annotations

__all__ = ["PoolShape"]


class PoolShape:
    """``num_blocks``, ``reserved_ids`` and ``num_usable`` over ``_n`` and ``_reserved``."""

    _n: int
    _reserved: tuple[int, ...]

    @property
    def num_blocks(self) -> int:
        """All blocks, reserved ones included."""
        return self._n

    @property
    def reserved_ids(self) -> tuple[int, ...]:
        """Blocks never handed out (POOL-102)."""
        return self._reserved

    @property
    def num_usable(self) -> int:
        """``num_blocks - len(reserved_ids)`` (STATE-003)."""
        return self._n - len(self._reserved)
