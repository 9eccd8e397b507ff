"""Stateful models: every step goes to the implementation and to the oracle, side by side.

:func:`make_machine` builds a Hypothesis ``RuleBasedStateMachine`` for one target and policy.
Block ids are implementation-defined, so the machine keeps a renaming: ids that allocate returns
on both sides are paired by position, and a prefix hit on the implementation is followed on the
oracle (its ``prefer`` hook), since which copy of a hash a lookup returns is the implementation's
choice (PFX-308). A target with the ``exact-order`` profile must return the oracle's very ids.

After every step it checks conservation, no id twice, reference count = holders, generations,
cached set and events (replaying the events gives the resident hashes), statistics, prefix
closure where the policy promises it, and the implementation's own ``check_invariants``. A shadow
KV store records what each block holds; every hit must return blocks holding exactly the
requested prefix, so a stale or wrong hit fails the step it happens in. Every assertion message
starts with the id of the rule it checks.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvref.contract.errors import KVRefError
from kvref.contract.events import apply_events
from kvref.contract.hashing import ROOT_HASH, hash_block
from kvref.contract.protocol import BlockState
from kvref.oracle import OracleBlockPool
from kvref_conformance.target import Target

__all__ = ["STEP_COUNTS", "make_machine"]

#: Steps run per machine name, and seconds spent, for the steps-per-second report.
STEP_COUNTS: Counter[str] = Counter()
STEP_SECONDS: dict[str, float] = {}

HOLDERS = ("a", "b", "c", None)
holders_st = st.sampled_from(HOLDERS)
# Short token chains over a tiny alphabet, so that requests share prefixes often.
chains_st = st.lists(st.integers(0, 2), min_size=1, max_size=5).map(tuple)

_HASHES: dict[tuple[int, ...], int] = {}


def chain_hash(prefix: tuple[int, ...]) -> int:
    """The hash of the block ending ``prefix`` (block size 1, chained from the root)."""
    h = _HASHES.get(prefix)
    if h is None:
        parent = ROOT_HASH if len(prefix) == 1 else chain_hash(prefix[:-1])
        h = hash_block(parent, [prefix[-1]], algorithm="xxh3_64")
        _HASHES[prefix] = h
    return h


def chain_hashes(chain: tuple[int, ...]) -> list[int]:
    """One hash per position of ``chain``."""
    return [chain_hash(chain[: i + 1]) for i in range(len(chain))]


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except KVRefError as exc:
        return "error", exc


class DifferentialMachine(RuleBasedStateMachine):
    """The machine; :func:`make_machine` binds ``target``, ``policy`` and ``num_blocks``."""

    target: Target
    policy: str = "lru"
    sizes: tuple[int, ...] = (3, 6, 10)
    name: str = "machine"
    use_cache: bool = True
    use_batches: bool = False

    def __init__(self) -> None:
        super().__init__()
        self.caching = self.use_cache and self.target.has("prefix-cache")
        self.events = self.caching and self.target.has("events")
        self.pausing = self.target.has("pause")
        self.batching = self.use_batches and self.target.has("batching")
        self.exact = self.target.profile == "exact-order"
        self.impl: Any = None
        self.oracle = OracleBlockPool(2)
        self.i2o: dict[int, int] = {}
        self.refs: dict[object, list[int]] = {h: [] for h in HOLDERS}  # impl ids per holder
        self.shadow: dict[int, tuple[int, ...] | None] = {}  # impl id -> content it holds
        self.parent_of: dict[int, int | None] = {}  # hash -> parent hash, from the chains used
        self.last_gen: dict[int, int] = {}
        self.view: set[int] = set()
        self.paused: set[object] = set()
        self.started = time.perf_counter()

    # ------------------------------------------------------------- helpers

    def both(self, what: str, on_impl: Any, on_oracle: Any) -> tuple[str, Any, Any]:
        """Run one operation on both sides; they must agree on success or on the error."""
        return self.agree(what, _outcome(on_impl), _outcome(on_oracle))

    @staticmethod
    def agree(what: str, impl_out: tuple[str, Any], oracle_out: tuple[str, Any]) -> tuple[str, Any, Any]:
        """Outcomes of one operation on both sides must agree on success or on the error class."""
        (kind_i, res_i), (kind_o, res_o) = impl_out, oracle_out
        if kind_o == "error" and kind_i == "ok":
            raise AssertionError(
                f"[{res_o.rule}] {what}: the implementation accepted a call the spec refuses "
                f"(oracle: {type(res_o).__name__}: {res_o}); it returned {res_i!r}"
            )
        if kind_i == "error" and kind_o == "ok":
            raise AssertionError(
                f"[{res_i.rule}] {what}: the implementation raised {type(res_i).__name__} ({res_i}) "
                f"where the spec succeeds (oracle returned {res_o!r})"
            )
        if kind_i == "error" and type(res_i) is not type(res_o):
            raise AssertionError(
                f"[{res_o.rule}] {what}: the implementation raised {type(res_i).__name__} ({res_i}), "
                f"the spec requires {type(res_o).__name__} ({res_o})"
            )
        return kind_i, res_i, res_o

    def fresh(self, got: list[int], want: list[int], holder: object, what: str) -> None:
        """Check blocks just allocated, pair them with the oracle's, and hand them to ``holder``."""
        held_anywhere = {a for refs in self.refs.values() for a in refs}
        assert len(got) == len(want) and len(set(got)) == len(got), (
            f"[POOL-104] {what} returned {got}: {len(want)} distinct blocks expected"
        )
        taken = set(got) & held_anywhere
        assert not taken, f"[POOL-104] {what} handed out block(s) {sorted(taken)} that are still held"
        reserved = set(got) & set(self.impl.reserved_ids)
        assert not reserved, f"[POOL-102] {what} handed out reserved block(s) {sorted(reserved)}"
        if self.exact and got != want:
            raise AssertionError(f"[POOL-115] {what}: exact-order profile: got {got}, the oracle gives {want}")
        for a, b in zip(got, want, strict=True):
            gen = self.impl.generation(a)
            before = self.last_gen.get(a)
            assert before is None or gen == before + 1, (
                f"[POOL-111] block {a}: generation {gen} after allocation, {before} before; must grow by 1"
            )
            if self.caching:
                assert self.impl.block_hash(a) is None, (
                    f"[PFX-312] {what} returned block {a} still registered under {self.impl.block_hash(a)}"
                )
            self.last_gen[a] = gen
            self.shadow[a] = None
            self.i2o[a] = b
        self.refs[holder].extend(got)

    def rename(self, ids: list[int]) -> list[int]:
        return [self.i2o[a] for a in ids]

    def tick(self) -> None:
        STEP_COUNTS[self.name] += 1

    # --------------------------------------------------------------- setup

    @initialize(data=st.data())
    def create(self, data: st.DataObject) -> None:
        size = data.draw(st.sampled_from(self.sizes), label="num_blocks")
        self.impl = self.target.create(size, policy=self.policy, paused_limit=2, enable_events=self.events)
        self.oracle = OracleBlockPool(size, policy=self.policy, paused_limit=2, enable_events=self.events)
        note(f"pool = target.create({size}, policy={self.policy!r}, paused_limit=2)")

    # --------------------------------------------------------------- rules

    @rule(holder=holders_st, count=st.integers(0, 7))
    def allocate(self, holder: object, count: int) -> None:
        self.tick()
        kind, got, want = self.both(
            f"allocate({count}, holder={holder!r})",
            lambda: self.impl.allocate(count, holder=holder),
            lambda: self.oracle.allocate(count, holder=holder),
        )
        if kind == "ok":
            self.fresh(got, want, holder, f"allocate({count})")

    @rule(holder=holders_st, data=st.data())
    def free_some(self, holder: object, data: st.DataObject) -> None:
        self.tick()
        refs = self.refs[holder]
        if not refs:
            return
        picked = data.draw(st.lists(st.sampled_from(range(len(refs))), unique=True, max_size=len(refs)))
        ids = [refs[i] for i in picked]
        kind, _, _ = self.both(
            f"free({ids}, holder={holder!r})",
            lambda: self.impl.free(ids, holder=holder),
            lambda: self.oracle.free(self.rename(ids), holder=holder),
        )
        assert kind == "ok", "the oracle refused a valid free"
        for i in sorted(picked, reverse=True):
            del refs[i]

    @rule(holder=holders_st, data=st.data())
    def share_twice_then_free_both_in_one_call(self, holder: object, data: st.DataObject) -> None:
        """A holder takes a second reference to one of its blocks and frees both in one call:
        a release written as a scatter (``ref[ids] -= 1``) drops only one (POOL-107)."""
        self.tick()
        refs = self.refs[holder]
        if not refs or holder in self.paused:
            return
        a = data.draw(st.sampled_from(refs))
        self.both(
            f"acquire([{a}], holder={holder!r})",
            lambda: self.impl.acquire([a], holder=holder),
            lambda: self.oracle.acquire([self.i2o[a]], holder=holder),
        )
        refs.append(a)
        ids = [b for b in refs if b == a]
        kind, _, _ = self.both(
            f"free({ids}, holder={holder!r})",
            lambda: self.impl.free(ids, holder=holder),
            lambda: self.oracle.free(self.rename(ids), holder=holder),
        )
        assert kind == "ok"
        self.refs[holder] = [b for b in refs if b != a]

    @rule(holder=holders_st, data=st.data())
    def bad_release(self, holder: object, data: st.DataObject) -> None:
        """Free what the holder does not hold: another's block, a free block, twice, or reserved."""
        self.tick()
        others = [a for h, refs in self.refs.items() if h != holder for a in refs if a not in self.refs[holder]]
        mine = self.refs[holder]
        choices: list[tuple[str, list[int]]] = [("reserved", list(self.impl.reserved_ids[:1]))]
        free_now = [b for b in range(self.impl.num_blocks) if self.impl.block_state(b) is BlockState.FREE]
        if free_now:
            choices.append(("a free block", [data.draw(st.sampled_from(free_now))]))
        if others:
            choices.append(("another holder's block", [data.draw(st.sampled_from(others))]))
        if mine:
            a = data.draw(st.sampled_from(mine))
            choices.append(("one reference too many", [a] * (mine.count(a) + 1)))
        label, ids = data.draw(st.sampled_from(choices))
        if not ids:
            return
        before = self.impl_view()
        if label == "a free block":  # free blocks carry no pairing: any free block of the oracle will do
            free_o = [b for b in range(self.oracle.num_blocks) if self.oracle.block_state(b) is BlockState.FREE]
            mapped = free_o[:1]
        else:
            mapped = [self.i2o.get(a, a) for a in ids]
        kind, _, _ = self.both(
            f"free({ids}, holder={holder!r}) [{label}]",
            lambda: self.impl.free(ids, holder=holder),
            lambda: self.oracle.free(mapped, holder=holder),
        )
        # agree() has already failed the step if only the oracle refused; both accepting would mean
        # the machine chose a valid release, a bug of the machine itself
        assert kind == "error", f"machine: the oracle accepted a release chosen to be invalid ({label})"
        assert self.impl_view() == before, f"[ERR-501] a refused free ({label}) changed the state"

    @rule(holder=holders_st, donor=holders_st, data=st.data())
    def share(self, holder: object, donor: object, data: st.DataObject) -> None:
        self.tick()
        refs = self.refs[donor]
        if not refs:
            return
        a = data.draw(st.sampled_from(refs))
        kind, _, _ = self.both(
            f"acquire([{a}], holder={holder!r})",
            lambda: self.impl.acquire([a], holder=holder),
            lambda: self.oracle.acquire([self.i2o[a]], holder=holder),
        )
        if kind == "ok":
            self.refs[holder].append(a)

    @rule(holder=holders_st, chain=chains_st)
    def run_request(self, holder: object, chain: tuple[int, ...]) -> None:
        """Match, allocate the misses, write the KV, register: one scheduler step of a request."""
        self.tick()
        hashes = chain_hashes(chain)
        for i, h in enumerate(hashes):
            self.parent_of[h] = hashes[i - 1] if i else None
        want = self.oracle.lookup(hashes)
        impl_out = _outcome(lambda: self.impl.match(hashes, holder=holder))
        prefer = None
        if impl_out[0] == "ok":
            hit = impl_out[1]
            assert len(hit) == len(want), (
                f"[PFX-307] match of chain {list(chain)} hit {len(hit)} block(s), the spec hits {len(want)}"
            )
            for i, a in enumerate(hit):
                assert self.shadow.get(a) == chain[: i + 1] and a in self.i2o, (
                    f"[PFX-307] match returned block {a} for prefix {list(chain[: i + 1])}, but it holds "
                    f"{self.shadow.get(a)}: a stale or wrong prefix hit"
                )
            if self.exact and hit != want:
                raise AssertionError(f"[PFX-308] exact-order profile: match gave {hit}, the oracle {want}")
            prefer = self.rename(hit)
        kind, hit, hit_o = self.agree(
            f"match({list(chain)}, holder={holder!r})",
            impl_out,
            _outcome(lambda: self.oracle.match(hashes, holder=holder, prefer=prefer)),
        )
        if kind != "ok":
            return
        assert hit_o == prefer, (
            f"[PFX-307] match returned block(s) {hit} whose partners {prefer} are not the cached copies "
            f"of {hashes[: len(hit)]} the spec holds ({hit_o})"
        )
        self.refs[holder].extend(hit)
        need = len(hashes) - len(hit)
        if need > self.oracle.num_available:
            return
        kind, fresh, fresh_o = self.both(
            f"allocate({need}, holder={holder!r}) for the misses",
            lambda: self.impl.allocate(need, holder=holder),
            lambda: self.oracle.allocate(need, holder=holder),
        )
        if kind != "ok":
            return
        self.fresh(fresh, fresh_o, holder, f"allocate({need})")
        for i, a in enumerate(fresh, start=len(hit)):
            self.shadow[a] = chain[: i + 1]
        parent = hashes[len(hit) - 1] if hit else None
        kind, _, _ = self.both(
            f"register({fresh}, {hashes[len(hit) :]}, parent_hash={parent})",
            lambda: self.impl.register(fresh, hashes[len(hit) :], parent_hash=parent),
            lambda: self.oracle.register(fresh_o, hashes[len(hit) :], parent_hash=parent),
        )
        assert kind == "ok", "the oracle refused a valid registration"

    @rule(holder=holders_st, chain=chains_st)
    def register_a_second_copy(self, holder: object, chain: tuple[int, ...]) -> None:
        """Compute a block a second time, as two requests in one step do: a second copy of a hash."""
        self.tick()
        hashes = chain_hashes(chain)
        resident = self.oracle.resident_hashes()
        parent = hashes[-2] if len(hashes) > 1 else None
        if hashes[-1] not in resident or (parent is not None and parent not in resident):
            return
        if self.oracle.num_free < 1:  # a free block, so that allocating it evicts nothing it relies on
            return
        kind, got, want = self.both(
            f"allocate(1, holder={holder!r}) for a second copy",
            lambda: self.impl.allocate(1, holder=holder),
            lambda: self.oracle.allocate(1, holder=holder),
        )
        if kind != "ok":
            return
        self.fresh(got, want, holder, "allocate(1)")
        self.shadow[got[0]] = chain
        kind, _, _ = self.both(
            f"register({got}, [{hashes[-1]}], parent_hash={parent}) as a second copy",
            lambda: self.impl.register(got, hashes[-1:], parent_hash=parent),
            lambda: self.oracle.register(want, hashes[-1:], parent_hash=parent),
        )
        assert kind == "ok", "the oracle refused a second copy"

    @rule(holder=holders_st)
    def release_all_tail_first(self, holder: object) -> None:
        self.tick()
        refs = self.refs[holder]
        kind, _, _ = self.both(
            f"free(all of {holder!r}, tail first)",
            lambda: self.impl.free(refs[::-1], holder=holder),
            lambda: self.oracle.free(self.rename(refs[::-1]), holder=holder),
        )
        assert kind == "ok"
        refs.clear()

    @rule()
    def reset(self) -> None:
        self.tick()
        self.both("reset()", self.impl.reset, self.oracle.reset)

    @rule(holder=holders_st)
    def toggle_pause(self, holder: object) -> None:
        self.tick()
        if holder in self.paused:
            self.both(f"resume({holder!r})", lambda: self.impl.resume(holder), lambda: self.oracle.resume(holder))
            self.paused.discard(holder)
        else:
            self.both(f"pause({holder!r})", lambda: self.impl.pause(holder), lambda: self.oracle.pause(holder))
            self.paused.add(holder)

    @rule(counts=st.lists(st.integers(0, 4), max_size=4), data=st.data())
    def allocate_batch(self, counts: list[int], data: st.DataObject) -> None:
        self.tick()
        holders = [data.draw(holders_st) for _ in counts]
        kind, got, want = self.both(
            f"allocate_many({counts}, holders={holders})",
            lambda: self.impl.allocate_many(counts, holders=holders),
            lambda: self.oracle.allocate_many(counts, holders=holders),
        )
        if kind != "ok":
            return
        assert [len(g) for g in got] == [len(w) for w in want], (
            f"[POOL-116] allocate_many admitted sizes {[len(g) for g in got]}, the spec admits {[len(w) for w in want]}"
        )
        flat = [a for g in got for a in g]
        assert len(set(flat)) == len(flat), f"[POOL-104] allocate_many handed out a block twice: {got}"
        for g, w, h in zip(got, want, holders, strict=False):
            self.fresh(g, w, h, "allocate_many")

    @rule(data=st.data())
    def free_batch(self, data: st.DataObject) -> None:
        """Free several holders' blocks in one call, a block shared by two of them included."""
        self.tick()
        entries = []
        for holder in data.draw(st.lists(holders_st, unique=True, max_size=3)):
            refs = self.refs[holder]
            if refs:
                picked = data.draw(st.lists(st.sampled_from(range(len(refs))), unique=True, max_size=len(refs)))
                entries.append((holder, picked))
        lists = [[self.refs[h][i] for i in picked] for h, picked in entries]
        holders = [h for h, _ in entries]
        kind, _, _ = self.both(
            f"free_many({lists}, holders={holders})",
            lambda: self.impl.free_many(lists, holders=holders),
            lambda: self.oracle.free_many([self.rename(x) for x in lists], holders=holders),
        )
        assert kind == "ok"
        for h, picked in entries:
            for i in sorted(picked, reverse=True):
                del self.refs[h][i]

    @rule(chain=chains_st)
    def lookup_is_pure_and_honest(self, chain: tuple[int, ...]) -> None:
        self.tick()
        hashes = chain_hashes(chain)
        before = self.impl_view()
        got = self.impl.lookup(hashes)
        assert self.impl_view() == before, "[PFX-321] lookup changed the state"
        assert len(got) == len(self.oracle.lookup(hashes)), (
            f"[PFX-307] lookup of {list(chain)} hit {len(got)}, the spec hits {len(self.oracle.lookup(hashes))}"
        )
        for i, a in enumerate(got):
            assert self.shadow.get(a) == chain[: i + 1], (
                f"[PFX-307] lookup returned block {a} holding {self.shadow.get(a)} for {list(chain[: i + 1])}"
            )

    # ---------------------------------------------------------- invariants

    def impl_view(self) -> tuple[Any, ...]:
        impl = self.impl
        blocks = tuple(
            (impl.ref_count(b), tuple(sorted(impl.holders(b).items(), key=repr)), impl.generation(b))
            for b in range(impl.num_blocks)
        )
        cache = (frozenset(impl.resident_hashes()), impl.num_cached, impl.stats) if self.caching else ()
        return blocks, impl.num_free, impl.num_in_use, cache

    @invariant()
    def counts_agree_and_are_conserved(self) -> None:
        if self.impl is None:
            return
        impl, oracle = self.impl, self.oracle
        cached = impl.num_cached if self.caching else 0
        assert impl.num_free + impl.num_in_use + cached == impl.num_usable, (
            f"[STATE-003] free {impl.num_free} + in use {impl.num_in_use} + cached {cached} != usable {impl.num_usable}"
        )
        got = (impl.num_free, impl.num_in_use, cached)
        want = (oracle.num_free, oracle.num_in_use, oracle.num_cached if self.caching else 0)
        assert got == want, f"[STATE-003] (free, in use, cached) = {got}, the spec has {want}"
        assert impl.num_available == oracle.num_available, (
            f"[POOL-106] num_available {impl.num_available}, the spec has {oracle.num_available}"
        )

    @invariant()
    def holders_match_the_references_handed_out(self) -> None:
        if self.impl is None:
            return
        model: dict[int, Counter[object]] = {}
        for holder, refs in self.refs.items():
            for a in refs:
                model.setdefault(a, Counter())[holder] += 1
        for b in range(self.impl.num_blocks):
            want = dict(model.get(b, {}))
            got = self.impl.holders(b)
            assert got == want, f"[STATE-002] block {b}: holders {got}, the references handed out are {want}"
            assert self.impl.ref_count(b) == sum(want.values()), (
                f"[STATE-002] block {b}: reference count {self.impl.ref_count(b)}, holders hold {sum(want.values())}"
            )
            state = self.impl.block_state(b)
            if want:
                assert state is BlockState.IN_USE, f"[STATE-001] block {b} is held but {state}"
                assert self.impl.generation(b) == self.last_gen[b], (
                    f"[POOL-111] held block {b}: generation {self.impl.generation(b)}, {self.last_gen[b]} "
                    "when it was allocated"
                )
                partner = self.i2o[b]
                assert self.oracle.ref_count(partner) == sum(want.values())

    @invariant()
    def cache_agrees_with_the_spec(self) -> None:
        if self.impl is None or not self.caching:
            return
        impl, oracle = self.impl, self.oracle
        resident = set(impl.resident_hashes())
        if oracle.policy.prefix_closed:
            for h in resident:
                parent = self.parent_of.get(h)
                assert parent is None or parent in resident, (
                    f"[EVICT-404] hash {h} is resident but its parent {parent} was evicted (lru-leaf)"
                )
        assert resident == set(oracle.resident_hashes()), (
            f"[EVICT-401] resident hashes differ from the spec's: extra {resident - oracle.resident_hashes()}, "
            f"missing {set(oracle.resident_hashes()) - resident} (policy {self.policy})"
        )
        for b in range(impl.num_blocks):
            state = impl.block_state(b)
            if state is BlockState.CACHED or state is BlockState.IN_USE:
                h = impl.block_hash(b)
                if h is not None:
                    assert h in resident, f"[STATE-006] block {b} is registered under {h} but it is not resident"
                    partner = self.i2o.get(b)
                    assert partner is not None and oracle.block_hash(partner) == h, (
                        f"[EVICT-401] block {b} still caches {h}; the spec evicted that copy (policy {self.policy})"
                    )
            if state is BlockState.CACHED:
                assert impl.block_hash(b) is not None, f"[STATE-004] cached block {b} has no hash"
        assert impl.stats == oracle.stats, f"[PFX-318] stats {impl.stats}, the spec counts {oracle.stats}"

    @invariant()
    def events_replay_to_the_resident_hashes(self) -> None:
        if self.impl is None or not (self.caching and self.events):
            return
        got, want = self.impl.take_events(), self.oracle.take_events()
        assert got == want, f"[PFX-317] events {got}, the spec emits {want}"
        self.view = apply_events(self.view, got)
        assert self.view == set(self.impl.resident_hashes()), "[PFX-316] replayed events disagree with the cache"

    @invariant()
    def paused_accounting_agrees(self) -> None:
        if self.impl is None or not self.pausing:
            return
        assert self.impl.paused_used == self.oracle.paused_used, (
            f"[POOL-113] paused_used {self.impl.paused_used}, the spec has {self.oracle.paused_used}"
        )
        assert self.impl.paused_excess == self.oracle.paused_excess, "[POOL-113] paused_excess differs"

    @invariant()
    def own_invariants_hold(self) -> None:
        check = getattr(self.impl, "check_invariants", None)
        if check is not None:
            check()

    def teardown(self) -> None:
        STEP_SECONDS[self.name] = STEP_SECONDS.get(self.name, 0.0) + time.perf_counter() - self.started


def make_machine(
    target: Target, policy: str, *, cache: bool = True, batches: bool = False
) -> type[DifferentialMachine]:
    """A machine class driving ``target`` under ``policy`` beside the oracle.

    ``cache=False`` leaves the prefix cache out (the pool alone); ``batches=True`` adds the
    batched forms to the steps.
    """
    kind = "batch" if batches else "cache" if cache else "pool"
    name = f"{target.name}:{kind}[{policy}]"
    attrs: dict[str, Any] = {
        "target": target,
        "policy": policy,
        "name": name,
        "use_cache": cache,
        "use_batches": batches,
    }
    # Rules of features left out are removed, not guarded: Hypothesis then never draws them.
    if not (cache and target.has("prefix-cache")):
        attrs.update(dict.fromkeys(CACHE_RULES))
    if not (batches and target.has("batching")):
        attrs.update(dict.fromkeys(BATCH_RULES))
    if not target.has("pause"):
        attrs["toggle_pause"] = None
    return type(f"Differential_{kind}_{policy.replace('-', '_')}", (DifferentialMachine,), attrs)


CACHE_RULES = ("run_request", "reset", "lookup_is_pure_and_honest", "register_a_second_copy")
BATCH_RULES = ("allocate_batch", "free_batch")
