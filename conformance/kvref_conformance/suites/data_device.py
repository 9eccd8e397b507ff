"""Chapter 08's checks on the device (DATA-815..DATA-817), for any target with ``data-device-checks``.

KV buffers made with ``checks="device"`` take the slots of ``set_kv``, ``get_kv`` and ``copy_kv``
as device arrays and never read them back; a bad call writes only the padding slot and is
reported by ``check()``. Each test runs the same calls on a twin made with ``checks="host"`` and
compares every buffer, so what is checked is what a kernel would read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvref.contract.errors import BlockIdError, InvalidValueError, KVRefError
from kvref_conformance.suites.base import ConformanceSuite, requires, rule
from kvref_conformance.target import Target

__all__ = ["DataDeviceChecksSuite"]

LAYOUTS = [("token", "heads", 1), ("token", "flat", 1), ("paged", "heads", 4)]


def twins(impl: Target, layout: tuple[str, str, int]) -> tuple[Any, Any]:
    """KV buffers checking on the device, and the same checking on the host."""
    name, row, block = layout
    plane = impl.data_plane()

    def make(checks: str) -> Any:
        return plane.kv_buffers(
            16,
            2,
            2,
            3,
            v_head_num=1,
            v_head_dim=6,
            dtype="float32",
            layout=name,
            row=row,
            block_size=block,
            checks=checks,
        )

    return make("device"), make("host")


def device(buffers: Any, slots: list[int] | np.ndarray) -> Any:
    """``slots`` as an int64 array of the buffers' library on their device."""
    return buffers.tensors.index(np.asarray(slots, dtype=np.int64))


def rows(n: int, heads: int, dim: int, seed: int) -> np.ndarray:
    """``n`` distinct rows of values exact in float32."""
    return (np.arange(n * heads * dim, dtype=np.float32).reshape(n, heads, dim) + 1) * (seed + 1)


def buffers_of(kv: Any) -> list[np.ndarray]:
    return [kv.tensors.to_host(b) for b in (*kv.k_buffer, *kv.v_buffer)]


def usable_rows(kv: Any) -> list[np.ndarray]:
    """Every buffer as token rows, the padding slots left out (what a kernel may read)."""
    return [b.reshape(kv.slots, -1)[kv.padding :] for b in buffers_of(kv)]


def same_data(got: Any, want: Any, what: str, rule_id: str) -> None:
    for i, (a, b) in enumerate(zip(usable_rows(got), usable_rows(want), strict=True)):
        if not np.array_equal(a, b):
            slot = int(np.flatnonzero((a != b).any(axis=1))[0]) + got.padding
            raise AssertionError(
                f"[{rule_id}] after {what}, buffer {i} slot {slot} holds {a[slot - got.padding][:4]}...; checked on "
                f"the host it holds {b[slot - got.padding][:4]}..."
            )


def reported(kv: Any, kind: type[KVRefError], rule_id: str, call: int, what: str, *, rule_of: str = "DATA-816") -> None:
    """``check()`` of ``kv`` (any part with device checks) raises ``kind`` naming ``rule_id`` and call
    ``call``, once; a failure is reported under ``rule_of``."""
    seen: KVRefError | None = None
    try:
        kv.check()
    except KVRefError as exc:
        seen = exc
    assert isinstance(seen, kind) and seen.rule == rule_id, (
        f"[{rule_of}] check() after {what} raised {seen!r}; the host check raises {kind.__name__} {rule_id}"
    )
    assert getattr(seen, "call_index", None) == call, f"[{rule_of}] the report names {seen}; call {call} was refused"
    kv.check()  # once: a second check raises nothing


@requires("data-device-checks")
class DataDeviceChecksSuite(ConformanceSuite):
    """DATA-815..DATA-817 on the target's tensor library."""

    @rule("DATA-815")
    @pytest.mark.parametrize("layout", LAYOUTS, ids=["token", "flat", "paged"])
    def test_device_slots_write_read_and_copy_what_host_slots_do(self, impl: Target, layout: Any) -> None:
        mine, theirs = twins(impl, layout)
        p = mine.padding
        slots = np.array([[p + 3, 0], [p + 7, p + 1]])  # one padded token
        pairs: list[list[int]] = [[p + 10], [p + 1]]
        for layer in (0, 1):
            k, v = rows(4, 2, 3, layer).reshape(2, 2, 2, 3), rows(4, 1, 6, 9 + layer).reshape(2, 2, 6)
            mine.set_kv(layer, device(mine, slots), k, v)
            theirs.set_kv(layer, slots, k, v)
        mine.copy_kv(device(mine, [p + 3, p + 7]), device(mine, [p + 10, p + 11]))
        theirs.copy_kv([p + 3, p + 7], [p + 10, p + 11])
        mine.check()
        same_data(mine, theirs, "set_kv and copy_kv of device slots", "DATA-815")
        got = [mine.tensors.to_host(a) for a in mine.get_kv(1, device(mine, np.array(pairs)))]
        want = [theirs.tensors.to_host(a) for a in theirs.get_kv(1, pairs)]
        for name, a, b in zip("KV", got, want, strict=True):
            assert a.shape == b.shape and np.array_equal(a, b), (
                f"[DATA-815] get_kv of device slots gave {name} {a.ravel()[:4]}... of shape {a.shape}; the host "
                f"path {b.ravel()[:4]}... of shape {b.shape}"
            )

    @rule("DATA-816", "DATA-804", "DATA-807")
    @pytest.mark.parametrize(
        ("bad", "kind", "rule_id"),
        [
            ("out of range", BlockIdError, "DATA-804"),
            ("negative", BlockIdError, "DATA-804"),
            ("written twice", InvalidValueError, "DATA-807"),
        ],
    )
    @pytest.mark.parametrize("layout", LAYOUTS, ids=["token", "flat", "paged"])
    def test_a_refused_set_kv_writes_no_usable_slot_and_later_calls_take_effect(
        self, impl: Target, layout: Any, bad: str, kind: type[KVRefError], rule_id: str
    ) -> None:
        mine, theirs = twins(impl, layout)
        p = mine.padding
        entry = {"out of range": mine.slots, "negative": -1, "written twice": p + 2}[bad]
        k, v = rows(3, 2, 3, 1), rows(3, 1, 6, 2)
        mine.set_kv(0, device(mine, [p + 1, p + 2]), k[:2], v[:2])  # call 0
        mine.set_kv(0, device(mine, [p + 2, entry, p + 5]), k * 7, v * 7)  # call 1: refused
        mine.set_kv(1, device(mine, [p + 4]), k[:1], v[:1])  # call 2 takes effect
        theirs.set_kv(0, [p + 1, p + 2], k[:2], v[:2])
        theirs.set_kv(1, [p + 4], k[:1], v[:1])
        same_data(mine, theirs, f"a set_kv with a slot {bad}", "DATA-816")
        reported(mine, kind, rule_id, 1, f"a set_kv with a slot {bad}")

    @rule("DATA-817", "DATA-802")
    def test_a_refused_get_kv_returns_the_padding_slots_rows(self, impl: Target) -> None:
        mine, _ = twins(impl, LAYOUTS[0])
        k, v = rows(2, 2, 3, 3), rows(2, 1, 6, 4)
        mine.set_kv(0, device(mine, [0, 5]), k, v)  # the padded token's row lands in slot 0
        got_k, got_v = mine.get_kv(0, device(mine, [5, 0]))  # slot 0 as a source: refused
        padding_k = mine.tensors.to_host(mine.k_buffer[0])[0]
        for i in range(2):
            seen = mine.tensors.to_host(got_k)[i]
            assert np.array_equal(seen, padding_k), (
                f"[DATA-817] a refused get_kv returned {seen.ravel()[:4]}... at entry {i}; the padding slot holds "
                f"{padding_k.ravel()[:4]}..."
            )
        assert tuple(got_v.shape) == (2, 1, 6), f"[DATA-817] a refused get_kv returned V of shape {got_v.shape}"
        reported(mine, InvalidValueError, "DATA-802", 1, "a get_kv reading the padding slot")

    @rule("DATA-816", "DATA-809", "DATA-802")
    @pytest.mark.parametrize("bad", ["dst repeats", "dst is a src", "src is padding", "dst out of range"])
    def test_a_refused_copy_kv_copies_nothing(self, impl: Target, bad: str) -> None:
        mine, theirs = twins(impl, LAYOUTS[2])
        p = mine.padding
        k, v = rows(2, 2, 3, 5), rows(2, 1, 6, 6)
        for kv in (mine, theirs):
            kv.set_kv(0, [p, p + 1], k, v)
        src, dst = {
            "dst repeats": ([p, p + 1], [p + 8, p + 8]),
            "dst is a src": ([p, p + 1], [p + 1, p + 9]),
            "src is padding": ([0, p + 1], [p + 8, p + 9]),
            "dst out of range": ([p, p + 1], [p + 8, mine.slots]),
        }[bad]
        mine.copy_kv(device(mine, src), device(mine, dst))
        same_data(mine, theirs, f"a copy_kv whose {bad}", "DATA-816")
        kind = BlockIdError if bad == "dst out of range" else InvalidValueError
        rule_id = {"dst out of range": "DATA-804", "src is padding": "DATA-802"}.get(bad, "DATA-809")
        reported(mine, kind, rule_id, 0, f"a copy_kv whose {bad}")

    @rule("DATA-815", "DATA-816")
    def test_an_empty_call_of_device_slots_is_no_call(self, impl: Target) -> None:
        mine, theirs = twins(impl, LAYOUTS[0])
        none = device(mine, [])
        mine.set_kv(0, none, np.zeros((0, 2, 3)), np.zeros((0, 1, 6)))
        k, v = mine.get_kv(1, none)
        mine.copy_kv(none, none)
        assert tuple(k.shape) == (0, 2, 3) and tuple(v.shape) == (0, 1, 6), (
            f"[DATA-815] get_kv of no device slots gave shapes {tuple(k.shape)} and {tuple(v.shape)}"
        )
        mine.get_kv(0, device(mine, [0]))  # the first call that counts: refused
        reported(mine, InvalidValueError, "DATA-802", 0, "empty calls and then a get_kv of the padding slot")
        same_data(mine, theirs, "empty calls", "DATA-815")
