"""The machine's prefix-cache steps: a request's match, allocate, register and release; second copies;
reset; lookups that must be pure and honest (chapters 03-04).

The shadow store records what each block holds, so a hit that returns blocks not holding exactly
the requested tokens fails in the step it happens.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st
from hypothesis.stateful import rule

from kvref_conformance.machines.core import MachineCore, chain_hashes, chains_st, holders_st, outcome

__all__ = ["CacheSteps"]


class CacheSteps(MachineCore):
    """Steps through the prefix cache, each followed on the oracle."""

    @rule(holder=holders_st, chain=chains_st)
    def run_request(self, holder: object, chain: tuple[int, ...]) -> None:
        """Match, allocate the misses, write the KV, register: one scheduler step of a request."""
        self.tick()
        self.serve(holder, chain_hashes(chain), [chain[: i + 1] for i in range(len(chain))], f"chain {list(chain)}")

    def serve(self, holder: object, hashes: list[int], contents: Sequence[tuple[int, ...]], request: str) -> None:
        """One scheduler step of ``request`` (its blocks' ``hashes``, and ``contents``, what each of its
        blocks holds in the shadow store): match, allocate the misses, write them, register them."""
        for i, h in enumerate(hashes):
            self.parent_of[h] = hashes[i - 1] if i else None
        want = self.oracle.lookup(hashes)
        impl_out = outcome(lambda: self.call_match(hashes, holder))
        prefer = None
        if impl_out[0] == "ok":
            hit = impl_out[1]
            assert len(hit) == len(want), (
                f"[PFX-307] match of {request} hit {len(hit)} block(s), the spec hits {len(want)}"
            )
            for i, a in enumerate(hit):
                assert self.shadow.get(a) == contents[i] and a in self.i2o, (
                    f"[PFX-307] match of {request} returned block {a} at position {i}, which holds "
                    f"{self.shadow.get(a)}, not {contents[i]}: a stale or wrong prefix hit"
                )
            if self.exact and hit != want:
                raise AssertionError(f"[PFX-308] exact-order profile: match gave {hit}, the oracle {want}")
            prefer = self.rename(hit)
        kind, hit, hit_o = self.agree(
            f"match of {request}, holder={holder!r}",
            impl_out,
            outcome(lambda: self.oracle.match(hashes, holder=holder, prefer=prefer)),
        )
        if kind != "ok":
            return
        assert hit_o == prefer, (
            f"[PFX-307] match returned block(s) {hit} whose partners {prefer} are not the cached copies "
            f"of {hashes[: len(hit)]} the spec holds ({hit_o})"
        )
        self.refs[holder].extend(hit)
        if not self.arrays:  # the array forms keep the engine's own array (own_array)
            self.keep(hit, f"match of {request}, holder={holder!r}")
        need = len(hashes) - len(hit)
        if need > self.oracle.num_available:
            return
        kind, fresh, fresh_o = self.both(
            f"allocate({need}, holder={holder!r}) for the misses",
            lambda: self.call_allocate(need, holder),
            lambda: self.oracle.allocate(need, holder=holder),
        )
        if kind != "ok":
            return
        self.fresh(fresh, fresh_o, holder, f"allocate({need})")
        for i, a in enumerate(fresh, start=len(hit)):
            self.shadow[a] = contents[i]
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

    @rule(chain=chains_st, data=st.data())
    def match_batch(self, chain: tuple[int, ...], data: st.DataObject) -> None:
        """Several holders match in one ``match_many``, each a prefix of its own chain (often sharing a
        prefix with another's): each hit block gets one reference per holder (PFX-320), where a pin
        written as a scatter (``ref[ids] += 1``) gives it one in all, and each entry gets its own hits."""
        self.tick()
        holders = data.draw(st.lists(holders_st, min_size=2, max_size=3, unique=True))
        chains = [chain, *(data.draw(st.one_of(st.just(chain), chains_st)) for _ in holders[1:])]
        lists = [chain_hashes(c)[: data.draw(st.integers(1, len(c)))] for c in chains]
        self.match_together(chains, holders, lists)

    def match_together(
        self, chains: Sequence[tuple[int, ...]], holders: Sequence[object], lists: list[list[int]]
    ) -> None:
        """``match_many(lists, holders)`` on both sides, each list a prefix of its chain's hashes (PFX-320)."""
        what = f"match_many({lists}, holders={holders})"
        if any(h in self.paused and hl for h, hl in zip(holders, lists, strict=True)):
            self.both(
                what,
                lambda: self.impl.match_many(lists, holders=holders),
                lambda: self.oracle.match_many(lists, holders=holders),
            )
            return
        kind, got = outcome(lambda: self.impl.match_many(lists, holders=holders))
        assert kind == "ok", f"[PFX-320] {what} raised {got!r}; matching in order as match does succeeds"
        for hl, h, hit, chain in zip(lists, holders, got, chains, strict=True):
            want = self.oracle.lookup(hl)
            assert len(hit) == len(want), f"[PFX-320] {what}: holder {h!r} hit {len(hit)}, the spec hits {len(want)}"
            for i, a in enumerate(hit):
                assert self.shadow.get(a) == chain[: i + 1] and a in self.i2o, (
                    f"[PFX-307] {what} returned block {a} for prefix {list(chain[: i + 1])}, but it holds "
                    f"{self.shadow.get(a)}"
                )
            prefer = self.rename(hit)
            hit_o = self.oracle.match(hl, holder=h, prefer=prefer)
            assert hit_o == prefer, f"[PFX-307] {what}: holder {h!r} got {hit}, not the cached copies {hit_o}"
            self.refs[h].extend(hit)
            self.keep(hit, what)

    @rule(holder=holders_st)
    def reoffer_a_hit_for_registration(self, holder: object) -> None:
        """Offer a block the holder got from a hit for registration again under its own hash, as an engine
        that caches every full block of a request would: it carries a hash already (PFX-303)."""
        self.tick()
        hit = [a for a in self.refs[holder] if self.impl.block_hash(a) is not None]
        if not hit:
            return
        a = hit[-1]
        h = self.impl.block_hash(a)
        parent = self.parent_of.get(h)
        self.both(
            f"register([{a}], [{h}], parent_hash={parent}) of a block registered under {h} already",
            lambda: self.impl.register([a], [h], parent_hash=parent),
            lambda: self.oracle.register(self.rename([a]), [h], parent_hash=parent),
        )

    @rule()
    def reset(self) -> None:
        self.tick()
        self.both("reset()", self.impl.reset, self.oracle.reset)

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
