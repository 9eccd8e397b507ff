"""The oracle as a backend, registered under the ``kvref.backends`` entry point ``oracle``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvref import __version__
from kvref.contract.errors import ConfigError
from kvref.contract.protocol import DATA_CAPABILITIES, SLOT_CAPABILITIES, TIER_CAPABILITIES
from kvref.oracle.blockpool.pool import OracleBlockPool
from kvref.oracle.event_index import OracleEventIndex
from kvref.oracle.radix.allocator import OracleSlotAllocator
from kvref.oracle.radix.tree import OracleRadixCache
from kvref.oracle.tiers.store import OracleTierStore

__all__ = ["OracleBackend", "backend"]


class OracleBackend:
    """Factory of :class:`OracleBlockPool`; pure Python, always usable, host memory only."""

    name = "oracle"
    #: The class ``create_tier`` builds (a subclass may name another, as the planted-bug backends do).
    tier_store: type[OracleTierStore] = OracleTierStore
    #: The class ``create_event_index`` builds (a planted-bug backend names another).
    event_index: type[OracleEventIndex] = OracleEventIndex

    def version(self) -> str:
        """kvref's own version: the oracle ships with it."""
        return __version__

    def availability(self) -> str | None:
        """Always usable: the oracle needs nothing but the standard library and kvref."""
        return None

    def device(self, requested: str | None = None) -> str:
        """The oracle lives in host memory; it accepts ``None``, ``"host"`` or ``"cpu"``."""
        if requested not in (None, "host", "cpu"):
            raise ConfigError(
                "CONF-907", f"backend 'oracle' runs in host memory only; device {requested!r} is not possible"
            )
        return "host"

    def capabilities(self) -> frozenset[str]:
        """Everything the spec defines: chapter 06's token slots, chapter 11's tier store, an event index."""
        pools = OracleBlockPool(2).capabilities()
        return (
            pools
            | SLOT_CAPABILITIES
            | TIER_CAPABILITIES
            | (DATA_CAPABILITIES - {"data-device-checks"})
            | {"event-index"}
        )

    def data_plane(self, device: str | None = None) -> Any:
        """Chapter 08's reference: kvref's data-plane classes on NumPy on the host (:mod:`kvref.oracle.data`)."""
        self.device(device)
        from kvref.oracle.data import DataPlane

        return DataPlane.reference()

    def create_slots(
        self, size: int, *, page_size: int = 1, sort: bool = True, device: str | None = None
    ) -> OracleSlotAllocator:
        """A new :class:`OracleSlotAllocator` of ``size`` slots in pages of ``page_size`` (chapter 06)."""
        self.device(device)
        return OracleSlotAllocator(size, page_size=page_size, sort=sort)

    def create_radix(
        self,
        size: int,
        *,
        page_size: int = 1,
        policy: str = "lru",
        sort: bool = True,
        max_tokens: int | None = None,
        enable_events: bool = False,
        device: str | None = None,
    ) -> tuple[OracleSlotAllocator, OracleRadixCache]:
        """A new allocator and an :class:`OracleRadixCache` over it under ``policy`` (chapter 06)."""
        slots = self.create_slots(size, page_size=page_size, sort=sort, device=device)
        return slots, OracleRadixCache(slots, policy=policy, max_tokens=max_tokens, enable_events=enable_events)

    def create_tier(
        self,
        capacity: int,
        *,
        policy: str = "lru",
        medium: str = "host",
        enable_events: bool = False,
        device: str | None = None,
    ) -> OracleTierStore:
        """A new :class:`OracleTierStore` of ``capacity`` slots under ``policy`` (chapter 11)."""
        self.device(device)
        return self.tier_store(capacity, policy=policy, medium=medium, enable_events=enable_events)

    def create_event_index(self, *, device: str | None = None) -> OracleEventIndex:
        """A new :class:`OracleEventIndex`: a router's rebuild of caches from their KV events (PFX-328..PFX-330)."""
        self.device(device)
        return self.event_index()

    def create(
        self,
        num_blocks: int,
        *,
        policy: str = "lru",
        device: str | None = None,
        reserved_ids: Sequence[int] = (0,),
        paused_limit: int = 0,
        enable_events: bool = False,
    ) -> OracleBlockPool:
        """A new :class:`OracleBlockPool`."""
        self.device(device)
        return OracleBlockPool(
            num_blocks,
            policy=policy,
            reserved_ids=reserved_ids,
            paused_limit=paused_limit,
            enable_events=enable_events,
        )


#: The object the entry point names.
backend = OracleBackend()
