"""The machine's core: side-by-side calls, the id renaming, the shadow store, the pool's creation.

:class:`MachineCore` holds what every step and observation of the differential machine shares:
the implementation and the oracle, the renaming of block ids between them (ids are the
implementation's choice, PFX-308), the references each holder was handed, the shadow KV store
(what each block holds) and the checks of freshly allocated blocks.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize

from kvref.contract.errors import KVRefError
from kvref.contract.hashing import ROOT_HASH, hash_block
from kvref.oracle import OracleBlockPool
from kvref_conformance.target import Target

__all__ = [
    "HOLDERS",
    "STEP_COUNTS",
    "STEP_SECONDS",
    "MachineCore",
    "chain_hash",
    "chain_hashes",
    "chains_st",
    "holders_st",
    "outcome",
]

#: Steps run per machine name, and seconds spent, for the steps-per-second report.
STEP_COUNTS: Counter[str] = Counter()
STEP_SECONDS: dict[str, float] = {}

HOLDERS = ("a", "b", "c", None)
holders_st = st.sampled_from(HOLDERS)
# Short token chains over a tiny alphabet, so that requests share prefixes often.
chains_st = st.lists(st.integers(0, 2), min_size=1, max_size=5).map(tuple)

_HASHES: dict[tuple[int, ...], int] = {}
_KEPT = 8  # returned lists watched at once (POOL-123)
#: Blocks the per-block observations check after each step in a pool larger than this.
VIEW_WINDOW = 256


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


def outcome(call: Any) -> tuple[str, Any]:
    """``("ok", result)`` of ``call()``, or ``("error", exc)`` for a KVRefError it raised."""
    try:
        return "ok", call()
    except KVRefError as exc:
        return "error", exc


class MachineCore(RuleBasedStateMachine):
    """The state both sides share; :func:`kvref_conformance.machines.make_machine` binds ``target``, ``policy``."""

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
        #: Whether the calls go through their array forms (``allocate_ids`` and kin), where the target has them.
        self.arrays = self.use_batches and self.target.has("id-arrays")
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
        #: Lists the implementation returned, with their contents then (POOL-123), the newest last.
        self.handed: list[tuple[Any, list[int], str]] = []
        self.started = time.perf_counter()

    # ------------------------------------------------------------- helpers

    def both(self, what: str, on_impl: Any, on_oracle: Any) -> tuple[str, Any, Any]:
        """Run one operation on both sides; they must agree on success or on the error."""
        return self.agree(what, outcome(on_impl), outcome(on_oracle))

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
        if not self.arrays:  # the array forms keep the engine's own array (own_array)
            self.keep(got, what)
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

    def keep(self, returned: Any, what: str) -> None:
        """Remember a list the implementation returned and what it held: it must stay so (POOL-123)."""
        self.handed.append((returned, [int(x) for x in returned], what))
        del self.handed[:-_KEPT]

    # ------------------------------------------------- the calls, in either form

    def own_array(self, returned: Any, what: str) -> list[int]:
        """The ids of an array the implementation returned, the array kept: it must stay so (POOL-123)."""
        self.keep(returned, what)
        return [int(x) for x in returned]

    def call_allocate(self, count: int, holder: object) -> list[int]:
        """The implementation's ``allocate``, or ``allocate_ids`` where the machine drives the array forms."""
        if not self.arrays:
            given: list[int] = self.impl.allocate(count, holder=holder)  # the very list: kept as is (POOL-123)
            return given
        return self.own_array(self.impl.allocate_ids(count, holder=holder), f"allocate_ids({count}, holder={holder!r})")

    def call_match(self, hashes: list[int], holder: object) -> list[int]:
        """The implementation's ``match``, or ``match_ids`` where the machine drives the array forms."""
        if not self.arrays:
            hit: list[int] = self.impl.match(hashes, holder=holder)
            return hit
        return self.own_array(self.impl.match_ids(hashes, holder=holder), f"match_ids({hashes}, holder={holder!r})")

    def call_allocate_many(self, counts: list[int], holders: Sequence[object]) -> list[list[int]]:
        """The implementation's ``allocate_many``, or ``allocate_many_ids`` where the machine drives the
        array forms: the admitted entries' ids end to end, with the offsets of each (POOL-116)."""
        if not self.arrays:
            entries: list[list[int]] = self.impl.allocate_many(counts, holders=holders)
            return entries
        ids, offsets = self.impl.allocate_many_ids(counts, holders=holders)
        flat = self.own_array(ids, f"allocate_many_ids({counts}, holders={list(holders)})")
        bounds = [int(x) for x in offsets]
        admitted = len(bounds) - 1
        assert (
            0 <= admitted <= len(counts)
            and bounds[0] == 0
            and bounds[-1] == len(flat)
            and all(bounds[i + 1] - bounds[i] == counts[i] for i in range(admitted))
        ), f"[POOL-116] allocate_many_ids({counts}) returned {len(flat)} ids with offsets {bounds}"
        return [flat[bounds[i] : bounds[i + 1]] for i in range(admitted)]

    def call_free_many(self, lists: list[list[int]], holders: Sequence[object]) -> None:
        """The implementation's ``free_many``, or ``free_many_ids`` of the lists end to end where the machine
        drives the array forms (POOL-117)."""
        if not self.arrays:
            self.impl.free_many(lists, holders=holders)
            return
        offsets = [0, *accumulate(len(entry) for entry in lists)]
        self.impl.free_many_ids([a for entry in lists for a in entry], offsets, holders=holders)

    def blocks_in_view(self) -> range | list[int]:
        """The blocks the per-block observations check after this step: every block of a pool of up to
        :data:`VIEW_WINDOW` blocks; in a larger one a window of that many, moved on by a window each
        step, so every block is checked within ``ceil(num_blocks / VIEW_WINDOW)`` steps (the counts are
        compared in full after every step)."""
        n = self.impl.num_blocks
        if n <= VIEW_WINDOW:
            return range(n)
        start = STEP_COUNTS[self.name] * VIEW_WINDOW % n
        return [(start + i) % n for i in range(VIEW_WINDOW)]

    def rename(self, ids: list[int]) -> list[int]:
        return [self.i2o[a] for a in ids]

    def impl_view(self) -> tuple[Any, ...]:
        """What the implementation shows of every block and count: compared before and after a refused call."""
        impl = self.impl
        blocks = tuple(
            (impl.ref_count(b), tuple(sorted(impl.holders(b).items(), key=repr)), impl.generation(b))
            for b in range(impl.num_blocks)
        )
        cache = (frozenset(impl.resident_hashes()), impl.num_cached, impl.stats) if self.caching else ()
        return blocks, impl.num_free, impl.num_in_use, cache

    def tick(self) -> None:
        STEP_COUNTS[self.name] += 1

    # --------------------------------------------------------------- setup

    @initialize(data=st.data())
    def create(self, data: st.DataObject) -> None:
        size = data.draw(st.sampled_from(self.sizes), label="num_blocks")
        self.impl = self.target.create(size, policy=self.policy, paused_limit=2, enable_events=self.events)
        self.oracle = OracleBlockPool(size, policy=self.policy, paused_limit=2, enable_events=self.events)
        note(f"pool = target.create({size}, policy={self.policy!r}, paused_limit=2)")
