"""Chapter 08 end to end: the pool (chapters 01, 03) and the data plane together, every value checked.

:class:`IntegrityMachine` admits requests whose prompts share prefixes: it matches their cached
blocks, checks that the hit blocks hold exactly the KV and routing their tokens were written with,
allocates the rest (dropping the reallocated blocks' routing), writes KV, the request-to-token
row, routing and recurrent states derived from (token, position, layer), and registers the full
blocks. Other steps read a request back through its row (KV, routing trimmed to ``n - 1`` tokens,
states), copy its partial last block into a fresh one (copy-on-write), copy its states into a
track slot, and finish it. A single wrong element fails naming the rule, the slot and the values.
The pool's block 0 (reserved, chapter 01) is the paged buffers' padding block.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, run_state_machine_as_test
from hypothesis.stateful import rule as step

from kvref.contract.hashing import hash_token_blocks
from kvref_conformance.suites.base import ConformanceSuite, first_policy, requires, rule
from kvref_conformance.suites.data_plane import as_slots, check_tokens, write_tokens
from kvref_conformance.suites.data_values import expected_routing, expected_states, first_mismatch
from kvref_conformance.target import Target

__all__ = ["DataIntegritySuite", "IntegrityMachine"]

B = 4  # tokens per block
BLOCKS = 12  # usable blocks; block 0 is the padding block
ROWS = 5
LAYERS, TOPK = 2, 2
PREFIXES = [[], [100, 101, 102, 103, 104, 105], [200, 201, 202, 203, 204, 205, 206, 207, 208]]


class IntegrityMachine(RuleBasedStateMachine):
    """Requests through the target's pool and data plane, beside what every value must be."""

    target: Target
    #: ``"device"``: the KV buffers check slots on the device and get them as device arrays (DATA-815).
    checks = "host"

    @initialize(dtype=st.sampled_from(["float32", "float16", "int8"]))
    def create(self, dtype: str) -> None:
        impl = self.target
        plane = impl.data_plane()
        self.pool = impl.create(BLOCKS + 1, policy=first_policy(impl))
        self.kv = plane.kv_buffers(
            BLOCKS * B,
            LAYERS,
            2,
            2,
            v_head_num=1,
            v_head_dim=3,
            dtype=dtype,
            layout="paged",
            block_size=B,
            checks=self.checks,
        )
        self.table = plane.req_to_token(ROWS, BLOCKS * B)
        self.routing = plane.routing(BLOCKS + 1, B, LAYERS, TOPK)
        self.states = plane.state_pool(ROWS, LAYERS, 1, 2, 2, 3, 3, dtype=dtype, max_track_slots=1)
        self.t = plane.tensors
        self.live: dict[int, tuple[int, list[int], list[int]]] = {}  # rid -> (row, prompt, blocks)
        self.next_rid = 1

    def _states_of(self, owner: int) -> tuple[np.ndarray, np.ndarray]:
        r_shape = tuple(self.states.recurrent_state[:, :1].shape)
        c_shape = tuple(self.states.conv_state[:, :1].shape)
        return expected_states(owner, r_shape, c_shape)

    def _check_states(self, slot: int, owner: int | None, rule_id: str) -> None:
        r, c = (self.t.to_host(x) for x in self.states.read_states(slot))
        want_r, want_c = self._states_of(owner) if owner is not None else (np.zeros_like(r), np.zeros_like(c))
        for name, seen, want in (("recurrent", r, want_r), ("conv", c, want_c)):
            wrong = first_mismatch(seen, want)
            assert wrong is None, f"[{rule_id}] {name} state of slot {slot} (request {owner}): {wrong}"

    def _check_routing(self, blocks: list[int], prompt: list[int], count: int, rule_id: str) -> None:
        got = self.routing.reconstruct(blocks, count)
        assert got is not None, f"[{rule_id}] routing of {count} tokens over blocks {blocks} is missing"
        rows = [expected_routing(tok, p, LAYERS, TOPK) for p, tok in enumerate(prompt[:count])]
        want = np.stack(rows) if rows else np.zeros((0, LAYERS, TOPK), dtype=np.int32)
        wrong = first_mismatch(self.t.to_host(got), want)
        assert wrong is None, f"[{rule_id}] routing over blocks {blocks}: {wrong}"

    @precondition(lambda self: len(self.live) < ROWS)
    @step(prefix=st.integers(0, len(PREFIXES) - 1), tail=st.lists(st.integers(0, 6), min_size=1, max_size=9))
    def admit(self, prefix: int, tail: list[int]) -> None:
        prompt = [*PREFIXES[prefix], *(300 + t for t in tail)]
        n = len(prompt)
        rid = self.next_rid
        self.next_rid += 1
        hashes = hash_token_blocks(prompt, B)
        hits = list(self.pool.match(hashes[: (n - 1) // B], holder=rid))
        # The hit blocks hold what their tokens were written with, and the routing they were computed with.
        slots = [b * B + i for b in hits for i in range(B)]
        check_tokens(self.kv, slots, prompt[: len(slots)], list(range(len(slots))), "DATA-809")
        if hits:
            self._check_routing(hits, prompt, len(slots), "DATA-830")
        need = -(-n // B) - len(hits)
        rows = self.table.alloc(1)
        if need > self.pool.num_available or rows is None:
            if hits:
                self.pool.free(hits[::-1], holder=rid)
            if rows:
                self.table.free(rows[0])
            return
        fresh = list(self.pool.allocate(need, holder=rid))
        self.routing.forget(fresh)  # handed out again: their former tokens' routing goes (DATA-832)
        assert self.routing.reconstruct(fresh, 1) is None, f"[DATA-832] reallocated block {fresh[0]} kept routing"
        blocks = hits + fresh
        every = [blocks[p // B] * B + p % B for p in range(n)]
        start = len(slots)
        write_tokens(self.kv, [0, *every[start:], 0], [7, *prompt[start:], 7], [0, *range(start, n), 0])  # padded ends
        row = rows[0]
        self.table.write(row, 0, every)
        routing = np.stack([expected_routing(tok, p, LAYERS, TOPK) for p, tok in enumerate(prompt)])[start:]
        self.routing.store_flat(routing, [blocks[p // B] for p in range(start, n)], [p % B for p in range(start, n)])
        full = n // B
        if full > len(hits):
            parent = hashes[len(hits) - 1] if hits else None
            self.pool.register(fresh[: full - len(hits)], hashes[len(hits) : full], parent_hash=parent)
        self.states.reset_states([row])
        self._check_states(row, None, "DATA-822")
        r, c = self._states_of(rid)
        self.states.write_states(row, r, c)
        self.live[rid] = (row, prompt, blocks)

    @precondition(lambda self: self.live)
    @step(data=st.data())
    def verify(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        row, prompt, blocks = self.live[rid]
        n = len(prompt)
        slots = self.t.to_host(self.table.read(row, 0, n)).tolist()
        want = [blocks[p // B] * B + p % B for p in range(n)]
        assert slots == want, f"[DATA-811] row {row} of request {rid} reads {slots}, it was written {want}"
        check_tokens(self.kv, slots, prompt, list(range(n)), "DATA-801")
        self._check_routing(blocks, prompt, n - 1, "DATA-831")
        self._check_states(row, rid, "DATA-823")

    @precondition(lambda self: self.live and self.pool.num_available > 0)
    @step(data=st.data())
    def copy_on_write(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        _, prompt, blocks = self.live[rid]
        n = len(prompt)
        used = n - (len(blocks) - 1) * B  # tokens in the last block
        (spare,) = self.pool.allocate(1, holder=-rid)
        src = [blocks[-1] * B + i for i in range(used)]
        dst = [spare * B + i for i in range(used)]
        self.kv.copy_kv(as_slots(self.kv, src), as_slots(self.kv, dst))
        positions = list(range(n - used, n))
        check_tokens(self.kv, dst, prompt[n - used :], positions, "DATA-809")
        check_tokens(self.kv, src, prompt[n - used :], positions, "DATA-809")
        self.pool.free([spare], holder=-rid)

    @precondition(lambda self: self.live)
    @step(data=st.data())
    def copy_to_track(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        row = self.live[rid][0]
        track = self.states.alloc_track_slot()
        assert track is not None and track > ROWS, f"[DATA-821] track slot {track}"
        self.states.copy_states([row], [track])
        self._check_states(track, rid, "DATA-823")
        self.states.free_track_slot(track)

    @precondition(lambda self: self.live)
    @step(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.live)))
        row, _, blocks = self.live.pop(rid)
        self.pool.free(blocks[::-1], holder=rid)
        self.table.free(row)


@requires("data-plane", "prefix-cache")
class DataIntegritySuite(ConformanceSuite):
    """The pool and the data plane together, every value checked (chapter 08 end to end)."""

    @rule("DATA-801", "DATA-802", "DATA-809", "DATA-811", "DATA-822", "DATA-823", "DATA-830", "DATA-831", "DATA-832")
    def test_every_hit_copy_row_routing_and_state_reads_back_what_was_written(self, impl: Target) -> None:
        machine: Any = type("IntegrityMachine", (IntegrityMachine,), {"target": impl})
        run_state_machine_as_test(machine)

    @requires("data-device-checks")
    @rule("DATA-815", "DATA-816")
    def test_the_same_with_every_kv_slot_on_the_device_and_checked_there(self, impl: Target) -> None:
        machine: Any = type("DeviceIntegrityMachine", (DeviceIntegrityMachine,), {"target": impl})
        run_state_machine_as_test(machine)


class DeviceIntegrityMachine(IntegrityMachine):
    """The integrity machine with the KV buffers' slots as device arrays, checked on the device:
    every call is good, so ``check()`` after each step must raise nothing (DATA-816)."""

    checks = "device"

    @invariant()
    def nothing_was_refused(self) -> None:
        if hasattr(self, "kv"):
            self.kv.check()
