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
  else its loads in flight) and its free-chunk count.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from kvref.contract.tiers import KeyState, Lookup, StorePlan, TierEvent

__all__ = ["VllmTierStore", "tier_capabilities"]


def tier_capabilities() -> frozenset[str]:
    """``tier-store`` and ``tier-events`` where vLLM has ``CPUOffloadingManager``; ``tier-arc`` where it offers arc."""
    try:
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: F401
        from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory
    except Exception:  # an older release, or one whose offload module does not import here
        return frozenset()
    found = {"tier-store", "tier-events"}
    try:
        CachePolicyFactory.get_cache_policy_cls("arc", None)
        found.add("tier-arc")
    except Exception:
        pass
    return frozenset(found)


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
        """The manager's ``prepare_store``; its output as a plan."""
        output = self.manager.prepare_store([_key(key) for key in keys], self._context(request))
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
        """The manager's ``prepare_load``; the chunk ids of its load spec."""
        spec = self.manager.prepare_load([_key(key) for key in keys], self._context(request))
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
        if context is not None:
            self.manager.on_request_finished(context)

    def take_events(self) -> list[TierEvent]:
        """The manager's ``take_events``, keys as integers."""
        return [
            TierEvent(tuple(_number(key) for key in event.keys), bool(event.removed), self.medium)
            for event in self.manager.take_events()
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
        """The chunk id."""
        chunk = self._chunk(key)
        return None if chunk is None else int(chunk.chunk_id)

    @property
    def num_free(self) -> int:
        """The manager's free chunks."""
        return int(self.manager._get_num_free_chunks())

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
