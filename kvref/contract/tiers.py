"""Chapter 11's tier store as every implementation shows it: the protocol, a store's plan, its events.

A tier holds blocks' KV below the device pool under their keys (integers: block hashes, with the
KV cache group where an engine has several). Stores and loads have two phases, prepared then
completed (TIER-1104..TIER-1115); the policy (``lru``, ``arc``) picks what a store evicts
(TIER-1116..TIER-1122). :func:`as_tier_keys` is the one argument check every implementation runs
(TIER-1102).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from kvref.contract.errors import InvalidTypeError
from kvref.contract.validate import as_list

__all__ = [
    "LOOKUP_RESULTS",
    "TIER_POLICIES",
    "KeyState",
    "Lookup",
    "StorePlan",
    "TierEvent",
    "TierStore",
    "apply_tier_events",
    "as_tier_key",
    "as_tier_keys",
]

#: What ``lookup`` answers (TIER-1103).
Lookup = Literal["miss", "pending", "hit"]
LOOKUP_RESULTS: tuple[Lookup, ...] = ("miss", "pending", "hit")

#: A key's state in one tier: absent, pending (store prepared, not complete) or ready.
KeyState = Literal["absent", "pending", "ready"]

#: The policies chapter 11 specifies (TIER-1101: at least these two).
TIER_POLICIES: tuple[str, ...] = ("lru", "arc")


@dataclass(frozen=True, slots=True)
class StorePlan:
    """What ``prepare_store`` did (TIER-1104, TIER-1105, TIER-1107).

    ``keys`` are the keys it made pending, in the call's order; ``slots[i]`` is the slot reserved
    for ``keys[i]``; ``evicted`` the ready keys it evicted to free those slots, in eviction order.
    """

    keys: tuple[int, ...]
    slots: tuple[int, ...]
    evicted: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TierEvent:
    """Keys that became ready in a tier (``removed=False``) or left it (``removed=True``), TIER-1123."""

    keys: tuple[int, ...]
    removed: bool
    medium: str


def apply_tier_events(ready: Iterable[int], events: Iterable[TierEvent]) -> set[int]:
    """A consumer's view of one tier's ready keys: ``ready`` with ``events`` applied in order (TIER-1123)."""
    view = set(ready)
    for event in events:
        if event.removed:
            view.difference_update(event.keys)
        else:
            view.update(event.keys)
    return view


def as_tier_key(value: object, *, op: str, arg: str = "key") -> int:
    """``value`` as a key: a Python int or an integer scalar, never a bool (TIER-1102)."""
    if type(value) is int:
        return value
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidTypeError("TIER-1102", f"{op}: {arg} must be an integer key, got {type(value).__name__} {value!r}")
    return int(value.__index__())


def as_tier_keys(values: object, *, op: str, arg: str = "keys") -> list[int]:
    """``values`` as a list of keys: a list, tuple, range or 1-d array of integers (TIER-1102).

    A str, bytes, mapping, set (no order) or None is refused with InvalidTypeError naming TIER-1102,
    as is any item that is not an integer; nothing has been done when it is raised.
    """
    if type(values) is list and all(type(value) is int for value in values):
        return values  # the caller's own list: implementations read it and never change it
    items = as_list(values, op=op, arg=arg, rule="TIER-1102")
    return [as_tier_key(value, op=op, arg=f"{arg}[{index}]") for index, value in enumerate(items)]


@runtime_checkable
class TierStore(Protocol):
    """One tier below the device pool, as its scheduler drives it (chapter 11).

    Every call validates its arguments first (TIER-1102) and a refused call changes nothing
    (TIER-1108, TIER-1113, TIER-1115). ``request`` is any hashable naming the request a call serves.
    """

    capacity: int
    policy: str
    medium: str

    def lookup(self, key: int) -> Lookup:
        """``"miss"``, ``"pending"`` or ``"hit"``; not a use (TIER-1103)."""

    def prepare_store(self, keys: Iterable[int], *, request: Hashable) -> StorePlan | None:
        """Make the absent keys pending, evicting as needed; None if it cannot (TIER-1104..TIER-1108)."""

    def complete_store(self, keys: Iterable[int], *, request: Hashable, success: bool = True) -> None:
        """Make pending keys ready, or drop them when the store failed (TIER-1110, TIER-1111)."""

    def prepare_load(self, keys: Iterable[int], *, request: Hashable) -> list[int]:
        """Pin ready keys and return their slots (TIER-1112, TIER-1113)."""

    def complete_load(self, keys: Iterable[int], *, request: Hashable) -> None:
        """Unpin keys once each (TIER-1114, TIER-1115)."""

    def touch(self, keys: Iterable[int]) -> None:
        """Use the keys now, the first most recent (TIER-1117)."""

    def finish_request(self, request: Hashable) -> None:
        """The request's end: its keys' use reaches the policy (TIER-1116, TIER-1119)."""

    def take_events(self) -> list[TierEvent]:
        """The events since the last call (TIER-1123)."""

    def reset(self) -> None:
        """Make every key absent and every slot free (TIER-1124)."""

    def state(self, key: int) -> KeyState:
        """``"absent"``, ``"pending"`` or ``"ready"``."""

    def pins(self, key: int) -> int:
        """The loads prepared and not completed that read ``key`` (0 unless it is ready)."""

    def slot(self, key: int) -> int | None:
        """The slot of a pending or ready key; None for an absent one."""

    @property
    def num_free(self) -> int:
        """Slots holding no key (TIER-1106)."""
