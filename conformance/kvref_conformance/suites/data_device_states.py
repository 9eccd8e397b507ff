"""Chapter 08's device checks of the state pool (DATA-825), for any target with ``data-device-checks``.

A state pool made with ``checks="device"`` takes the slots of ``reset_states`` and ``copy_states``
as device arrays and never reads them back; a bad call touches only the reserved slot 0 and is
reported by ``check()``. Each test runs the same calls on a twin made with ``checks="host"`` and
compares every state of every usable slot.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvref.contract.errors import BlockIdError, InvalidValueError
from kvref_conformance.suites.base import ConformanceSuite, requires, rule
from kvref_conformance.suites.data_device import reported
from kvref_conformance.target import Target

__all__ = ["DataDeviceStatesSuite"]

MAX_REQS, TRACK = 4, 2
SLOTS = 1 + MAX_REQS + TRACK


def twins(impl: Target) -> tuple[Any, Any]:
    """State pools checking on the device and on the host, each slot's states distinct and nonzero."""
    plane = impl.data_plane()
    made = []
    for checks in ("device", "host"):
        pool = plane.state_pool(MAX_REQS, 2, 2, 3, 2, 4, 3, dtype="float32", max_track_slots=TRACK, checks=checks)
        for slot in range(1, SLOTS):
            recurrent, conv = pool.read_states(slot)
            pool.write_states(
                slot, np.full(tuple(recurrent.shape), slot, np.float32), np.full(tuple(conv.shape), -slot)
            )
        made.append(pool)
    return made[0], made[1]


def states_of(pool: Any) -> list[np.ndarray]:
    """Both states of every usable slot (slot 0 left out: it is reserved and may absorb a refused call)."""
    t = pool.tensors
    return [t.to_host(pool.recurrent_state)[:, 1:], t.to_host(pool.conv_state)[:, 1:]]


def device(pool: Any, slots: list[int]) -> Any:
    return pool.tensors.index(np.asarray(slots, dtype=np.int64))


def same_states(got: Any, want: Any, what: str) -> None:
    for name, a, b in zip(("recurrent", "conv"), states_of(got), states_of(want), strict=True):
        if not np.array_equal(a, b):
            slot = int(np.flatnonzero((a != b).reshape(a.shape[0], a.shape[1], -1).any(axis=(0, 2)))[0]) + 1
            raise AssertionError(f"[DATA-825] after {what}, slot {slot}'s {name} state differs from the host check's")


@requires("data-device-checks")
class DataDeviceStatesSuite(ConformanceSuite):
    """DATA-825 on the target's tensor library."""

    @rule("DATA-825", "DATA-822", "DATA-823")
    def test_device_slots_reset_and_copy_what_host_slots_do(self, impl: Target) -> None:
        mine, theirs = twins(impl)
        mine.reset_states(device(mine, [2, 6]))
        theirs.reset_states([2, 6])
        mine.copy_states(device(mine, [3, 1]), device(mine, [5, 4]))
        theirs.copy_states([3, 1], [5, 4])
        mine.check()
        same_states(mine, theirs, "reset_states([2, 6]) and copy_states([3, 1], [5, 4])")

    @rule("DATA-825", "DATA-821")
    def test_a_refused_reset_zeroes_no_usable_slot_and_later_calls_take_effect(self, impl: Target) -> None:
        mine, theirs = twins(impl)
        mine.reset_states(device(mine, [2, SLOTS]))  # one slot past the pool: the whole call is refused
        mine.reset_states(device(mine, [3]))  # call 1: accepted
        theirs.reset_states([3])
        same_states(mine, theirs, f"a refused reset_states([2, {SLOTS}]) and reset_states([3])")
        reported(mine, BlockIdError, "DATA-821", 0, f"reset_states([2, {SLOTS}])", rule_of="DATA-825")

    @rule("DATA-825", "DATA-823")
    @pytest.mark.parametrize("bad", ["dst 0", "src out of range"])
    def test_a_refused_copy_copies_nothing(self, impl: Target, bad: str) -> None:
        mine, theirs = twins(impl)
        src, dst = ([1, 2], [3, 0]) if bad == "dst 0" else ([1, -1], [3, 4])
        mine.copy_states(device(mine, src), device(mine, dst))
        same_states(mine, theirs, f"a refused copy_states({src}, {dst})")
        kind, rule_id = (InvalidValueError, "DATA-823") if bad == "dst 0" else (BlockIdError, "DATA-821")
        reported(mine, kind, rule_id, 0, f"copy_states({src}, {dst})", rule_of="DATA-825")

    @rule("DATA-825", "DATA-823")
    def test_counts_that_differ_are_refused_at_once(self, impl: Target) -> None:
        mine, _ = twins(impl)
        with pytest.raises(InvalidValueError) as info:
            mine.copy_states(device(mine, [1, 2]), device(mine, [3]))
        assert info.value.rule == "DATA-823", f"[DATA-825] 2 src for 1 dst: {info.value}"
