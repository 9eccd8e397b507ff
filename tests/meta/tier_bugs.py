"""Planted bugs of chapter 11: the oracle's tier store, each with one bug a real engine's offload tier
has shipped or its users reported, loaded by the conformance suite as a backend by name
(``tests.meta.tier_bugs:X``: the oracle's pools, a buggy ``create_tier``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from kvref.contract.tiers import Lookup, StorePlan
from kvref.oracle.backend import OracleBackend
from kvref.oracle.tiers import OracleTierStore
from kvref.oracle.tiers.policies import ArcTierPolicy, LruTierPolicy


class StoreVisibleBeforeComplete(OracleTierStore):
    """A key whose store is prepared already looks up as a hit, before its KV is written."""

    def lookup(self, key: object) -> Lookup:
        found = super().lookup(key)
        return "hit" if found == "pending" else found


class LoadNotProtected(OracleTierStore):
    """A load pins nothing: the key being read can be evicted and its slot overwritten mid-load."""

    def prepare_load(self, keys: object, *, request: Hashable) -> list[int]:
        slots = super().prepare_load(keys, request=request)
        for key in list(keys):  # type: ignore[call-overload]
            self._pins[key] -= 1
        return slots

    def complete_load(self, keys: object, *, request: Hashable) -> None:
        return None


class FreedSlotKeptAside(OracleTierStore):
    """A slot a failed store gives back goes to the far end of the queue and is not reused until every
    older slot has been (TensorRT-LLM's emptied host slot placed at the back of its LRU): a store
    evicts a ready key while a free slot waits."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aside: list[int] = []

    @property
    def num_free(self) -> int:
        return super().num_free - len(self.aside)

    def complete_store(self, keys: object, *, request: Hashable, success: bool = True) -> None:
        before = len(self._free)
        super().complete_store(keys, request=request, success=success)
        self.aside.extend(self._free[before:])
        del self._free[before:]

    def prepare_store(self, keys: object, *, request: Hashable) -> StorePlan | None:
        plan = super().prepare_store(keys, request=request)
        if plan is not None and plan.evicted:  # a rotation: the slots kept aside come back
            self._free[:0] = self.aside
            self.aside.clear()
        return plan


class ArcGhostsUnbounded(OracleTierStore):
    """ARC's ghost lists are never trimmed: the policy's memory grows with every key ever evicted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(self._policy, ArcTierPolicy):
            self._policy.capacity = 1 << 30


class FailedStoreFreesReadyKey(OracleTierStore):
    """A failed store of a key that is ready already frees its slot too: the block is freed twice
    (a block present in two places, released by both)."""

    def complete_store(self, keys: object, *, request: Hashable, success: bool = True) -> None:
        if not success:
            for key in list(keys):  # type: ignore[call-overload]
                if key in self._pins and self._pins[key] == 0:
                    self._free.append(self._slots.pop(key))
                    del self._pins[key]
                    self._pending.add(key)  # handed to the pending cleanup below, which drops it
                    self._slots[key] = -1
        super().complete_store(keys, request=request, success=success)


class RefusedStoreEvicts(OracleTierStore):
    """A store that cannot find room evicts what it found before it gives up."""

    def prepare_store(self, keys: object, *, request: Hashable) -> StorePlan | None:
        plan = super().prepare_store(keys, request=request)
        if plan is None:
            policy = self._policy
            if isinstance(policy, LruTierPolicy):
                for key in [k for k in policy.recency if self._pins.get(k) == 0][:1]:
                    del policy.recency[key]
                    self._free.append(self._slots.pop(key))
                    del self._pins[key]
        return plan


class LookupCountsAsUse(OracleTierStore):
    """A lookup renews the key under lru: scanning the tier for a prefix reorders it."""

    def lookup(self, key: object) -> Lookup:
        found = super().lookup(key)
        if found == "hit":
            self._policy.touch([int(key)], self._pins.__contains__)  # type: ignore[call-overload]
        return found


class PendingKeyEvictable(OracleTierStore):
    """A key whose store is in flight can be evicted, its slot handed to another store mid-write."""

    def prepare_store(self, keys: object, *, request: Hashable) -> StorePlan | None:
        for key in self._pending:
            self._pins[key] = 0
        try:
            return super().prepare_store(keys, request=request)
        finally:
            for key in list(self._pins):
                if key in self._pending:
                    del self._pins[key]
            for key in list(self._pending):
                if key not in self._slots:
                    self._pending.discard(key)


def _backend(store: type[OracleTierStore]) -> type[OracleBackend]:
    planted = type(store.__name__ + "Backend", (OracleBackend,), {"name": store.__name__, "tier_store": store})
    return planted


#: Each planted tier bug and the rule the suite must name.
TIER_BUGS: dict[str, str] = {
    "StoreVisibleBeforeComplete": "TIER-1103",
    "LoadNotProtected": "TIER-1112",
    "FreedSlotKeptAside": "TIER-1106",
    "ArcGhostsUnbounded": "TIER-1122",
    "FailedStoreFreesReadyKey": "TIER-1111",
    "RefusedStoreEvicts": "TIER-1108",
    "LookupCountsAsUse": "TIER-1116",
    "PendingKeyEvictable": "TIER-1109",
}

for _name in TIER_BUGS:
    globals()[_name] = _backend(globals()[_name])
