"""Chapter 07's context duties (REQ-740..REQ-745): an engine's own request path over its block allocator.

For any target with ``context-duties`` (``create_context``: today Megatron-Core's
``DynamicInferenceContext`` run for real on its CPU stand-in, ``peers/megatron_context.py``).
Requests with shared prefixes arrive; each step admits from the queue's head as the engine does
(``check_availability``, then ``add_request``, one request prefilled in chunks at a time) and
ends with ``update_requests`` (finished requests released, full last blocks paused, paused
requests resumed or evicted). There is no oracle for an engine's own scheduling; after every step
the machine checks what must hold of any: the budgets, the accounting of every block, the
honesty of every hashed block a table names, and resumption into evictable blocks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvref.contract.pausing import budget_line
from kvref_conformance.suites.base import ConformanceSuite, requires
from kvref_conformance.suites.base import rule as rule_ids
from kvref_conformance.target import Target

__all__ = ["ContextDutiesSuite", "ContextMachine"]

FAMILIES = tuple(tuple((f * 7 + i * i) % 5 + 10 * f for i in range(32)) for f in range(3))
BLOCK = 4
GENERATE = 6  # output tokens before a request finishes by length


class ContextMachine(RuleBasedStateMachine):
    """Admissions and steps of the engine around ``target.create_context``; checks REQ-740..REQ-745."""

    target: Target
    policy: str = "lru"
    #: Which duties the invariant checks (a known failure of one must not hide the others).
    checks: frozenset[str] = frozenset({"budgets", "blocks", "resume"})
    #: Output tokens before a request finishes by length; 0: prefill only (scoring), which never pauses.
    generate: int = GENERATE

    @initialize(num_blocks=st.sampled_from((10, 14, 20)), paused=st.sampled_from((1, 3)))
    def create(self, num_blocks: int, paused: int) -> None:
        if not self.generate:  # prefill only: a smaller pool, so that the cache is evicted from often
            num_blocks = num_blocks // 2 + 1
        self.engine = self.target.create_context(
            block_size=BLOCK, num_blocks=num_blocks, paused_blocks=paused, policy=self.policy
        )
        note(
            f"engine = target.create_context(block_size={BLOCK}, num_blocks={num_blocks}, paused_blocks={paused}, "
            f"policy={self.policy!r})"
        )
        self.queue: list[Any] = []
        self.generated: Counter[int] = Counter()
        self.serial = 0
        self.seen: list[list[int]] = []  # prompts sent before: a repeat finds them cached
        self.chunks: dict[int, int] = {}  # requests prefilled in chunks of their own size

    def chunking(self) -> bool:
        """Whether a request is being prefilled in chunks."""
        return self.engine.chunked is not None

    def engine_call(self, what: str, call: Any) -> Any:
        try:
            return call()
        except Exception as exc:  # the engine's own failure on a valid sequence
            raise AssertionError(
                f"[REQ-743] {what} raised {type(exc).__name__}: {str(exc).splitlines()[0][:300]}; a valid "
                "sequence (admitted through check_availability) must never fail inside the manager"
            ) from exc

    @precondition(lambda self: len(self.queue) < 3)
    @rule(family=st.integers(0, 2), length=st.sampled_from((3, 4, 8, 9, 12, 16, 20)))
    def arrive(self, family: int, length: int) -> None:
        self.serial += 1
        tokens = list(FAMILIES[family][:length])
        self.seen.append(tokens)
        self.queue.append(self.engine.make_request(self.serial, tokens, output_tokens=max(self.generate, 1)))
        note(f"request {self.serial}: {tokens}")

    @precondition(lambda self: bool(self.seen) and len(self.queue) < 3)
    @rule(data=st.data())
    def repeat(self, data: st.DataObject) -> None:
        """A prompt sent before, sent again (a chat's system prompt): its blocks may all be cached; half the
        time it is prefilled in chunks of a block and a token, so that a chunk ends inside a matched block."""
        tokens = data.draw(st.sampled_from(self.seen), label="prompt")
        self.serial += 1
        self.queue.append(self.engine.make_request(self.serial, tokens, output_tokens=max(self.generate, 1)))
        if data.draw(st.booleans(), label="in chunks"):
            self.chunks[self.serial] = BLOCK + 1
        note(f"request {self.serial}: {tokens} again, chunks of {self.chunks.get(self.serial)}")

    @rule(chunk=st.sampled_from((None, 3, 5, 8)), data=st.data())
    def step(self, chunk: int | None, data: st.DataObject) -> None:
        """Admit from the head of the queue (a chunked prefill continues first), then one step."""
        engine = self.engine
        if engine.chunked is not None:
            request = engine.chunked
            size = self.chunks.get(request.request_id, chunk)
            self.engine_call(f"add_request({request.request_id}, chunk={size})", lambda: engine.admit(request, size))
        else:
            while self.queue:
                request = self.queue[0]
                size = self.chunks.get(request.request_id, chunk)
                admitted = self.engine_call(
                    f"admit({request.request_id}, chunk={size})", lambda r=request, n=size: engine.admit(r, n)
                )
                if not admitted:
                    break
                self.queue.pop(0)
                note(f"admitted {request.request_id} (chunk {size})")
                if self.chunking():  # one request prefilled in chunks at a time
                    break
        running = [rid for rid, (kind, _) in engine.rows().items() if kind == "active"]
        finished = {rid for rid in running if self.generated[rid] >= self.generate}
        finished |= set(data.draw(st.sets(st.sampled_from(running)), label="finished") if running else set())
        if engine.chunked is not None:
            finished.discard(engine.chunked.request_id)
        self.engine_call(f"update_requests(finished={sorted(finished)})", lambda: engine.step(finished))
        for rid in running:
            self.generated[rid] += 1
        note(f"step: finished {sorted(finished)} -> rows {engine.rows()}")

    # ------------------------------------------------------------------ after every step

    @invariant()
    def duties(self) -> None:
        if not hasattr(self, "engine"):
            return
        engine, a = self.engine, self.engine.allocator
        rows = engine.rows()
        named: Counter[int] = Counter(b for _, ids in rows.values() for b in ids)
        active = {b for kind, ids in rows.values() if kind != "paused" for b in ids}
        paused = {b for kind, ids in rows.values() if kind == "paused" for b in ids}
        assert "budgets" not in self.checks or (a.get_active_used(), a.get_paused_used()) == (
            len(active),
            len(paused),
        ), (
            f"[REQ-740] active_used {a.get_active_used()} / paused_used {a.get_paused_used()}, but the active "
            f"requests (the chunked one included) hold {len(active)} distinct blocks and the paused {len(paused)}: "
            f"rows {rows}"
        )
        used = (a.get_total_used(), a.total_count - 1, a.get_active_used(), a.get_paused_used(), a.paused_count)
        assert str(a) == budget_line(*used), (  # the line, from the engine's own counts (REQ-740 checks them)
            f"[REQ-746] the engine prints {str(a)!r}; kvref's line of the same counts is {budget_line(*used)!r}"
        )
        hashes = a.block_hashes.tolist()
        cached = [b for b in range(a.total_count - 1) if a.block_ref_counts[b] == 0 and hashes[b] != -1]
        reachable = a.total_avail + (len(cached) if self.policy == "lru" else 0)
        if "blocks" in self.checks:
            self.blocks_accounted_for(rows, named, cached, reachable)
        if "resume" in self.checks:
            self.resumed_when_it_fits(rows, reachable)

    def blocks_accounted_for(
        self, rows: dict[int, tuple[str, list[int]]], named: Counter[int], cached: list[int], reachable: int
    ) -> None:
        engine, a = self.engine, self.engine.allocator
        refs = a.block_ref_counts.tolist()
        hashes = a.block_hashes.tolist()
        free = a.block_bag[: a.total_avail].tolist()
        usable = range(a.total_count - 1)  # the last block is Megatron's dummy
        for b in usable:
            assert refs[b] == named[b], (
                f"[REQ-741] block {b} has {refs[b]} references; the request tables name it {named[b]} times: {rows}"
            )
        assert len(set(free)) == len(free) and not (set(free) & (set(named) | set(cached))), (
            f"[REQ-741] the free stack {free} repeats a block or holds one in use or cached"
        )
        assert len(free) + len(named) + len(cached) == a.total_count - 1, (
            f"[REQ-741] {len(free)} free + {len(named)} in use + {len(cached)} cached != {a.total_count - 1} blocks"
        )
        assert a.is_memory_available(reachable) and not a.is_memory_available(reachable + 1), (
            f"[REQ-744] is_memory_available must hold for exactly {reachable} blocks (free and evictable)"
        )
        for rid, (_, ids) in rows.items():
            own = engine.registered_hashes(rid)
            for i, b in enumerate(ids):
                if hashes[b] != -1 and (i >= len(own) or hashes[b] != own[i]):
                    raise AssertionError(
                        f"[REQ-745] request {rid}'s block {i} is block {b}, registered under {hashes[b]}; the "
                        f"request's hash there is {own[i] if i < len(own) else 'none'}: it holds another's KV"
                    )

    def resumed_when_it_fits(self, rows: dict[int, tuple[str, list[int]]], reachable: int) -> None:
        """The next paused request to resume (last in, first out) that fit after the previous step too
        must not still be paused: a step of delay is the engine's business, staying paused is not."""
        c, a = self.engine.context, self.engine.allocator
        fitting = getattr(self, "fitting", None)
        self.fitting: int | None = None
        if not c.paused_request_count:
            return
        row = c.paused_request_count - 1
        rid, need = int(c.request_ids[row]), int(c.request_kv_block_counts[row]) + 1
        active_rows = c.total_request_count - c.paused_request_count
        if not (need <= a.get_active_avail() and reachable >= 1 and active_rows < c.max_requests):
            return
        if fitting == rid:
            raise AssertionError(
                f"[REQ-742] request {rid} stays paused a second step though its next block fits: active budget "
                f"left {a.get_active_avail()} for {need} blocks, {a.total_avail} free and {reachable - a.total_avail} "
                "evictable blocks"
            )
        self.fitting = rid


def run(impl: Target, policy: str, checks: set[str], generate: int = GENERATE) -> None:
    settings = {"target": impl, "policy": policy, "checks": frozenset(checks), "generate": generate}
    run_state_machine_as_test(type("ContextTraffic", (ContextMachine,), settings))


class ContextDutiesSuite(ConformanceSuite):
    """REQ-740..REQ-745 on the target's own request path (``create_context``), one duty per test."""

    @rule_ids("REQ-740")
    @requires("context-duties")
    @pytest.mark.parametrize("policy", ["lru", "ref-zero"])
    def test_the_budgets_count_every_block_a_request_holds(self, impl: Target, policy: str) -> None:
        run(impl, policy, {"budgets"})

    @rule_ids("REQ-741", "REQ-743", "REQ-744", "REQ-745", "REQ-746")
    @requires("context-duties")
    def test_every_block_is_accounted_for_and_every_hit_is_honest(self, impl: Target) -> None:
        """With decode, pauses and resumptions: under ref-zero (lru's pauses meet REQ-742's scenario below)."""
        run(impl, "ref-zero", {"blocks"})

    @rule_ids("REQ-741", "REQ-743", "REQ-744")
    @requires("context-duties")
    def test_prefill_only_traffic_in_chunks_keeps_every_block_accounted_for(self, impl: Target) -> None:
        """Under ref-zero; lru's chunked re-registration is the deterministic scenario below."""
        run(impl, "ref-zero", {"blocks"}, generate=0)

    @rule_ids("REQ-741", "REQ-743")
    @requires("context-duties")
    @pytest.mark.parametrize("policy", ["lru", "ref-zero"])
    def test_a_chunk_ending_inside_a_matched_block_leaves_the_cache_evictable(self, impl: Target, policy: str) -> None:
        """A cached 2-block prompt is sent again in chunks of 5 tokens: the first chunk ends inside its
        matched second block. Afterwards every cached block must still be evictable when space is short."""
        engine = impl.create_context(block_size=BLOCK, num_blocks=6, paused_blocks=1, policy=policy)
        prompt = list(FAMILIES[0][: 2 * BLOCK])
        other = list(FAMILIES[1][:9])

        def admit(rid: int, tokens: list[int], chunk: int | None = None) -> None:
            assert engine.admit(engine.make_request(rid, tokens), chunk), f"request {rid} must be admitted"

        steps: list[tuple[str, Callable[[], Any]]] = [
            ("admit the 2-block prompt", lambda: admit(1, prompt)),
            ("finish it: its 2 blocks stay cached", lambda: engine.step({1})),
            ("send it again, a chunk of 5 tokens", lambda: admit(2, prompt, 5)),
            ("step", lambda: engine.step(set())),
            ("its last 3 tokens", lambda: engine.admit(engine.chunked, 5)),
            ("finish it", lambda: engine.step({2})),
            ("admit a 3-block prompt (the free blocks)", lambda: admit(3, other)),
            ("a 1-block prompt (evicts the cached leaf)", lambda: admit(4, prompt[:3])),
            ("another (evicts its parent)", lambda: admit(5, prompt[:3])),
        ]
        for what, step in steps:
            try:
                step()
            except Exception as exc:
                raise AssertionError(
                    f"[REQ-743] {what}: the engine raised {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                ) from exc

    @rule_ids("REQ-742", "REQ-743")
    @requires("context-duties")
    def test_a_paused_request_resumes_when_its_next_block_fits(self, impl: Target) -> None:
        run(impl, "ref-zero", {"resume"})

    @rule_ids("REQ-742", "REQ-743")
    @requires("context-duties")
    @pytest.mark.parametrize("policy", ["lru", "ref-zero"])
    def test_a_paused_request_resumes_into_an_evictable_block(self, impl: Target, policy: str) -> None:
        """7 usable blocks: one request's block is cached, two 3-block prompts take the other 6; both fill
        their last block and pause. One of them must resume, into the cached block if need be."""
        engine = impl.create_context(block_size=BLOCK, num_blocks=8, paused_blocks=1, policy=policy)
        short = engine.make_request(1, [90, 91, 92, 93])
        assert engine.admit(short), "a one-block prompt must fit in 7 blocks"
        engine.step({1})  # finished: under lru its hashed block stays cached and evictable
        for rid, base in ((2, 100), (3, 200)):
            request = engine.make_request(rid, [base + i for i in range(3 * BLOCK)])
            assert engine.admit(request), f"request {rid}: 3 blocks must fit in the 6 free or evictable ones"
        try:
            engine.step(set())
        except Exception as exc:
            raise AssertionError(
                f"[REQ-743] update_requests raised {type(exc).__name__}: {str(exc).splitlines()[0][:200]}; both "
                "requests paused with their last block full, and the step must not fail"
            ) from exc
        kinds = sorted(kind for kind, _ in engine.rows().values())
        assert "active" in kinds, (
            f"[REQ-742] after the step the requests are {kinds}: one must resume, its next block coming from the "
            f"free blocks ({engine.allocator.total_avail}) or the evictable ones "
            f"({int(engine.allocator.get_evictable_block_count())})"
        )

    @rule_ids("REQ-705")
    @requires("context-duties")
    def test_a_prompt_of_whole_cached_blocks_shares_every_block(self, impl: Target) -> None:
        """Megatron-Core's choice (REQ-705): all ``k`` blocks shared, only the last token recomputed."""
        engine = impl.create_context(block_size=BLOCK, num_blocks=12, paused_blocks=2, policy="ref-zero")
        tokens = list(FAMILIES[0][: 2 * BLOCK])
        first, second = engine.make_request(1, tokens), engine.make_request(2, tokens)
        assert engine.admit(first) and engine.admit(second), "two 2-block prompts must fit in 11 blocks"
        rows = engine.rows()
        assert rows[2][1][:2] == rows[1][1][:2], (
            f"[REQ-705] the second copy of a 2-block prompt must share both blocks of the first: rows {rows}"
        )
