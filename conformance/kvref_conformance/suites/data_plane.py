"""Chapter 08, rule by rule: KV buffers, prefix copy, the request-to-token table, states, routing.

Every test builds kvref's data-plane classes on the target's tensor library (``data_tensors``)
and reads back through the host, so what is checked is what a kernel would read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvref.contract.errors import BlockIdError, ConfigError, InvalidValueError, KVRefError
from kvref.oracle.data import KVBuffers
from kvref_conformance.suites.base import ConformanceSuite, requires, rule
from kvref_conformance.suites.data_values import expected_routing, expected_row, first_mismatch
from kvref_conformance.target import Target

__all__ = ["DataPlaneSuite"]

LAYOUTS = [("token", "heads", 1), ("token", "flat", 1), ("paged", "heads", 4)]


def kv(impl: Target, layout: tuple[str, str, int] = LAYOUTS[0], **kwargs: Any) -> Any:
    name, row, block = layout
    options: dict[str, Any] = {"v_head_num": 1, "v_head_dim": 6, "dtype": "float32"} | kwargs
    return impl.data_plane().kv_buffers(16, 2, 2, 3, layout=name, row=row, block_size=block, **options)


def as_slots(buffers: KVBuffers, slots: list[int]) -> Any:
    """``slots`` as the buffers take them: a device array where they check on the device (DATA-815), else NumPy."""
    host = np.array(slots, dtype=np.int64)
    return buffers.tensors.index(host) if getattr(buffers, "device_checks", None) is not None else host


def write_tokens(buffers: KVBuffers, slots: list[int], tokens: list[int], positions: list[int]) -> None:
    """Write the derived rows of ``tokens`` at ``positions`` into ``slots``, every layer."""
    kh, kd = buffers.k_shape
    vh, vd = buffers.v_shape
    for layer in range(buffers.layer_num):
        k = np.stack(
            [
                expected_row(t, p, layer, kh, kd, buffers.dtype, value=False)
                for t, p in zip(tokens, positions, strict=True)
            ]
        )
        v = np.stack(
            [
                expected_row(t, p, layer, vh, vd, buffers.dtype, value=True)
                for t, p in zip(tokens, positions, strict=True)
            ]
        )
        buffers.set_kv(layer, as_slots(buffers, slots), k, v)


def check_tokens(buffers: KVBuffers, slots: list[int], tokens: list[int], positions: list[int], rule_id: str) -> None:
    """Every layer's K and V at ``slots`` hold the rows of ``tokens`` at ``positions``."""
    t = buffers.tensors
    for layer in range(buffers.layer_num):
        k, v = buffers.get_kv(layer, as_slots(buffers, slots))
        k, v = t.to_host(k), t.to_host(v)
        for i, (slot, token, position) in enumerate(zip(slots, tokens, positions, strict=True)):
            for name, seen, shape, value in (("K", k[i], buffers.k_shape, False), ("V", v[i], buffers.v_shape, True)):
                want = expected_row(token, position, layer, *shape, buffers.dtype, value=value)
                wrong = first_mismatch(seen, want)
                assert wrong is None, (
                    f"[{rule_id}] layer {layer} slot {slot} ({name} of token {token} at position {position}): {wrong}"
                )


def refused(call: Callable[[], Any], error: type[KVRefError], rule_id: str) -> None:
    with pytest.raises(error) as caught:
        call()
    assert caught.value.rule == rule_id, f"expected {rule_id}, got {caught.value.rule}: {caught.value}"


def snapshot(buffers: KVBuffers) -> list[np.ndarray]:
    return [buffers.tensors.to_host(b) for b in (*buffers.k_buffer, *buffers.v_buffer)]


def unchanged(buffers: KVBuffers, before: list[np.ndarray], what: str) -> None:
    for i, (a, b) in enumerate(zip(before, snapshot(buffers), strict=True)):
        assert np.array_equal(a, b), f"[ERR-501] {what} changed buffer {i}"


@requires("data-plane")
class DataPlaneSuite(ConformanceSuite):
    """Rules of chapter 08 on the target's tensor library."""

    @rule("DATA-818")
    @pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: f"{x[0]}-{x[1]}")
    def test_a_written_slot_sits_where_a_kernel_reading_the_buffer_finds_it(
        self, impl: Target, layout: tuple[str, str, int]
    ) -> None:
        buffers = kv(impl, layout)
        slots = [buffers.padding + 1, buffers.padding + 6, buffers.padding + 11]
        write_tokens(buffers, slots, [7, 8, 9], [0, 1, 2])
        kh, kd = buffers.k_shape
        vh, vd = buffers.v_shape
        for layer in range(buffers.layer_num):
            for name, raw, (heads, dim), value in (
                ("K", buffers.k_buffer[layer], (kh, kd), False),
                ("V", buffers.v_buffer[layer], (vh, vd), True),
            ):
                # Row s of the token layout and row s % block_size of block s // block_size of the paged
                # one are both row s of the buffer read flat.
                rows = buffers.tensors.to_host(raw).reshape(-1, heads, dim)
                for slot, token, position in zip(slots, [7, 8, 9], [0, 1, 2], strict=True):
                    want = expected_row(token, position, layer, heads, dim, buffers.dtype, value=value)
                    wrong = first_mismatch(rows[slot], want)
                    assert wrong is None, f"[DATA-818] layer {layer} {name}: slot {slot}'s row of the buffer: {wrong}"
                others = np.delete(rows, slots, axis=0)
                assert not others.any(), f"[DATA-818] layer {layer} {name}: rows other than {slots} were written"

    @rule("DATA-801", "DATA-803", "DATA-806")
    @pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: f"{x[0]}-{x[1]}")
    def test_k_and_v_keep_their_own_shapes_in_every_layout(self, impl: Target, layout: tuple[str, str, int]) -> None:
        buffers = kv(impl, layout)
        first = buffers.padding
        slots = list(range(first, first + 5))
        write_tokens(buffers, slots, [7, 8, 9, 10, 11], [0, 1, 2, 3, 4])
        check_tokens(buffers, slots, [7, 8, 9, 10, 11], [0, 1, 2, 3, 4], "DATA-801")
        k, v = buffers.get_kv(1, np.array(slots[:4]).reshape(2, 2))
        assert tuple(k.shape) == (2, 2, 2, 3) and tuple(v.shape) == (2, 2, 1, 6), (
            "[DATA-806] [*indices.shape, heads, dim]"
        )
        refused(lambda: kv(impl, ("paged", "heads", 5)), ConfigError, "DATA-801")

    @rule("DATA-803")
    def test_any_leading_batch_shape_is_accepted_and_a_wrong_shape_writes_nothing(self, impl: Target) -> None:
        buffers = kv(impl)
        batch = np.array([[1, 2, 3], [4, 5, 6]])
        k = np.ones((2, 3, 6), dtype=np.float32)  # trailing 6 = 2 heads x 3
        v = np.full((2, 3, 1, 6), 2.0, dtype=np.float32)
        buffers.set_kv(0, batch, k, v)
        got_k, got_v = buffers.get_kv(0, batch)
        assert float(buffers.tensors.to_host(got_k).sum()) == 36 and float(buffers.tensors.to_host(got_v).sum()) == 72
        before = snapshot(buffers)
        refused(lambda: buffers.set_kv(0, batch, np.ones((2, 3, 5)), v), InvalidValueError, "DATA-803")
        refused(lambda: buffers.set_kv(0, batch, k, np.ones((3, 2, 6))), InvalidValueError, "DATA-803")
        unchanged(buffers, before, "a set_kv of the wrong shape")

    @rule("DATA-802")
    def test_padding_absorbs_writes_and_is_never_read(self, impl: Target) -> None:
        buffers = kv(impl, LAYOUTS[2])  # padding is the whole block 0
        write_tokens(buffers, [4, 5], [1, 2], [0, 1])
        write_tokens(buffers, [0, 3, 6], [9, 9, 3], [7, 7, 2])  # two padded tokens, then a real one
        check_tokens(buffers, [4, 5, 6], [1, 2, 3], [0, 1, 2], "DATA-802")
        refused(lambda: buffers.get_kv(0, np.array([5, 0])), InvalidValueError, "DATA-802")
        refused(lambda: buffers.copy_kv([3], [8]), InvalidValueError, "DATA-802")

    @rule("DATA-804")
    def test_a_layer_or_slot_outside_the_buffers_writes_nothing(self, impl: Target) -> None:
        buffers = kv(impl)
        before = snapshot(buffers)
        k, v = np.ones((1, 2, 3)), np.ones((1, 1, 6))
        refused(lambda: buffers.set_kv(2, [1], k, v), BlockIdError, "DATA-804")
        refused(lambda: buffers.set_kv(0, [17], k, v), BlockIdError, "DATA-804")
        refused(lambda: buffers.get_kv(0, [-1]), BlockIdError, "DATA-804")
        unchanged(buffers, before, "a refused call")

    @rule("DATA-805")
    @pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "uint8", "bfloat16", "float8_e4m3fn"])
    def test_buffers_hold_the_dtype_given_or_refuse_it(self, impl: Target, dtype: str) -> None:
        tensors = impl.data_plane().tensors
        if not tensors.supports(dtype):
            assert dtype in ("bfloat16", "float8_e4m3fn"), f"[DATA-805] every library must hold {dtype}"
            refused(lambda: kv(impl, dtype=dtype), ConfigError, "DATA-805")
            return
        buffers = kv(impl, dtype=dtype)
        write_tokens(buffers, [1, 2, 3], [4, 5, 6], [0, 1, 2])
        check_tokens(buffers, [1, 2, 3], [4, 5, 6], [0, 1, 2], "DATA-805")
        assert str(buffers.k_buffer[0].dtype).endswith(dtype), f"[DATA-805] a buffer of {buffers.k_buffer[0].dtype}"

    @rule("DATA-806")
    def test_what_get_kv_returns_is_the_callers_own(self, impl: Target) -> None:
        buffers = kv(impl)
        write_tokens(buffers, [1], [5], [0])
        k, _ = buffers.get_kv(0, [1])
        k[...] = 99
        check_tokens(buffers, [1], [5], [0], "DATA-806")

    @rule("DATA-807")
    def test_one_write_of_a_usable_slot_twice_is_refused(self, impl: Target) -> None:
        buffers = kv(impl, checks="host")  # at once; checked on the device, check() raises it (DATA-816's suite)
        before = snapshot(buffers)
        refused(lambda: write_tokens(buffers, [3, 3], [1, 2], [0, 1]), InvalidValueError, "DATA-807")
        unchanged(buffers, before, "a set_kv writing one slot twice")
        write_tokens(buffers, [0, 0, 2], [1, 2, 3], [0, 1, 2])  # padding may repeat

    @rule("DATA-808")
    def test_mem_bytes_is_every_buffer(self, impl: Target) -> None:
        buffers = kv(impl, LAYOUTS[2], dtype="float16")
        per_slot = (2 * 3 + 1 * 6) * 2  # K and V elements, 2 bytes each
        assert buffers.mem_bytes() == 2 * (16 + 4) * per_slot, "[DATA-808] 2 layers of (16 + 4 padding) slots"

    @rule("DATA-809")
    @pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: f"{x[0]}-{x[1]}")
    def test_prefix_copy_copies_every_layer_and_refuses_what_it_cannot_do(
        self, impl: Target, layout: tuple[str, str, int]
    ) -> None:
        buffers = kv(impl, layout)
        p = buffers.padding
        src, dst = [p, p + 1, p + 2], [p + 8, p + 9, p + 10]
        write_tokens(buffers, src, [3, 4, 5], [0, 1, 2])
        buffers.copy_kv(src, dst)
        check_tokens(buffers, dst, [3, 4, 5], [0, 1, 2], "DATA-809")
        check_tokens(buffers, src, [3, 4, 5], [0, 1, 2], "DATA-809")
        before = snapshot(buffers)
        refused(lambda: buffers.copy_kv(src, dst[:2]), InvalidValueError, "DATA-809")
        refused(lambda: buffers.copy_kv(src[:2], [p + 11, p + 11]), InvalidValueError, "DATA-809")
        refused(lambda: buffers.copy_kv(src[:2], [p + 1, p + 12]), InvalidValueError, "DATA-809")
        unchanged(buffers, before, "a refused copy_kv")

    @rule("DATA-810", "DATA-811", "DATA-812", "DATA-813", "DATA-814")
    def test_the_request_to_token_table(self, impl: Target) -> None:
        table = impl.data_plane().req_to_token(3, 8)
        t = table.tensors
        rows = table.alloc(2)
        assert rows is not None and 0 not in rows and table.available_size() == 1, f"[DATA-810] {rows}"
        assert table.alloc(2) is None and table.available_size() == 1, "[DATA-810] no partial alloc"
        table.write(rows[0], 2, [5, 6, 7])
        assert t.to_host(table.read(rows[0], 0, 6)).tolist() == [0, 0, 5, 6, 7, 0], "[DATA-813] positions 2..4"
        refused(lambda: table.write(rows[0], 6, [1, 2, 3]), InvalidValueError, "DATA-813")
        refused(lambda: table.write(3 if 3 not in rows else 1, 0, [1]), InvalidValueError, "DATA-813")
        table.free(rows[0])
        refused(lambda: table.free(rows[0]), InvalidValueError, "DATA-812")
        refused(lambda: table.free(0), InvalidValueError, "DATA-812")
        again = table.alloc(1)
        assert again is not None
        assert t.to_host(table.read(again[0], 0, 8)).tolist() == [0] * 8, "[DATA-811] a stale row was handed out"
        table.write(again[0], 0, [4, 5])  # rows held with slots written in them when the table is cleared
        table.write(rows[1], 3, [6])
        table.clear()
        assert table.available_size() == 3, f"[DATA-814] {table.available_size()} of 3 rows free after clear"
        assert not t.to_host(table.req_to_token).any(), "[DATA-814] clear left slots written in the rows it freed"

    @rule("DATA-820", "DATA-821", "DATA-822", "DATA-823", "DATA-824")
    def test_the_recurrent_state_pool(self, impl: Target) -> None:
        pool = impl.data_plane().state_pool(2, 2, 3, 4, 5, 6, 4, dtype="float16", max_track_slots=1)
        t = pool.tensors
        assert tuple(pool.recurrent_state.shape) == (2, 4, 3, 5, 4), "[DATA-820] [layers, slots, heads, v, k]"
        assert str(pool.recurrent_state.dtype).endswith("float32") and tuple(pool.conv_state.shape) == (2, 4, 6, 3)
        track = pool.alloc_track_slot()
        assert track == 3 and pool.alloc_track_slot() is None, f"[DATA-821] track slots after request slots: {track}"
        pool.write_states(1, np.ones((2, 1, 3, 5, 4)), np.full((2, 1, 6, 3), 2.0))
        pool.copy_states([1], [track])
        r, c = pool.read_states(track)
        assert float(t.to_host(r).sum()) == 2 * 60 and float(t.to_host(c).sum()) == 2 * 2 * 18, "[DATA-823]"
        pool.reset_states([1])
        r, c = pool.read_states(1)
        assert not t.to_host(r).any() and not t.to_host(c).any(), "[DATA-822] reset must zero both states"
        assert float(t.to_host(pool.read_states(track)[0]).sum()) == 120, "[DATA-823] the copy is the track slot's own"
        refused(lambda: pool.copy_states([1], [0]), InvalidValueError, "DATA-823")
        pool.free_track_slot(track)
        refused(lambda: pool.free_track_slot(track), InvalidValueError, "DATA-821")
        layer_r, _ = pool.layer_state(1)
        layer_r[2] = 5.0
        assert float(t.to_host(pool.read_states(2)[0]).sum()) == 5.0 * 60, "[DATA-824] layer_state is a view"
        assert pool.mem_bytes() == 2 * 4 * 60 * 4 + 2 * 4 * 18 * 2, "[DATA-824] both states' bytes"

    @rule("DATA-830", "DATA-831", "DATA-832")
    def test_routing_per_block(self, impl: Target) -> None:
        store = impl.data_plane().routing(8, 4, 2, 3)
        tokens = [11, 12, 13, 14, 15, 16]
        blocks, offsets = [2, 2, 2, 2, 5, 5], [0, 1, 2, 3, 0, 1]
        routing = np.stack([expected_routing(tok, pos, 2, 3) for pos, tok in enumerate(tokens)])
        store.store_flat(routing, blocks, offsets)
        got = store.reconstruct([2, 5], 5)  # six tokens: the last has no forward pass yet
        assert got is not None, "[DATA-831] every position is stored"
        assert first_mismatch(store.tensors.to_host(got), routing[:5]) is None, "[DATA-831] routing of 5 tokens"
        assert store.reconstruct([2, 5], 7) is None, "[DATA-831] block 5 has no routing at offset 2: None, not partial"
        later = np.stack([expected_routing(99, 4, 2, 3)])
        store.store_flat(later, [5], [2])  # a later request extends block 5; block 2 keeps its routing
        got = store.reconstruct([2], 4)
        assert got is not None and first_mismatch(store.tensors.to_host(got), routing[:4]) is None, "[DATA-830]"
        store.forget([2])
        assert store.reconstruct([2, 5], 5) is None, "[DATA-832] a forgotten block's routing must not come back"
