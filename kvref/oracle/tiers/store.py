"""Chapter 11's tier store, the reference: one tier's slots, keys in two-phase stores and loads, a policy.

:class:`OracleTierStore` holds, per key, its state (pending or ready), its slot and, when ready, its
pin count; a free list of slots; what each request named (its **use**, which the policy sees when
the request ends); and events. The policy (:mod:`kvref.oracle.tiers.policies`) orders the keys and
chooses what a store evicts. Every call checks all its arguments and the state it needs before it
changes anything, so a refused call changes nothing (TIER-1102, TIER-1108, TIER-1113, TIER-1115).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kvref.contract.errors import ConfigError, InvalidTypeError, InvariantViolation, TierStateError
from kvref.contract.tiers import TIER_POLICIES, KeyState, Lookup, StorePlan, TierEvent, as_tier_key, as_tier_keys
from kvref.oracle.tiers.policies import ArcTierPolicy, LruTierPolicy, tier_policy

__all__ = ["OracleTierStore", "RequestUse"]


@dataclass
class RequestUse:
    """What one request named in a tier until its end (TIER-1116, TIER-1119).

    ``keys`` in the order first named; ``stored`` the keys its stores made pending; ``reused`` the
    keys it loaded or offered while ready without having stored them; ``store_missed`` the keys
    its stores reported to the policy as misses (once per request, TIER-1121).
    """

    keys: list[int] = field(default_factory=list)
    named: set[int] = field(default_factory=set)
    stored: set[int] = field(default_factory=set)
    reused: set[int] = field(default_factory=set)
    store_missed: set[int] = field(default_factory=set)

    def name(self, keys: Iterable[int]) -> None:
        """Record ``keys`` in the order first named."""
        for key in keys:
            if key not in self.named:
                self.named.add(key)
                self.keys.append(key)


class OracleTierStore:
    """One tier of ``capacity`` slots under ``policy`` (``lru`` or ``arc``), on ``medium`` (chapter 11)."""

    def __init__(
        self, capacity: object, *, policy: object = "lru", medium: str = "host", enable_events: bool = False
    ) -> None:
        if type(capacity) is not int or capacity <= 0:
            raise ConfigError("TIER-1101", f"TierStore: capacity must be a positive integer, got {capacity!r}")
        if policy not in TIER_POLICIES:
            raise ConfigError(
                "TIER-1101", f"TierStore: policy must be one of {', '.join(TIER_POLICIES)}, got {policy!r}"
            )
        self.capacity = capacity
        self.policy = str(policy)
        self.medium = medium
        self.enable_events = enable_events
        self._policy: LruTierPolicy | ArcTierPolicy = tier_policy(self.policy, capacity)
        self._slots: dict[int, int] = {}  # pending or ready key -> its slot
        self._pending: set[int] = set()
        self._pins: dict[int, int] = {}  # ready key -> loads prepared and not completed
        self._fresh = 0  # slots [fresh, capacity) were never taken
        self._free: list[int] = []  # slots freed since, taken last freed first
        self._uses: dict[Hashable, RequestUse] = {}
        self._events: list[TierEvent] = []

    # -- observers ---------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Slots holding no key (TIER-1106)."""
        return self.capacity - self._fresh + len(self._free)

    def state(self, key: int) -> KeyState:
        """``"absent"``, ``"pending"`` or ``"ready"``."""
        if key in self._pending:
            return "pending"
        return "ready" if key in self._pins else "absent"

    def pins(self, key: int) -> int:
        """The loads prepared and not completed that read ``key``."""
        return self._pins.get(key, 0)

    def slot(self, key: int) -> int | None:
        """The slot of a pending or ready key."""
        return self._slots.get(key)

    def resident(self) -> dict[int, KeyState]:
        """Every pending and ready key with its state."""
        return {key: self.state(key) for key in self._slots}

    def lookup(self, key: object) -> Lookup:
        """``"miss"``, ``"pending"`` or ``"hit"``, changing nothing (TIER-1103)."""
        checked = key if type(key) is int else as_tier_key(key, op="lookup")
        if checked in self._pins:
            return "hit"
        return "pending" if checked in self._pending else "miss"

    # -- stores ------------------------------------------------------------------------------

    def prepare_store(self, keys: object, *, request: Hashable) -> StorePlan | None:
        """Make the absent keys pending in slots of their own, evicting the shortfall (TIER-1104..TIER-1109)."""
        offered = as_tier_keys(keys, op="prepare_store")
        use = self._use(request, "prepare_store")
        to_store = list(dict.fromkeys(key for key in offered if key not in self._slots))
        ready = [key for key in offered if key in self._pins]
        misses = [key for key in to_store if key not in use.store_missed]
        if misses:
            self._policy.store_missed(misses)
            use.store_missed.update(misses)
        recorded = set(to_store).union(ready)
        use.name(key for key in offered if key in recorded)
        use.reused.update(key for key in ready if key not in use.stored)
        if not to_store:
            return StorePlan((), (), ())
        shortfall = len(to_store) - self.num_free
        evicted: list[int] = []
        if shortfall > 0:
            named = set(offered)
            victims = self._policy.victims(shortfall, lambda key: self._pins.get(key) == 0 and key not in named)
            if victims is None:
                return None  # TIER-1108: the policy changed nothing either
            for key in victims:
                self._free.append(self._slots.pop(key))
                del self._pins[key]
            evicted = victims
            self._report(evicted, removed=True)
        slots = [self._take_slot() for _ in to_store]
        for key, slot in zip(to_store, slots, strict=True):
            self._slots[key] = slot
            self._pending.add(key)
            self._policy.insert(key)
        use.stored.update(to_store)
        return StorePlan(tuple(to_store), tuple(slots), tuple(evicted))

    def complete_store(self, keys: object, *, request: Hashable, success: bool = True) -> None:
        """Pending keys become ready (TIER-1110) or, when the store failed, absent (TIER-1111)."""
        named = as_tier_keys(keys, op="complete_store")
        self._use(request, "complete_store", record=False)
        if type(success) is not bool:
            raise InvalidTypeError("TIER-1102", f"complete_store: success must be a bool, got {success!r}")
        done = [key for key in dict.fromkeys(named) if key in self._pending]
        for key in done:
            self._pending.discard(key)
            if success:
                self._pins[key] = 0
            else:
                self._free.append(self._slots.pop(key))
                self._policy.remove(key)
        if success:
            self._report(done, removed=False)

    # -- loads -------------------------------------------------------------------------------

    def prepare_load(self, keys: object, *, request: Hashable) -> list[int]:
        """Pin each ready key once per mention and return the slots in order (TIER-1112, TIER-1113)."""
        named = as_tier_keys(keys, op="prepare_load")
        use = self._use(request, "prepare_load")
        for key in named:
            if key not in self._pins:
                raise TierStateError(
                    "TIER-1113", f"prepare_load: key {key} is {self.state(key)}, not ready; nothing was pinned"
                )
        for key in named:
            self._pins[key] += 1
        use.name(named)
        use.reused.update(key for key in named if key not in use.stored)
        return [self._slots[key] for key in named]

    def complete_load(self, keys: object, *, request: Hashable) -> None:
        """Unpin each key once per mention (TIER-1114); a key with too few pins is refused (TIER-1115)."""
        named = as_tier_keys(keys, op="complete_load")
        self._use(request, "complete_load", record=False)
        for key, count in Counter(named).items():
            if self._pins.get(key, 0) < count:
                raise TierStateError(
                    "TIER-1115",
                    f"complete_load: key {key} ({self.state(key)}) has {self.pins(key)} pin(s), "
                    f"the call releases {count}; nothing was unpinned",
                )
        for key in named:
            self._pins[key] -= 1

    # -- uses, events, reset -----------------------------------------------------------------

    def touch(self, keys: object) -> None:
        """Use the keys now, the first most recent (TIER-1117)."""
        named = as_tier_keys(keys, op="touch")
        self._policy.touch(named, self._pins.__contains__)

    def finish_request(self, request: Hashable) -> None:
        """The request ended: the policy sees its use (TIER-1116, TIER-1119); an unknown request is a no-op."""
        self._check_request(request, "finish_request")
        use = self._uses.pop(request, None)
        if use is not None:
            self._policy.request_finished(use.keys, use.stored - use.reused, use.reused)

    def take_events(self) -> list[TierEvent]:
        """The events since the last call, oldest first (TIER-1123)."""
        events, self._events = self._events, []
        return events

    def reset(self) -> None:
        """Every key absent, every slot free, the policy and the requests' uses forgotten (TIER-1124).

        With events on, one ``removed`` event names every ready key, so the events rebuild the tier."""
        self._report(list(self._pins), removed=True)
        self._slots.clear()
        self._pending.clear()
        self._pins.clear()
        self._fresh = 0
        self._free.clear()
        self._uses.clear()
        self._policy.clear()

    def check_invariants(self) -> None:
        """Raise InvariantViolation naming the rule when the store's state breaks chapter 11.

        Slots conserved (TIER-1106) and held by one key each in ``[0, capacity)`` (TIER-1105), no
        key both pending and ready (TIER-1109), no negative pin count (TIER-1114), the policy
        ordering exactly the resident keys (TIER-1116, TIER-1118) and arc's ghosts bounded (TIER-1122).
        """
        held = list(self._slots.values())
        free = self._free + list(range(self._fresh, self.capacity))
        if len(held) + len(free) != self.capacity or set(held) | set(free) != set(range(self.capacity)):
            raise InvariantViolation(
                "TIER-1106", f"slots not conserved: {len(held)} held, {len(free)} free of {self.capacity}"
            )
        if len(set(held)) != len(held):
            raise InvariantViolation("TIER-1105", "two keys hold one slot")
        if self._pending & self._pins.keys() or (self._pending | self._pins.keys()) != self._slots.keys():
            raise InvariantViolation("TIER-1109", "a key is both pending and ready, or holds a slot in neither state")
        if any(count < 0 for count in self._pins.values()):
            raise InvariantViolation("TIER-1114", "a negative pin count")
        policy = self._policy
        ordered = list(policy.recency) if isinstance(policy, LruTierPolicy) else [*policy.t1, *policy.t2]
        if len(ordered) != len(self._slots) or set(ordered) != self._slots.keys():
            raise InvariantViolation("TIER-1116", "the policy's order and the resident keys differ")
        if isinstance(policy, ArcTierPolicy) and max(len(policy.b1), len(policy.b2)) > self.capacity:
            raise InvariantViolation("TIER-1122", f"a ghost list holds more than {self.capacity} keys")

    def snapshot(self) -> dict[str, Any]:
        """The store's whole observable state, for before/after comparisons."""
        return {
            "slots": dict(self._slots),
            "pending": sorted(self._pending),
            "pins": dict(self._pins),
            "num_free": self.num_free,
            "policy": self.policy_state(),
        }

    def policy_state(self) -> dict[str, Any]:
        """The policy's order: lru's recency (oldest first), or arc's lists, ghosts and target."""
        policy = self._policy
        if isinstance(policy, LruTierPolicy):
            return {"recency": list(policy.recency)}
        return {
            "t1": list(policy.t1),
            "t2": list(policy.t2),
            "b1": list(policy.b1),
            "b2": list(policy.b2),
            "target": policy.target,
        }

    # -- private -----------------------------------------------------------------------------

    def _take_slot(self) -> int:
        if self._fresh < self.capacity:
            self._fresh += 1
            return self._fresh - 1
        return self._free.pop()

    def _report(self, keys: list[int], *, removed: bool) -> None:
        if self.enable_events and keys:
            self._events.append(TierEvent(tuple(keys), removed, self.medium))

    @staticmethod
    def _check_request(request: object, op: str) -> None:
        try:
            hash(request)
        except TypeError:
            raise InvalidTypeError(
                "TIER-1102", f"{op}: request must be hashable, got {type(request).__name__}"
            ) from None

    def _use(self, request: Hashable, op: str, *, record: bool = True) -> RequestUse:
        self._check_request(request, op)
        use = self._uses.get(request)
        if use is None:
            use = RequestUse()
            if record:
                self._uses[request] = use
        return use

    def __repr__(self) -> str:
        return (
            f"OracleTierStore(capacity={self.capacity}, policy={self.policy!r}, medium={self.medium!r}, "
            f"pending={len(self._pending)}, ready={len(self._pins)}, free={self.num_free})"
        )
