"""Chapters 01 and 05: faults from inside a call (ERR-515), holders that cannot be named again (ERR-516),
and a pool shared between threads through one lock (POOL-122)."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from kvref.config.registry import backend_statuses, load_backend
from kvref.contract.containment import contain_faults
from kvref.contract.errors import InvalidValueError, OutOfBlocksError, PoolUnusableError
from kvref.contract.locking import Locked
from kvref.oracle import OracleBlockPool

rule = pytest.mark.rule

ARRAY_BACKENDS = [s.name for s in backend_statuses() if s.usable and s.name in ("torch", "cupy")]


@rule("ERR-515")
@pytest.mark.parametrize("backend", ARRAY_BACKENDS)
def test_an_array_library_failing_half_way_makes_the_array_pool_refuse_every_later_call(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool: Any = load_backend(backend).create(64)
    held = pool.allocate(4, holder="r")
    calls = 0
    real = pool.ops.tolist

    def fails_on_the_second_use(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls >= 2:
            raise MemoryError("out of device memory (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(pool.ops, "tolist", fails_on_the_second_use)
    pool.allocate(1, holder="a")  # the first use goes through
    with pytest.raises(PoolUnusableError, match="ERR-515") as caught:
        pool.allocate(1, holder="b")
    assert isinstance(caught.value.__cause__, MemoryError)
    monkeypatch.setattr(pool.ops, "tolist", real)  # the library recovers; the pool still may be torn
    with pytest.raises(PoolUnusableError, match="allocate was interrupted by MemoryError"):
        pool.free(held, holder="r")


@rule("ERR-515")
def test_a_refused_argument_is_not_a_fault_and_the_pool_goes_on() -> None:
    pool = OracleBlockPool(8)
    with pytest.raises(OutOfBlocksError):
        pool.allocate(100)
    assert pool.allocate(2) == [1, 2], "a kvref error changed nothing and leaves the pool usable (ERR-501)"


@rule("ERR-515")
@pytest.mark.parametrize("backend", ["oracle", "cupy", "torch"])
def test_a_call_that_does_not_fit_the_signature_never_began_and_the_pool_goes_on(backend: str) -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    pool: Any = load_backend(backend).create(8)
    with pytest.raises(TypeError):
        pool.match_request([1])  # num_tokens and block_size missing
    with pytest.raises(TypeError):
        pool.allocate(1, owner="a")  # no such keyword
    assert pool.allocate(2, holder="a") == [1, 2], "a call that never began leaves the pool usable"


@rule("ERR-515")
def test_a_fault_inside_a_nested_public_call_is_named_by_the_call_the_caller_made() -> None:
    @contain_faults
    class Pool:
        def step(self) -> None:
            self.allocate()

        def allocate(self) -> None:
            raise RuntimeError("library failed")

    pool = Pool()
    with pytest.raises(PoolUnusableError, match=r"step: interrupted from inside by RuntimeError: library failed"):
        pool.step()
    with pytest.raises(PoolUnusableError, match=r"allocate: the pool is unusable since step was interrupted"):
        pool.allocate()


@rule("ERR-515")
def test_a_fault_in_another_pool_leaves_the_calling_pool_usable() -> None:
    @contain_faults
    class Pool:
        def __init__(self, inner: Any = None) -> None:
            self.inner = inner

        def allocate(self) -> int:
            if self.inner is None:
                raise RuntimeError("library failed")
            return int(self.inner.allocate())

        def size(self) -> int:
            return 1

    inner = Pool()
    outer = Pool(inner)
    with pytest.raises(PoolUnusableError, match=r"allocate: interrupted from inside by RuntimeError"):
        outer.allocate()
    assert outer.size() == 1, "the pool whose call reached a faulty pool was not itself interrupted"
    with pytest.raises(PoolUnusableError, match=r"the pool is unusable since allocate was interrupted"):
        inner.size()


@rule("ERR-516")
def test_a_nan_holder_is_refused_instead_of_leaking_its_blocks() -> None:
    pool = OracleBlockPool(8)
    with pytest.raises(InvalidValueError, match="ERR-516"):
        pool.allocate(3, holder=float("nan"))
    assert pool.num_free == 7, "nothing was taken by a holder no later call could name"
    same = ("req", 1)
    assert pool.allocate(1, holder=same) == [1], "tuples, strings, ints and None are equal to themselves"


@rule("POOL-122")
def test_eight_threads_sharing_a_locked_pool_lose_nothing() -> None:
    pool = OracleBlockPool(257, policy="lru")
    shared = Locked(pool)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        mine: list[list[int]] = []
        try:
            for step in range(400):
                holder = f"t{seed}"
                kind = rng.random()
                if kind < 0.45 or not mine:
                    hashes = [seed * 10_000 + step * 10 + i for i in range(rng.randint(1, 4))]
                    try:
                        got = shared.allocate(len(hashes), holder=holder)
                    except OutOfBlocksError:
                        continue
                    shared.register(got, hashes)
                    mine.append(got)
                elif kind < 0.6:
                    hit = shared.match([seed * 10_000 + rng.randrange(step + 1) * 10], holder=holder)
                    if hit:
                        mine.append(hit)
                else:
                    blocks = mine.pop(rng.randrange(len(mine)))
                    shared.free(blocks[::-1], holder=holder)
            for blocks in mine:
                shared.free(blocks[::-1], holder=f"t{seed}")
        except BaseException as exc:  # reported below with the thread's seed
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"threads failed: {errors[:3]}"
    pool.check_invariants()
    assert pool.num_in_use == 0, f"{pool.num_in_use} blocks still in use after every thread freed what it held"
    assert pool.num_free + pool.num_cached == pool.num_usable
    assert shared.num_usable == 256, "reads go through the wrapper too"
    with pytest.raises(AttributeError, match="on the pool itself"):
        shared.policy = "fifo"


@rule("POOL-122")
def test_another_thread_cannot_take_the_lock_while_a_call_runs() -> None:
    pool = OracleBlockPool(16)
    shared = Locked(pool)
    probes: list[bool] = []
    original = pool.allocate

    def try_from_another_thread() -> None:
        got = shared.lock.acquire(blocking=False)
        if got:
            shared.lock.release()
        probes.append(got)

    def spying(*args: Any, **kwargs: Any) -> Any:
        probe = threading.Thread(target=try_from_another_thread)
        probe.start()
        probe.join()
        return original(*args, **kwargs)

    pool.allocate = spying  # type: ignore[method-assign]
    assert shared.allocate(1, holder="x") == [1]
    assert probes == [False], "another thread took the lock while allocate ran"
