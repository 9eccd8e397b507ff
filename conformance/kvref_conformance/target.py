"""What the suite tests: a named factory of pools with declared capabilities and profile.

A :class:`Target` is all an implementation needs to give the suite. kvref's registered backends
become targets through :meth:`Target.from_backend`; a third party builds one from any callable
(:meth:`Target.from_factory`), and a foreign API gets a thin adapter class first (see
:mod:`kvref_conformance.adapter`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvref.contract.errors import BackendUnavailableError
from kvref.contract.protocol import CAPABILITIES

__all__ = ["PROFILES", "Target"]

#: How strictly the suite compares block ids with the oracle's.
PROFILES = {
    "renaming": "block ids are compared through a renaming (POOL-115): any id choice passes",
    "exact-order": "allocate and lookup must return the very ids the oracle returns, in its order",
}


@dataclass(frozen=True)
class Target:
    """An implementation under test.

    ``factory(num_blocks, *, policy, reserved_ids, paused_limit, enable_events)`` returns a new
    pool speaking :class:`kvref.contract.protocol.PrefixCache` (or only :class:`~kvref.contract.protocol.BlockPool`
    when ``"prefix-cache"`` is not among ``capabilities``).
    """

    name: str
    factory: Callable[..., Any]
    capabilities: frozenset[str] = field(default_factory=frozenset)
    version: str = "unknown"
    device: str = "host"
    profile: str = "renaming"
    #: ``slots_factory(size, *, page_size, sort)``: chapter 06's token-slot allocator, where the
    #: target has one (capability ``token-slots``).
    slots_factory: Callable[..., Any] | None = None
    #: ``slot_arrays_factory(size, *, page_size, sort, dtype)``: the same allocator with the array
    #: surface (capability ``slot-arrays``, ERR-510..ERR-514).
    slot_arrays_factory: Callable[..., Any] | None = None
    #: ``radix_factory(size, *, page_size, policy, sort)``: chapter 06's allocator and a radix
    #: tree over it, as a pair (capability ``radix-cache``).
    radix_factory: Callable[..., Any] | None = None
    #: ``manager_factory(num_blocks, **settings)``: chapter 07's request-level manager where the
    #: target has one of its own (a peer's); without it, kvref's oracle manager over the target's
    #: prefix cache (:meth:`create_manager`).
    manager_factory: Callable[..., Any] | None = None
    #: ``context_factory(*, block_size, num_blocks, paused_blocks, policy)``: an engine's own request
    #: path over its allocator (capability ``context-duties``, chapter 07's REQ-740..REQ-745).
    context_factory: Callable[..., Any] | None = None
    #: ``plane_factory()``: chapter 08's data plane on the target's device (capability ``data-plane``):
    #: a :class:`kvref.oracle.data.DataPlane`, its tensor library and the class of each part.
    plane_factory: Callable[..., Any] | None = None
    #: ``block_arrays_factory(num_blocks, *, max_requests, reserved_ids, dtype)``: chapter 01's
    #: block pool with the array surface and request slots (capability ``block-arrays``, ERR-517..ERR-520).
    block_arrays_factory: Callable[..., Any] | None = None
    #: ``block_tables_factory(num_blocks, *, max_requests, block_size, max_blocks)``: a batch's block
    #: tables over that surface (capability ``block-tables``, chapter 07's REQ-750..REQ-756).
    block_tables_factory: Callable[..., Any] | None = None
    #: ``tier_factory(capacity, *, policy, enable_events)``: chapter 11's tier store (capability
    #: ``tier-store``, TIER-1101..TIER-1124).
    tier_factory: Callable[..., Any] | None = None
    #: ``event_index_factory()``: a router's index rebuilt from KV events (capability ``event-index``,
    #: chapter 03's PFX-328..PFX-330).
    event_index_factory: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.capabilities) - set(CAPABILITIES)
        if unknown:
            raise ValueError(f"target {self.name!r} declares unknown capabilities {sorted(unknown)}")
        if self.profile not in PROFILES:
            raise ValueError(f"target {self.name!r}: profile must be one of {sorted(PROFILES)}")

    def without(self, capabilities: Iterable[str]) -> Target:
        """This target with ``capabilities`` withdrawn, named ``<name>-without-<caps>``.

        For running the rest of the suite past a known deviation: the tests needing a withdrawn
        capability are skipped, and the machines stop checking it, so the deviation cannot
        mask what they would find after it.
        """
        drop = sorted(set(capabilities))
        unknown = set(drop) - set(CAPABILITIES)
        if unknown:
            raise ValueError(f"unknown capabilities {sorted(unknown)}")
        if not drop:
            return self
        name = f"{self.name}-without-{'-'.join(drop)}"
        return replace(self, name=name, capabilities=self.capabilities - set(drop))

    def has(self, capability: str) -> bool:
        """Whether the target declares ``capability``."""
        return capability in self.capabilities

    def create(
        self,
        num_blocks: int,
        *,
        policy: str = "lru",
        reserved_ids: Iterable[int] = (0,),
        paused_limit: int = 0,
        enable_events: bool = True,
    ) -> Any:
        """A new pool of the implementation."""
        return self.factory(
            num_blocks,
            policy=policy,
            reserved_ids=tuple(reserved_ids),
            paused_limit=paused_limit,
            enable_events=enable_events,
        )

    def create_slots(self, size: int, *, page_size: int = 1, sort: bool = True) -> Any:
        """A new token-slot allocator of the implementation (chapter 06); ConfigError where it has none."""
        if self.slots_factory is None:
            from kvref.contract.errors import ConfigError

            raise ConfigError("CONF-904", f"target {self.name!r} has no token-slot allocator")
        return self.slots_factory(size, page_size=page_size, sort=sort)

    def create_radix(
        self,
        size: int,
        *,
        page_size: int = 1,
        policy: str = "lru",
        sort: bool = True,
        max_tokens: int | None = None,
        enable_events: bool = False,
    ) -> Any:
        """A new (allocator, radix tree) pair of the implementation (chapter 06); ConfigError where it has none.

        ``max_tokens`` (capability ``radix-capacity``, RADIX-633) and ``enable_events`` (``radix-events``,
        RADIX-634) are passed on only when given."""
        if self.radix_factory is None:
            from kvref.contract.errors import ConfigError

            raise ConfigError("CONF-904", f"target {self.name!r} has no radix cache")
        extra: dict[str, Any] = {} if max_tokens is None else {"max_tokens": max_tokens}
        if enable_events:
            extra["enable_events"] = True
        return self.radix_factory(size, page_size=page_size, policy=policy, sort=sort, **extra)

    def create_slot_arrays(self, size: int, *, page_size: int = 1, sort: bool = True, dtype: str = "int32") -> Any:
        """A new token-slot allocator with the array surface (ERR-510); ConfigError where it has none."""
        if self.slot_arrays_factory is None:
            from kvref.contract.errors import ConfigError

            raise ConfigError("CONF-904", f"target {self.name!r} has no array surface for its token slots")
        return self.slot_arrays_factory(size, page_size=page_size, sort=sort, dtype=dtype)

    def create_block_arrays(
        self, num_blocks: int, *, max_requests: int = 256, reserved_ids: tuple[int, ...] = (0,), dtype: str = "int32"
    ) -> Any:
        """A new block pool with the array surface (ERR-517..ERR-520); ConfigError where it has none."""
        if self.block_arrays_factory is None:
            from kvref.contract.errors import ConfigError

            raise ConfigError("CONF-904", f"target {self.name!r} has no array surface for its block pool")
        return self.block_arrays_factory(num_blocks, max_requests=max_requests, reserved_ids=reserved_ids, dtype=dtype)

    def create_block_tables(
        self, num_blocks: int, *, max_requests: int = 256, block_size: int = 4, max_blocks: int = 16
    ) -> Any:
        """New block tables for a batched step over a new block array surface (REQ-750); ConfigError where
        the target has none."""
        if self.block_tables_factory is None:
            from kvref.contract.errors import ConfigError

            raise ConfigError("CONF-904", f"target {self.name!r} has no batched block tables")
        return self.block_tables_factory(
            num_blocks, max_requests=max_requests, block_size=block_size, max_blocks=max_blocks
        )

    def create_manager(
        self,
        num_blocks: int,
        *,
        block_size: int = 4,
        max_model_len: int = 64,
        policy: str = "lru",
        enable_caching: bool = True,
        use_eagle: bool = False,
        enable_kv_cache_events: bool = True,
        last_block: str = "recompute",
        groups: Sequence[Any] | None = None,
        pool_sizes: Sequence[int] | None = None,
    ) -> Any:
        """A new request-level manager (chapter 07) over ``num_blocks`` blocks, block 0 the null block.

        The target's own manager where it has one, else kvref's :class:`~kvref.oracle.manager.RequestManager`
        over a new pool of the target (events on where both the pool and the call want them); with
        ``pool_sizes``, over one new pool of each size per group instead (REQ-735).
        """
        settings: dict[str, Any] = {
            "block_size": block_size,
            "max_model_len": max_model_len,
            "enable_caching": enable_caching,
            "use_eagle": use_eagle,
            "enable_kv_cache_events": enable_kv_cache_events and enable_caching and self.has("events"),
            "last_block": last_block,
        }
        if groups is not None:  # chapter 07's KV cache groups (kvref.contract.manager.CacheGroup)
            settings["groups"] = tuple(groups)
        if self.manager_factory is not None:
            if pool_sizes is not None:
                from kvref.contract.errors import ConfigError

                raise ConfigError("CONF-904", f"target {self.name!r}: its own manager takes no pool per group")
            return self.manager_factory(num_blocks, policy=policy, **settings)
        from kvref.oracle.manager import RequestManager

        events = settings["enable_kv_cache_events"]
        if pool_sizes is not None:
            pools = [self.create(size, policy=policy, enable_events=events) for size in pool_sizes]
            return RequestManager(pools, **settings)
        return RequestManager(self.create(num_blocks, policy=policy, enable_events=events), **settings)

    def create_tier(self, capacity: int, *, policy: str = "lru", enable_events: bool = True) -> Any:
        """A new tier store of the implementation (chapter 11); ConfigError where it has none."""
        if self.tier_factory is None:
            from kvref.contract.errors import ConfigError

            raise ConfigError("CONF-904", f"target {self.name!r} has no tier store")
        return self.tier_factory(capacity, policy=policy, enable_events=enable_events)

    def create_event_index(self) -> Any:
        """A new event index of the implementation (PFX-328..PFX-330); ConfigError where it has none."""
        if self.event_index_factory is None:
            from kvref.contract.errors import ConfigError

            raise ConfigError("CONF-904", f"target {self.name!r} has no event index")
        return self.event_index_factory()

    def data_plane(self) -> Any:
        """The target's data plane (chapter 08); ConfigError where it has none."""
        if self.plane_factory is None:
            from kvref.contract.errors import ConfigError

            raise ConfigError("CONF-904", f"target {self.name!r} has no data plane")
        return self.plane_factory()

    def create_context(self, **settings: Any) -> Any:
        """The engine's own request path over a new allocator (REQ-740..REQ-745); ConfigError where it has none."""
        if self.context_factory is None:
            from kvref.contract.errors import ConfigError

            raise ConfigError("CONF-904", f"target {self.name!r} has no request path of its own to drive")
        return self.context_factory(**settings)

    @classmethod
    def from_factory(
        cls,
        name: str,
        factory: Callable[..., Any],
        *,
        capabilities: Iterable[str],
        version: str = "unknown",
        device: str = "host",
        profile: str = "renaming",
        slots_factory: Callable[..., Any] | None = None,
        slot_arrays_factory: Callable[..., Any] | None = None,
        radix_factory: Callable[..., Any] | None = None,
        manager_factory: Callable[..., Any] | None = None,
        context_factory: Callable[..., Any] | None = None,
        plane_factory: Callable[..., Any] | None = None,
        block_arrays_factory: Callable[..., Any] | None = None,
        block_tables_factory: Callable[..., Any] | None = None,
        tier_factory: Callable[..., Any] | None = None,
        event_index_factory: Callable[..., Any] | None = None,
    ) -> Target:
        """A target from any callable with the factory signature above and, where the implementation
        has them, the factories of its other parts (each as the field of the same name describes).
        It has a block pool (``factory``), so it declares ``block-pool`` whether named or not."""
        return cls(
            name,
            factory,
            frozenset(capabilities) | {"block-pool"},
            version,
            device,
            profile,
            slots_factory,
            slot_arrays_factory,
            radix_factory,
            manager_factory,
            context_factory,
            plane_factory,
            block_arrays_factory,
            block_tables_factory,
            tier_factory,
            event_index_factory,
        )

    @classmethod
    def from_backend(cls, name: str, *, device: str | None = None) -> Target:
        """A registered backend (or ``module:attribute``), refusing one not usable here.

        It declares ``block-pool`` unless the backend says it has none (``has_block_pool = False``:
        an implementation of other parts only, a router's event index, say)."""
        from kvref.config.registry import load_backend

        backend = load_backend(name)
        reason = backend.availability()
        if reason is not None:
            raise BackendUnavailableError("CONF-902", f"backend {name!r} is not usable here: {reason}")
        resolved_device = backend.device(device)

        def factory(num_blocks: int, **kwargs: Any) -> Any:
            return backend.create(num_blocks, device=device, **kwargs)

        profile = getattr(backend, "conformance_profile", "renaming")
        make_slots = getattr(backend, "create_slots", None)

        def slots_factory(size: int, **kwargs: Any) -> Any:
            return make_slots(size, device=device, **kwargs)  # type: ignore[misc]

        capabilities = frozenset(backend.capabilities())
        if getattr(backend, "has_block_pool", True):
            capabilities |= {"block-pool"}
        if resolved_device.startswith("cuda"):  # what a pool has on this very device (cuda-graph)
            capabilities |= frozenset(factory(2).capabilities())
        slots = slots_factory if make_slots is not None else None
        make_arrays = getattr(backend, "create_slot_arrays", None)

        def slot_arrays_factory(size: int, **kwargs: Any) -> Any:
            return make_arrays(size, device=device, **kwargs)  # type: ignore[misc]

        arrays = slot_arrays_factory if make_arrays is not None else None
        make_radix = getattr(backend, "create_radix", None)

        def radix_factory(size: int, **kwargs: Any) -> Any:
            return make_radix(size, device=device, **kwargs)  # type: ignore[misc]

        radix = radix_factory if make_radix is not None else None
        make_manager = getattr(backend, "create_manager", None)

        def manager_factory(num_blocks: int, **kwargs: Any) -> Any:
            return make_manager(num_blocks, device=device, **kwargs)  # type: ignore[misc]

        manager = manager_factory if make_manager is not None else None
        make_context = getattr(backend, "create_context", None)

        def context_factory(**kwargs: Any) -> Any:
            return make_context(device=device, **kwargs)  # type: ignore[misc]

        context = context_factory if make_context is not None else None
        make_plane = getattr(backend, "data_plane", None)

        def plane_factory() -> Any:
            return make_plane(device)  # type: ignore[misc]

        plane = plane_factory if make_plane is not None else None
        make_blocks = getattr(backend, "create_block_arrays", None)

        def block_arrays_factory(num_blocks: int, **kwargs: Any) -> Any:
            return make_blocks(num_blocks, device=device, **kwargs)  # type: ignore[misc]

        blocks = block_arrays_factory if make_blocks is not None else None
        make_tables = getattr(backend, "create_block_tables", None)

        def block_tables_factory(num_blocks: int, **kwargs: Any) -> Any:
            return make_tables(num_blocks, device=device, **kwargs)  # type: ignore[misc]

        tables = block_tables_factory if make_tables is not None else None
        make_tier = getattr(backend, "create_tier", None)

        def tier_factory(capacity: int, **kwargs: Any) -> Any:
            return make_tier(capacity, device=device, **kwargs)  # type: ignore[misc]

        tier = tier_factory if make_tier is not None else None
        make_index = getattr(backend, "create_event_index", None)

        def event_index_factory() -> Any:
            return make_index(device=device)  # type: ignore[misc]

        index = event_index_factory if make_index is not None else None
        return cls(
            name,
            factory,
            capabilities,
            backend.version(),
            resolved_device,
            profile,
            slots,
            arrays,
            radix,
            manager,
            context,
            plane,
            blocks,
            tables,
            tier,
            index,
        )
