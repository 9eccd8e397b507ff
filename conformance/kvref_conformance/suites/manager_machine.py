"""Chapter 07's differential machine: a scheduler drives the target's manager and the oracle's side by side.

Requests arrive with shared prefixes (and namespaces: cache salts and adapters), prefill in chunks,
decode one token at a time with speculative lookahead slots, get preempted under pressure (the last running request
first, as vLLM's FCFS scheduler does) and resume, finish; the cache is reset now and then. Every
call goes to the implementation and to :class:`~kvref.oracle.manager.RequestManager` over the
oracle pool, each with its own request objects, and their answers must agree: hits in tokens,
None or not, the number of blocks, which table positions are cached and under which hash, free
blocks, statistics, common prefixes and, where both report them, events. Block ids are the
implementation's own (POOL-115): they are never compared, only what they hold. A shadow KV store
records the token each computed slot of the implementation received, so a table that points a
request at a block holding other tokens fails in the step it happens.
"""

from __future__ import annotations

from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvref.contract.manager import FULL_ATTENTION, NULL_BLOCK, CacheGroup, KVCacheBlocks
from kvref.contract.requests import Request, RequestStatus
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager
from kvref_conformance.target import Target

__all__ = ["RequestSchedulerMachine"]

#: Three prompt families over a tiny alphabet: requests of one family share prefixes.
FAMILIES = tuple(tuple((f * 7 + i * i) % 5 + 10 * f for i in range(40)) for f in range(3))
#: A request's namespace, (adapter, cache salt): mostly none, else one name as a salt or as an
#: adapter, so that two namespaces spelled alike meet in the cache and must stay apart (HASH-205).
NAMESPACES = ((None, None), (None, None), (None, "tenant-b"), ("tenant-b", None))
#: Prompt lengths: mostly whole blocks (of 2 and of 4), so that whole prompts hit whole (REQ-701).
LENGTHS = st.sampled_from((1, 3, 4, 8, 12, 16, 20, 24))
#: The longest a request grows; ``max_model_len`` is below it, so that lookahead meets the cap (REQ-720).
LONGEST = 40
#: The tokens requests generate, apart from every prompt family's: 90, 91 and 92.
FIRST_OUTPUT_TOKEN = 90
OUTPUT_TOKENS = st.integers(FIRST_OUTPUT_TOKEN, FIRST_OUTPUT_TOKEN + 2)


class RequestSchedulerMachine(RuleBasedStateMachine):
    """A scheduler's calls on ``target``'s manager and on the oracle's; ``make`` builds the one under test."""

    target: Target
    last_block: str = "recompute"
    use_eagle: bool = False
    #: Full attention beside a sliding window of ``2 * block_size + 1`` tokens (REQ-730..REQ-734).
    hybrid: bool = False
    #: Full attention beside a mamba group (REQ-757..REQ-759); each ``schedule`` is one step.
    mamba: bool = False
    #: With ``hybrid``: each group in a pool of its own, of the base size and of half again (REQ-735).
    pools: bool = False

    def make(self, num_blocks: int, **settings: Any) -> Any:
        """The manager under test (the planted bugs of ``tests/meta`` override this)."""
        return self.target.create_manager(num_blocks, **settings)

    @initialize(block_size=st.sampled_from((2, 4)), num_blocks=st.sampled_from((6, 10, 16)))
    def create(self, block_size: int, num_blocks: int) -> None:
        self.events = self.target.has("events")
        settings: dict[str, Any] = {
            "block_size": block_size,
            "max_model_len": LONGEST - 2,
            "use_eagle": self.use_eagle,
            "enable_kv_cache_events": self.events,
            "last_block": self.last_block,
        }
        self.window: int | None = None
        if self.hybrid:
            self.window = 2 * block_size + 1
            settings["groups"] = (FULL_ATTENTION, CacheGroup.window(self.window))
            num_blocks *= 2
        elif self.mamba:
            self.window = 2  # a mamba group skips as a window of 2 tokens does (REQ-757)
            settings["groups"] = (FULL_ATTENTION, CacheGroup.mamba())
            num_blocks *= 2
        sizes = (num_blocks // 2, num_blocks // 2 + num_blocks // 4) if self.pools else None
        if sizes is not None:
            settings["pool_sizes"] = sizes
        self.impl = self.make(num_blocks, **settings)
        pools = [OracleBlockPool(n, enable_events=self.events) for n in sizes or (num_blocks,)]
        oracle_settings = {k: v for k, v in settings.items() if k != "pool_sizes"}
        self.oracle = RequestManager(pools if sizes else pools[0], **oracle_settings)
        note(f"manager = target.create_manager({num_blocks}, **{settings})")
        self.block_size = block_size
        self.pairs: dict[str, tuple[Request, Request]] = {}
        self.waiting: list[str] = []
        self.running: list[str] = []
        self.remote: list[str] = []  # admitted with their KV loading from a remote prefill (P/D)
        self.shadow: dict[tuple[int, int], dict[int, int]] = {}  # (pool, impl block) -> {slot: token written}
        self.serial = 0

    # ------------------------------------------------------------------ helpers

    def new_request(
        self, family: int, length: int, suffix: tuple[int, ...], namespace: tuple[str | None, str | None]
    ) -> str:
        self.serial += 1
        rid = f"r{self.serial}"
        tokens = list(FAMILIES[family][:length]) + list(suffix)
        adapter, salt = namespace
        made = [
            Request(rid, tokens, block_size=self.block_size, adapter=adapter, cache_salt=salt, algorithm="xxh3_64")
            for _ in "io"
        ]
        self.pairs[rid] = (made[0], made[1])
        self.waiting.append(rid)
        note(f"{rid} = Request({rid!r}, {tokens}, adapter={adapter!r}, cache_salt={salt!r})")
        return rid

    def write(self, rid: str, start: int, end: int) -> None:
        """The implementation's side computes tokens ``start..end`` of ``rid`` into its blocks."""
        req = self.pairs[rid][0]
        size = self.block_size
        for group, table in enumerate(self.impl.get_block_ids(rid)):
            for pos in range(start, end):
                if table[pos // size] != NULL_BLOCK:
                    self.shadow.setdefault(self.kv(group, table[pos // size]), {})[pos % size] = req.all_token_ids[pos]

    def kv(self, group: int, block: int) -> tuple[int, int]:
        """Where block ``block`` of group ``group`` keeps its KV: one store per pool (REQ-735)."""
        return (group if self.pools else 0, block)

    def allocate(self, rid: str, what: str, hits: tuple[Any, Any] = (None, None), **kwargs: Any) -> bool:
        """``allocate_slots`` on both sides, each with its own hits; they must agree on None and on the blocks taken."""
        got_i = self.impl.allocate_slots(self.pairs[rid][0], new_computed_blocks=hits[0], **kwargs)
        got_o: KVCacheBlocks | None = self.oracle.allocate_slots(
            self.pairs[rid][1], new_computed_blocks=hits[1], **kwargs
        )
        if got_i is None or got_o is None:
            assert got_i is None and got_o is None, (
                f"[REQ-709] {what}: the implementation returned {got_i}, the oracle {got_o}"
            )
            return False
        assert got_i.num_blocks == got_o.num_blocks, (
            f"[REQ-708] {what}: {got_i.num_blocks} new blocks, the oracle allocated {got_o.num_blocks}"
        )
        return True

    def preempt(self, rid: str) -> None:
        for manager, req in zip((self.impl, self.oracle), self.pairs[rid], strict=True):
            manager.preempt(req)
        self.running.remove(rid)
        self.waiting.insert(0, rid)  # vLLM puts a preempted request at the front of the queue
        note(f"preempt({rid})")

    # ------------------------------------------------------------------ steps

    @precondition(lambda self: len(self.waiting) < 3)
    @rule(
        family=st.integers(0, 2),
        length=LENGTHS,
        suffix=st.lists(OUTPUT_TOKENS, max_size=3).map(tuple),
        namespace=st.sampled_from(NAMESPACES),
    )
    def arrive(
        self, family: int, length: int, suffix: tuple[int, ...], namespace: tuple[str | None, str | None]
    ) -> None:
        self.new_request(family, length, suffix, namespace)

    def computed_blocks(self, rid: str) -> tuple[tuple[Any, Any], int]:
        """``get_computed_blocks`` on both sides, which must agree on the tokens hit: the hits to hand
        back to each side (None for none) and the tokens they cover."""
        ri, ro = self.pairs[rid]
        (hits_i, computed_i), (hits_o, computed_o) = (
            self.impl.get_computed_blocks(ri),
            self.oracle.get_computed_blocks(ro),
        )
        assert computed_i == computed_o, (
            f"[REQ-704] get_computed_blocks({rid}): {computed_i} tokens hit, the oracle finds {computed_o}"
        )
        return ((hits_i, hits_o) if computed_i else (None, None)), computed_i

    def admitted(self, rid: str, hits: int, computed: int, queue: list[str]) -> None:
        """What the scheduler does once a waiting request is admitted: count it, mark its tokens computed."""
        for manager, req in zip((self.impl, self.oracle), self.pairs[rid], strict=True):
            manager.record_prefix_cache_stats(req, hits)
            req.num_computed_tokens = computed
        self.waiting.remove(rid)
        queue.append(rid)

    def admit_one(self, rid: str, chunk: int, lookahead: int) -> bool:
        """A waiting request's first chunk: its computed blocks, then its slots; whether it was admitted."""
        ri, ro = self.pairs[rid]
        hits, computed = self.computed_blocks(rid)
        new = min(chunk, ri.num_tokens - computed)
        what = f"allocate_slots({rid}, {new}, {computed}, hits, num_lookahead_tokens={lookahead})"
        ok = self.allocate(
            rid,
            what,
            hits,
            num_new_tokens=new,
            num_new_computed_tokens=computed,
            num_lookahead_tokens=lookahead,
            full_sequence_must_fit=True,
        )
        note(f"admit({rid}, chunk={new}, lookahead={lookahead}) -> {'ok' if ok else 'None'}")
        if ok:
            self.admitted(rid, computed, computed + new, self.running)
            for req in (ri, ro):
                req.status = RequestStatus.RUNNING
            self.write(rid, computed, computed + new)
        return ok

    def advance(self, rid: str, chunk: int, token: int, lookahead: int, drafts: int) -> None:
        """A running request's next prefill chunk, or one decode token with ``drafts`` draft tokens
        scheduled beside it as vLLM's scheduler schedules speculative decoding (the drafts are not the
        request's tokens, and all are rejected); on None the last running is preempted."""
        ri, ro = self.pairs[rid]
        draft = 0
        if ri.num_computed_tokens == ri.num_tokens:
            if ri.num_tokens >= LONGEST - 3:
                return
            for req in (ri, ro):
                req.append_output_token_ids([token])
            new, draft = 1 + drafts, drafts
        else:
            new = min(chunk, ri.num_tokens - ri.num_computed_tokens)
        while True:
            what = f"allocate_slots({rid}, {new}, num_lookahead_tokens={lookahead}, num_draft_tokens={draft})"
            if self.allocate(rid, what, num_new_tokens=new, num_lookahead_tokens=lookahead, num_draft_tokens=draft):
                note(f"{what} -> ok")
                start = ri.num_computed_tokens
                for req in (ri, ro):
                    req.num_computed_tokens += new - draft  # the rejected drafts are not computed
                self.write(rid, start, start + new - draft)
                return
            victim = self.running[-1]
            self.preempt(victim)
            if victim == rid:
                return

    @rule(
        chunk=st.integers(1, 24),
        tokens=st.lists(OUTPUT_TOKENS, min_size=8, max_size=8),
        lookahead=st.integers(0, 3),
    )
    def schedule(self, chunk: int, tokens: list[int], lookahead: int) -> None:
        """One scheduler step: every running request advances, then waiting ones are admitted in order
        until one does not fit (vLLM's scan stops there). It starts as vLLM's does, with
        ``new_step_starts`` (REQ-759)."""
        self.impl.new_step_starts()
        self.oracle.new_step_starts()
        # Speculative decoding proposes up to as many drafts as it reserves lookahead slots for (vLLM
        # sets num_lookahead_tokens to the number of speculative tokens); how many: the step's last token.
        drafts = min(lookahead, tokens[-1] - 90)
        preempted = len(self.waiting)
        for i, rid in enumerate(list(self.running)):
            if rid in self.running:
                self.advance(rid, chunk, tokens[i % len(tokens)], lookahead, drafts)
        if len(self.waiting) > preempted:
            return  # vLLM admits nobody in a step that preempted
        for rid in list(self.waiting):
            if not self.admit_one(rid, chunk, lookahead):
                break

    @precondition(lambda self: any(self.pairs[r][0].num_preemptions == 0 for r in self.waiting))
    @rule(data=st.data())
    def admit_remote(self, data: st.DataObject) -> None:
        """Disaggregated prefill: a connector supplies all but the last prompt token; the blocks are
        allocated with caching delayed until the KV arrives (REQ-711), as vLLM's scheduler does."""
        fresh = [r for r in self.waiting if self.pairs[r][0].num_preemptions == 0]
        rid = data.draw(st.sampled_from(fresh), label="request")
        hits, computed = self.computed_blocks(rid)
        external = self.pairs[rid][0].num_tokens - computed - 1
        if external <= 0:
            return
        what = f"allocate_slots({rid}, 0, {computed}, hits, num_external_computed_tokens={external}, delayed)"
        ok = self.allocate(
            rid,
            what,
            hits,
            num_new_tokens=0,
            num_new_computed_tokens=computed,
            num_external_computed_tokens=external,
            delay_cache_blocks=True,
        )
        note(f"{what} -> {'ok' if ok else 'None'}")
        if ok:
            self.admitted(rid, computed, computed + external, self.remote)

    @precondition(lambda self: bool(self.remote))
    @rule(data=st.data())
    def remote_arrives(self, data: st.DataObject) -> None:
        """The remote KV has landed: cache what it filled (``cache_blocks``), and the request runs."""
        rid = data.draw(st.sampled_from(self.remote), label="request")
        ri, ro = self.pairs[rid]
        self.impl.cache_blocks(ri, ri.num_computed_tokens)
        self.oracle.cache_blocks(ro, ro.num_computed_tokens)
        self.write(rid, 0, ri.num_computed_tokens)
        for req in (ri, ro):
            req.status = RequestStatus.RUNNING
        self.remote.remove(rid)
        self.running.append(rid)
        note(f"cache_blocks({rid}, {ri.num_computed_tokens})")

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self.running), label="request")
        for manager, req in zip((self.impl, self.oracle), self.pairs[rid], strict=True):
            manager.free(req)
            req.status = RequestStatus.FINISHED
        self.running.remove(rid)
        note(f"free({rid})")

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def preempt_one(self, data: st.DataObject) -> None:
        self.preempt(data.draw(st.sampled_from(self.running), label="request"))

    @rule(really=st.integers(0, 5))
    def reset_prefix_cache(self, really: int) -> None:
        """Now and then (one draw in six), so that the cache lives long enough to be evicted from."""
        if really:
            return
        got, want = self.impl.reset_prefix_cache(), self.oracle.reset_prefix_cache()
        assert got == want, f"[REQ-715] reset_prefix_cache() returned {got}, the oracle {want}"
        note(f"reset_prefix_cache() -> {got}")

    @rule(family=st.integers(0, 2), length=LENGTHS, namespace=st.sampled_from(NAMESPACES))
    def probe(self, family: int, length: int, namespace: tuple[str | None, str | None]) -> None:
        """What the cache holds now: a fresh prompt's computed blocks on both sides (eviction order shows here)."""
        tokens = list(FAMILIES[family][:length])
        made = [
            Request(
                "probe",
                tokens,
                block_size=self.block_size,
                adapter=namespace[0],
                cache_salt=namespace[1],
                algorithm="xxh3_64",
            )
            for _ in "io"
        ]
        (hits_i, got), (_, want) = self.impl.get_computed_blocks(made[0]), self.oracle.get_computed_blocks(made[1])
        assert got == want, (
            f"[REQ-704] get_computed_blocks of family {family}'s first {length} tokens "
            f"(adapter, salt {namespace!r}): {got} "
            f"tokens hit, the oracle finds {want}: the two caches hold different blocks (eviction order, REQ-713)"
        )
        size = self.block_size
        for group, hits in enumerate(hits_i.blocks):  # every group's hit, the window's null blocks aside
            for i, block in enumerate(hits):
                if block == NULL_BLOCK and group:
                    continue
                held = tuple(self.shadow.get(self.kv(group, block), {}).get(k) for k in range(size))
                assert held == tuple(tokens[i * size : (i + 1) * size]), (
                    f"[REQ-704] hit {i} of family {family}'s prefix in group {group} is block {block}, "
                    f"which holds {held}"
                )

    # ------------------------------------------------------------------ after every step

    @invariant()
    def tables_agree(self) -> None:
        if not hasattr(self, "impl"):
            return
        assert self.impl.num_free_blocks == self.oracle.num_free_blocks, (
            f"[REQ-709] {self.impl.num_free_blocks} blocks available, the oracle has {self.oracle.num_free_blocks}"
        )
        size = self.block_size
        for rid in self.running + self.waiting + self.remote:
            ri = self.pairs[rid][0]
            tables = zip(self.impl.get_block_ids(rid), self.oracle.get_block_ids(rid), strict=True)
            for group, (ti, to) in enumerate(tables):
                assert len(ti) == len(to), (
                    f"[REQ-708] {rid} holds {len(ti)} blocks in group {group}, the oracle {len(to)}"
                )
                hi = [None if b == NULL_BLOCK else self.impl.block_hash(b, group=group) for b in ti]
                ho = [None if b == NULL_BLOCK else self.oracle.block_hash(b, group=group) for b in to]
                assert hi == ho, f"[REQ-710] {rid}'s cached keys by position in group {group}: {hi}, the oracle {ho}"
                nulls_i, nulls_o = [b == NULL_BLOCK for b in ti], [b == NULL_BLOCK for b in to]
                assert nulls_i == nulls_o, f"[REQ-730] {rid}'s null blocks in group {group}: {ti}, the oracle {to}"
                first = 0 if group == 0 or self.window is None else max(0, ri.num_computed_tokens - self.window + 1)
                for pos in range(first, ri.num_computed_tokens if rid not in self.remote else 0):
                    held = self.shadow.get(self.kv(group, ti[pos // size]), {}).get(pos % size)
                    assert held == ri.all_token_ids[pos], (
                        f"[REQ-721] {rid}'s token {pos} ({ri.all_token_ids[pos]}) is in block {ti[pos // size]} of "
                        f"group {group}, which holds {held} there: the table points at another request's KV"
                    )
        got, want = self.impl.make_prefix_cache_stats(), self.oracle.make_prefix_cache_stats()
        if got is not None:
            assert got == want, f"[REQ-716] make_prefix_cache_stats(): {got}, the oracle {want}"
        if self.events:
            got_events, want_events = self.impl.take_events(), self.oracle.take_events()
            assert got_events == want_events, f"[REQ-717] take_events(): {got_events}\nthe oracle: {want_events}"
        if len(self.running) >= 2 and self.target.has("manager-common-prefix"):
            got_common = self.impl.get_num_common_prefix_blocks(self.running)
            want_common = self.oracle.get_num_common_prefix_blocks(self.running)
            assert got_common == want_common, (
                f"[REQ-718] get_num_common_prefix_blocks({self.running}): {got_common}, the oracle {want_common}"
            )
        self.oracle.check_invariants()
        check = getattr(self.impl, "check_invariants", None)
        if check is not None:
            check()
