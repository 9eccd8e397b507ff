"""A planted bug of the array forms of the block pool's calls (POOL-123): ids returned as a view.

``AllocateIdsViewsTheFreeStack`` is a backend the conformance suite loads by name
(``tests.meta.id_array_bugs:AllocateIdsViewsTheFreeStack``): the CuPy backend (NumPy without CUDA)
whose pools hand ``allocate_ids``'s caller the slice of the free stack the ids were popped from,
as Megatron-Core's ``allocate_memory_blocks`` hands out a slice of its own free list. The list form
copies as before, so only a suite that calls the array forms can see it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import SupportsIndex

from kvref_arraypool.ops import Array
from kvref_arraypool.pool import ArrayBlockPool

from kvref_cupy.backend import CupyBackend

__all__ = ["ID_ARRAY_BUGS", "AllocateIdsViewsTheFreeStack"]


class _PoolViewingItsStack(ArrayBlockPool):
    """``allocate_ids`` returns the popped slice of the free stack, reversed as a view, when every id
    came off the stack: a later free pushes blocks over it and the caller's ids change."""

    def allocate_ids(self, count: SupportsIndex, *, holder: Hashable = None) -> Array:
        top = self.blocks.num_free
        ids = super().allocate_ids(count, holder=holder)
        n = len(ids)
        if 0 < n <= top:
            return self.blocks.stack[top - n : top][::-1]
        return ids


class AllocateIdsViewsTheFreeStack(CupyBackend):
    """The CuPy backend whose block pools are :class:`_PoolViewingItsStack`."""

    name = "AllocateIdsViewsTheFreeStack"

    def create(
        self,
        num_blocks: int,
        *,
        policy: str = "lru",
        device: str | None = None,
        reserved_ids: Sequence[int] = (0,),
        paused_limit: int = 0,
        enable_events: bool = False,
    ) -> ArrayBlockPool:
        where = self.device(device)
        return _PoolViewingItsStack(
            num_blocks,
            ops=self.ops(where),
            policy=policy,
            reserved_ids=reserved_ids,
            paused_limit=paused_limit,
            enable_events=enable_events,
            name=self.pool_name(where),
        )


#: The planted bug and the rule the suite must name.
ID_ARRAY_BUGS: dict[str, str] = {"AllocateIdsViewsTheFreeStack": "POOL-123"}
