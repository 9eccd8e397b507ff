"""A foreign allocator adopted through an adapter: what a third party writes to use the suite.

``FreeStack`` is a free-list allocator in the style of a GPU free stack (acquire the top ``n``
ids, release pushes them back, a clear error when out of memory): no holders, no reference
counts, no prefix cache. ``FreeStackAdapter`` maps kvref's operations onto it; the suite then
runs every test the adapter's capabilities allow and skips the rest, naming the capability.
"""

from __future__ import annotations

from typing import Any

from kvref_conformance import Target
from kvref_conformance.adapter import ForeignPoolAdapter
from kvref_conformance.suites.errors import ErrorSuite
from kvref_conformance.suites.pool import PoolSuite
from kvref_conformance.suites.stateful import StatefulSuite


class FreeStack:
    """The foreign allocator: ids on a stack, ``top`` counts the free ones."""

    def __init__(self, num_total_blocks: int) -> None:
        self.free_ids = list(range(num_total_blocks))
        self.top = num_total_blocks

    def acquire(self, n: int) -> list[int]:
        if n > self.top:
            raise RuntimeError(f"KV cache OOM: requested {n} blocks, {self.top} available")
        self.top -= n
        return self.free_ids[self.top : self.top + n]

    def release(self, ids: list[int]) -> None:
        self.free_ids[self.top : self.top + len(ids)] = ids
        self.top += len(ids)


class FreeStackAdapter(ForeignPoolAdapter):
    """kvref's BlockPool over FreeStack: the adapter keeps holders, FreeStack keeps the ids."""

    def __init__(self, num_blocks: int, **kwargs: Any) -> None:
        super().__init__(
            num_blocks, reserved_ids=kwargs.get("reserved_ids", (0,)), paused_limit=kwargs.get("paused_limit", 0)
        )
        self.stack = FreeStack(num_blocks)
        self._reserve()

    def _take(self, count: int) -> list[int] | None:
        return self.stack.acquire(count)

    def _give_back(self, ids: list[int]) -> None:
        self.stack.release(ids)

    def _foreign_free(self) -> int:
        return self.stack.top


def make_free_stack(num_blocks: int, *, policy: str = "lru", **kwargs: Any) -> FreeStackAdapter:
    return FreeStackAdapter(num_blocks, **kwargs)


FREE_STACK = Target.from_factory("free-stack", make_free_stack, capabilities={"pause", "policy-lru"})


class TestFreeStackPool(PoolSuite):
    target = FREE_STACK


class TestFreeStackErrors(ErrorSuite):
    target = FREE_STACK


class TestFreeStackStateful(StatefulSuite):
    target = FREE_STACK


def test_a_target_from_factories_takes_every_part_an_implementation_has() -> None:
    """An adopter with a radix cache, token slots and a data plane of its own hands each factory to
    ``Target.from_factory``; the suites then reach each part through the target (CONF-901)."""
    from kvref.oracle import OracleBlockPool
    from kvref.oracle.backend import OracleBackend

    own = OracleBackend()
    target = Target.from_factory(
        "adopter",
        lambda num_blocks, **kw: OracleBlockPool(num_blocks, **kw),
        capabilities={"prefix-cache", "token-slots", "radix-cache", "data-plane"},
        slots_factory=own.create_slots,
        radix_factory=own.create_radix,
        plane_factory=own.data_plane,
    )
    slots, tree = target.create_radix(16)
    assert slots.available_size() == 16 and tree.total_size() == 0, "the radix factory was not the one given"
    assert target.create_slots(8).available_size() == 8, "the slots factory was not the one given"
    assert target.data_plane() is not None, "the data plane factory was not the one given"
