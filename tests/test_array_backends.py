"""The device backends (torch, CuPy on its NumPy host path) against the oracle, at scales the
conformance machines do not reach: deep chains, windows wider than the first scan, queue
compaction and hash-table rebuilds. The backends promise the oracle's exact order (profile
``exact-order``), so every return value, error, event and statistic must be equal.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from kvref.config.registry import load_backend
from kvref.contract.errors import KVRefError
from kvref.oracle import OracleBlockPool
from kvref.simulation.replay import replay
from kvref.simulation.workloads import workload_trace

rule = pytest.mark.rule
np = pytest.importorskip("numpy")
BACKENDS = ["cupy", "torch"]
POLICIES = ["lru", "lru-leaf", "fifo", "ref-zero", "lru-leaf-access"]


def create(backend: str, num_blocks: int, **kwargs: Any) -> Any:
    found = load_backend(backend)
    reason = found.availability()
    if reason is not None:
        pytest.skip(f"backend {backend!r} is not usable here: {reason}")
    return found.create(num_blocks, **kwargs)


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", call()
    except KVRefError as exc:  # class and rule must agree; the message may order holders differently
        return type(exc).__name__, exc.rule


class Driver:
    """Random scheduler-like traffic on a pool and on the oracle, compared call by call."""

    def __init__(self, impl: Any, oracle: OracleBlockPool, seed: int) -> None:
        self.impl, self.oracle = impl, oracle
        self.rng = random.Random(seed)
        self.held: dict[str, list[int]] = {h: [] for h in ("a", "b", "c", "d")}
        self.chains: list[list[int]] = []
        self.step_no = 0

    def both(self, what: str, call: Callable[[Any], Any]) -> Any:
        got, want = outcome(lambda: call(self.impl)), outcome(lambda: call(self.oracle))
        assert got == want, f"step {self.step_no}, {what}: backend gave {got}, the oracle (exact order) gives {want}"
        assert self.impl.take_events() == self.oracle.take_events(), f"step {self.step_no}, {what}: events differ"
        return want[1] if want[0] == "ok" else None

    def chain(self) -> list[int]:
        if self.chains and self.rng.random() < 0.7:
            base = self.rng.choice(self.chains)
            cut = self.rng.randint(0, len(base))
            tail = [self.rng.getrandbits(62) for _ in range(self.rng.randint(0, 12))]
            new = base[:cut] + tail
        else:
            new = [self.rng.getrandbits(62) for _ in range(self.rng.randint(1, 24))]
        if new:
            self.chains.append(new)
            del self.chains[:-40]
        return new

    def step(self) -> None:
        self.step_no += 1
        rng = self.rng
        holder = rng.choice(list(self.held))
        kind = rng.random()
        if kind < 0.35:  # a request: match, allocate the rest, register, maybe keep running
            hashes = self.chain()
            hit = self.both(f"match {holder}", lambda p: p.match(hashes, holder=holder)) or []
            need = len(hashes) - len(hit)
            room = min(need, self.oracle.num_available)
            fresh = self.both(f"allocate {room}", lambda p: p.allocate(room, holder=holder)) or []
            if fresh:
                parent = hashes[len(hit) - 1] if hit else None
                span = hashes[len(hit) : len(hit) + room]
                self.both("register", lambda p: p.register(fresh, span, parent_hash=parent))
            self.held[holder] += hit + fresh
            if rng.random() < 0.7:
                ids = (hit + fresh)[::-1]
                self.both("free request", lambda p: p.free(ids, holder=holder))
                for b in ids:
                    self.held[holder].remove(b)
        elif kind < 0.5 and self.held[holder]:  # release some, tail first
            k = rng.randint(1, len(self.held[holder]))
            ids = self.held[holder][-k:][::-1]
            self.both("free", lambda p: p.free(ids, holder=holder))
            del self.held[holder][-k:]
        elif kind < 0.6:  # share another holder's blocks, duplicates included
            donor = rng.choice(list(self.held))
            if self.held[donor]:
                ids = rng.choices(self.held[donor], k=rng.randint(1, 6))
                self.both("acquire", lambda p: p.acquire(ids, holder=holder))
                self.held[holder] += ids
        elif kind < 0.7:  # a bad release: must fail identically and change nothing
            ids = [rng.randrange(-2, self.oracle.num_blocks + 2) for _ in range(rng.randint(1, 4))]
            self.both("bad free", lambda p: p.free(ids, holder=holder))
            self.resync()
        elif kind < 0.8:  # a batch of requests
            counts = [rng.randint(0, 6) for _ in range(rng.randint(1, 5))]
            hs = [rng.choice(list(self.held)) for _ in counts]
            got = self.both("allocate_many", lambda p: p.allocate_many(counts, holders=hs)) or []
            for ids, h in zip(got, hs, strict=False):
                self.held[h] += ids
        elif kind < 0.9:  # free several holders at once
            hs = [h for h in self.held if self.held[h] and rng.random() < 0.5]
            lists = [self.held[h][::-1] for h in hs]
            self.both("free_many", lambda p: p.free_many(lists, holders=hs))
            for h in hs:
                self.held[h] = []
        elif kind < 0.97:
            lists = [self.chain() for _ in range(rng.randint(1, 3))]
            hs = [rng.choice(list(self.held)) for _ in lists]
            got = self.both("match_many", lambda p: p.match_many(lists, holders=hs)) or []
            for ids, h in zip(got, hs, strict=False):
                self.held[h] += ids
        else:
            self.both("reset", lambda p: p.reset())
        self.both("counts", lambda p: (p.num_free, p.num_cached, p.num_in_use, p.num_available, p.stats))

    def resync(self) -> None:
        """Nothing to do: a failed call changes nothing, and the comparison above proves it."""

    def deep_check(self) -> None:
        self.impl.check_invariants()
        got_order, want_order = self.impl.eviction_order(), list(self.oracle.orders.evictable)
        assert got_order == want_order, f"step {self.step_no}: eviction order {got_order} != the oracle's {want_order}"
        for b in range(self.oracle.num_blocks):
            got = (self.impl.ref_count(b), self.impl.holders(b), self.impl.generation(b), self.impl.block_hash(b))
            want = (
                self.oracle.ref_count(b),
                self.oracle.holders(b),
                self.oracle.generation(b),
                self.oracle.block_hash(b),
            )
            assert got == want, f"step {self.step_no}: block {b} is {got} on the backend, {want} on the oracle"
        assert self.impl.resident_hashes() == self.oracle.resident_hashes(), f"step {self.step_no}: resident hashes"


@rule("POOL-115", "EVICT-401", "EVICT-402", "EVICT-403", "EVICT-406", "PFX-307", "STATE-003", "CONF-910", "CONF-911")
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_random_traffic_gives_the_oracles_exact_results_step_by_step(backend: str, policy: str) -> None:
    impl = create(backend, 150, policy=policy, enable_events=True, reserved_ids=(0, 7))
    oracle = OracleBlockPool(150, policy=policy, enable_events=True, reserved_ids=(0, 7))
    driver = Driver(impl, oracle, seed=hash((backend, policy)) & 0xFFFF)
    for i in range(700):
        driver.step()
        if i % 50 == 49:
            driver.deep_check()
    driver.deep_check()


@rule("TRACE-1011", "TRACE-1014", "TRACE-1018")
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_replaying_a_generated_workload_counts_exactly_what_the_oracle_counts(backend: str, policy: str) -> None:
    trace = workload_trace("chat", seed=3)
    want = replay(trace, OracleBlockPool(120, policy=policy))
    got = replay(trace, create(backend, 120, policy=policy))
    fields = ("block_hits", "token_hits", "evictions", "peak_occupancy")
    counted, expected = ([getattr(r, f) for f in fields] for r in (got, want))
    assert counted == expected, f"replay on {backend} [{policy}] counted {fields} = {counted}, the oracle {expected}"


@rule("EVICT-403", "EVICT-404")
@pytest.mark.parametrize("backend", BACKENDS)
def test_lru_leaf_evicts_a_long_chain_leaf_first_even_when_parents_were_released_first(backend: str) -> None:
    # Parents released before children (head first): only the deepest is a leaf at each step.
    impl = create(backend, 301, policy="lru-leaf")
    oracle = OracleBlockPool(301, policy="lru-leaf")
    for pool in (impl, oracle):
        for start in (1, 1000):
            ids = pool.allocate(150)
            pool.register(ids, list(range(start, start + 150)))
            pool.free(ids)  # head first
        pool.allocate(200)
    assert impl.eviction_order() == list(oracle.orders.evictable)
    assert impl.resident_hashes() == oracle.resident_hashes(), "the evicted blocks must be the oracle's"
    impl.check_invariants()


@rule("ERR-503", "HASH-207")
@pytest.mark.parametrize("backend", BACKENDS)
def test_arrays_and_tensors_are_accepted_and_bad_dtypes_refused_like_the_oracle(backend: str) -> None:
    pool = create(backend, 16)
    ids = pool.allocate(4)
    pool.acquire(np.array(ids, dtype=np.int32), holder="x")
    pool.free(np.array(ids[::-1]), holder="x")
    got = outcome(lambda: pool.free(np.array([True, False])))
    want = outcome(lambda: OracleBlockPool(16).free(np.array([True, False])))
    assert got == want == ("InvalidTypeError", "ERR-503"), f"a bool array gave {got}, the oracle {want}"
    big = np.array([2**63 + 5], dtype=np.uint64)
    assert outcome(lambda: pool.lookup(big))[0] == "InvalidValueError", "a hash >= 2**63 must be refused (HASH-207)"
    torch = pytest.importorskip("torch")
    pool.free(torch.tensor(ids[::-1]))
    assert pool.num_free == 15


@rule("CONF-901")
@pytest.mark.parametrize("backend", BACKENDS)
def test_loading_a_backend_entry_point_imports_neither_torch_nor_numpy(backend: str) -> None:
    code = (
        f"import sys; from kvref.config.registry import load_backend; load_backend({backend!r}); "
        "heavy = [m for m in ('torch', 'numpy', 'cupy') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"loading the {backend!r} entry point imported {out}; heavy imports belong in create()"


@rule("CONF-907", "CONF-909")
def test_the_cupy_backend_reports_host_and_refuses_cuda_without_a_device() -> None:
    found = load_backend("cupy")
    if found.availability() is not None:
        pytest.skip(f"cupy backend not usable: {found.availability()}")
    import cupy

    if cupy.cuda.is_available():
        pytest.skip("a CUDA device exists here: the host path is not the default")
    assert found.device() == "host", "without CUDA the CuPy backend must say it runs on the host"
    assert "host" in getattr(found.create(4), "name", ""), "the pool's name must say it runs on NumPy on the host"
    with pytest.raises(KVRefError, match="CONF-907"):
        found.create(4, device="cuda:0")


@rule("CONF-908")
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_arrays_a_cuda_graph_may_read_keep_their_addresses_through_heavy_traffic(backend: str) -> None:
    impl = create(backend, 150, policy="lru-leaf", enable_events=True)
    before = {name: impl.ops.address(array) for name, array in impl.graph_arrays().items()}
    driver = Driver(impl, OracleBlockPool(150, policy="lru-leaf", enable_events=True), seed=5)
    for _ in range(400):  # enough for table rebuilds, queue compactions and resets
        driver.step()
    after = {name: impl.ops.address(array) for name, array in impl.graph_arrays().items()}
    moved = sorted(k for k in before if before[k] != after[k])
    assert not moved, f"arrays {moved} were reallocated; CONF-908 promises fixed addresses for the pool's lifetime"


def _cuda_devices() -> list[str]:
    try:
        import torch
    except ImportError:
        return []
    return ["cuda:0"] if torch.cuda.is_available() else []


@pytest.mark.skipif(not _cuda_devices(), reason="no CUDA device here: the GPU paths are checked by `nox -s gpu`")
@rule("POOL-115", "STATE-003")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy", POLICIES)
def test_on_cuda_random_traffic_gives_the_oracles_exact_results(backend: str, policy: str) -> None:  # pragma: no cover
    impl = create(backend, 150, policy=policy, enable_events=True, device="cuda:0")
    assert impl.device.startswith("cuda"), f"asked for cuda:0, the pool lives on {impl.device}"
    driver = Driver(impl, OracleBlockPool(150, policy=policy, enable_events=True), seed=11)
    for _ in range(300):
        driver.step()
    driver.deep_check()


# Regressions found by review (a differential fuzzer against the oracle): each case must give the
# oracle's outcome, return value or (exception class, rule).
def _both(backend: str, setup: Callable[[Any], Any], call: Callable[[Any], Any], **kwargs: Any) -> None:
    n = kwargs.pop("n", 8)
    impl, oracle = create(backend, n, **kwargs), OracleBlockPool(n, **kwargs)
    for pool in (impl, oracle):
        setup(pool)
    got, want = outcome(lambda: call(impl)), outcome(lambda: call(oracle))
    assert got == want, f"{backend}: got {got}, the oracle gives {want}"


@rule("EVICT-403", "POOL-106")
@pytest.mark.parametrize("backend", BACKENDS)
def test_lru_leaf_finds_a_leaf_beyond_the_first_window_of_a_chain_released_head_first(backend: str) -> None:
    def setup(pool: Any) -> None:
        ids = pool.allocate(100)
        pool.register(ids, list(range(1, 101)))
        pool.free(ids)  # the root is the oldest; the only leaf is the newest

    _both(backend, setup, lambda p: p.allocate(1), n=101, policy="lru-leaf")


@rule("POOL-117")
@pytest.mark.parametrize("backend", BACKENDS)
def test_free_many_with_an_empty_list_for_an_unknown_holder_frees_the_rest(backend: str) -> None:
    _both(backend, lambda p: p.allocate(2, holder="a"), lambda p: p.free_many([[1], []], holders=["a", "zzz"]))


@rule("POOL-103")
@pytest.mark.parametrize("backend", BACKENDS)
def test_ids_beyond_int64_are_out_of_range_in_every_operation(backend: str) -> None:
    _both(backend, lambda p: p.allocate(2, holder="a"), lambda p: p.free_many([[1, 2**64]], holders=["a"]))
    _both(backend, lambda p: p.allocate(2), lambda p: p.register([2**64, 2**64 + 1], [1, 2]))
    _both(backend, lambda p: p.allocate(2), lambda p: p.register([-1, 2**64], [1, 2]))


@rule("POOL-116")
@pytest.mark.parametrize("backend", BACKENDS)
def test_allocate_many_with_a_count_beyond_int64_admits_the_prefix_that_fits(backend: str) -> None:
    _both(backend, lambda p: None, lambda p: p.allocate_many([2**64], holders=[None]))
    _both(backend, lambda p: None, lambda p: p.allocate_many([1, 2**64], holders=["x", "y"]))
    counts = np.array([2**64 - 1, 1], dtype=np.uint64)
    _both(backend, lambda p: None, lambda p: p.allocate_many(counts, holders=["x"]))


@rule("ERR-503")
@pytest.mark.parametrize("backend", BACKENDS)
def test_read_only_arrays_are_accepted_without_a_warning(backend: str) -> None:
    pool = create(backend, 8)
    ids = np.array(pool.allocate(3))
    ids.flags.writeable = False
    pool.free(ids)  # warnings are errors in this suite: a torch UserWarning would fail here
    assert pool.num_free == 7
