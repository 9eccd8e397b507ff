"""Benchmarks of chapter 06's radix cache, the oracle beside SGLang's: match, insert, lock/unlock and evict.

Each tree holds ``leaves`` leaves (1e3, 1e4, 1e5), every one a key of four pages under one shared
first page, over a token-slot allocator of page 1 (``scripts/bench_oracle.py`` also grows them at
page 16, with one long key beside them). SGLang's ``RadixCache.evict`` re-heapifies every
evictable leaf on each call, so one call's cost grows with the leaves; kvref's oracle keeps its
leaves in a heap with lazy deletion, so one evict costs O(log n) per node evicted.

Where SGLang's ``RadixCache`` imports (``nox -s bench-peers``) the same rounds run on it in the
same run, through its own calls as its scheduler makes them (``match_prefix`` then
``path_device_indices`` for a match's slots, ``insert`` with the allocator's tensor, ``lock`` and
``unlock``, ``evict``), with its keys as its engine holds them (``RadixKey`` over ``array("q")``),
not through the conformance adapter, whose list conversions would add to SGLang's time. The
extra info names the leaves, so a report can plot cost against them.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

import pytest

from kvref.oracle.radix import OracleRadixCache, OracleSlotAllocator

LEAVES = [1_000, 10_000, 100_000]
#: Tokens of each leaf key: the shared root token and three of the leaf's own.
DEPTH = 4


def implementations() -> list[str]:
    """The oracle, and SGLang's RadixCache where it imports."""
    try:
        from kvref_conformance.peers.sglang_radix import load_radix_cache

        load_radix_cache()
    except Exception:  # SGLang absent, or a dependency of it
        return ["oracle"]
    return ["oracle", "sglang"]


IMPLEMENTATIONS = implementations()


class OracleDriver:
    """kvref's oracle tree over its allocator: the calls an engine would make."""

    def __init__(self, size: int, policy: str, page: int = 1) -> None:
        self.allocator = OracleSlotAllocator(size, page_size=page)
        self.tree = OracleRadixCache(self.allocator, policy=policy)

    def alloc(self, n: int) -> Any:
        return self.allocator.alloc(n)

    def free(self, slots: Any) -> None:
        self.allocator.free(slots)

    def insert(self, key: list[int], slots: Any) -> int:
        return self.tree.insert(key, slots)

    def match(self, key: Any) -> tuple[int, Any]:
        """The cached length and the node; the slots come with the result."""
        found = self.tree.match(key)
        return found.length, found.node

    def lock(self, node: Any) -> Any:
        return self.tree.lock(node)

    def unlock(self, receipt: Any) -> None:
        self.tree.unlock(receipt)

    def evict(self, n: int) -> int:
        return self.tree.evict(n)

    def evictable(self) -> int:
        return self.tree.evictable_size()


class SglangDriver:
    """SGLang 0.5.23's ``RadixCache`` over its ``TokenToKVPoolAllocator``, called as its scheduler calls them."""

    def __init__(self, size: int, policy: str, page: int = 1) -> None:
        import torch
        from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams

        from kvref_conformance.peers.sglang_radix import cache_params, load_radix_cache

        radix = load_radix_cache()
        if page == 1:
            self.allocator = TokenToKVPoolAllocator(size, torch.float16, "cpu", None, False)
        else:
            self.allocator = PagedTokenToKVPoolAllocator(size, page, torch.float16, "cpu", None, False)
        self.cache = radix.RadixCache(cache_params(self.allocator, page_size=page, policy=policy))
        self._key, self._evict, self._insert, self._match = radix.RadixKey, EvictParams, InsertParams, MatchPrefixParams

    def _radix_key(self, key: Any) -> Any:
        """The key as SGLang's scheduler makes it: a ``RadixKey`` over the request's ``array("q")`` of tokens."""
        return self._key(key if isinstance(key, array) else array("q", key))

    def alloc(self, n: int) -> Any:
        return self.allocator.alloc(n)

    def free(self, slots: Any) -> None:
        self.allocator.free(slots)

    def insert(self, key: list[int], slots: Any) -> int:
        return int(self.cache.insert(self._insert(key=self._radix_key(key), value=slots)).prefix_len)

    def match(self, key: Any) -> tuple[int, Any]:
        """``match_prefix``, then the prefix's slots as the scheduler reads them (``path_device_indices``)."""
        found = self.cache.match_prefix(self._match(key=self._radix_key(key)))
        self.cache.path_device_indices(found.last_device_node)
        return int(found.device_prefix_len), found.last_device_node

    def lock(self, node: Any) -> Any:
        return self.cache.lock(node)

    def unlock(self, receipt: Any) -> None:
        self.cache.unlock(receipt)

    def evict(self, n: int) -> int:
        return int(self.cache.evict(self._evict(num_tokens=n)).num_tokens_evicted)

    def evictable(self) -> int:
        return int(self.cache.evictable_size())


def grown(
    leaves: int, policy: str = "lru", impl: str = "oracle", spare: int = 64, page: int = 1, long_key: Sequence[int] = ()
) -> tuple[Any, list[int]]:
    """A driver whose tree holds ``leaves`` leaves with ``spare`` slots free, and the counter naming the next leaf.

    Leaf ``i``'s key is a page of zeros (shared by all) and three pages of ``i + 1``; ``long_key``,
    when given, is inserted too, under the same first page.
    """
    size = (leaves * DEPTH + spare) * page + len(long_key)
    driver: Any = SglangDriver(size, policy, page) if impl == "sglang" else OracleDriver(size, policy, page)
    keys = ([0] * page + [i + 1] * (DEPTH - 1) * page for i in range(leaves))
    for key in [*keys, list(long_key)] if long_key else keys:
        slots = driver.alloc(len(key))
        have = driver.insert(key, slots)
        driver.free(slots[:have])  # the shared first page was cached: its slots are duplicates
    return driver, [leaves + 1]


def evict_one_then_insert(driver: Any, counter: list[int]) -> int:
    """One evict round (page 1): evict one leaf, insert the next new leaf so the tree keeps its size;
    the tokens evicted."""
    freed = int(driver.evict(1))
    key = [0, counter[0], counter[0], counter[0]]
    counter[0] += 1
    slots = driver.alloc(DEPTH)
    driver.free(slots[: driver.insert(key, slots)])
    return freed


def insert_a_new_leaf(driver: Any, counter: list[int], page: int = 1) -> int:
    """One insert round: a new one-page leaf under leaf 1's cached path (splits nothing after the first
    round); how many of its tokens were cached."""
    key = [0] * page + [1] * (DEPTH - 1) * page + [counter[0]] * page
    counter[0] += 1
    slots = driver.alloc(len(key))
    have = int(driver.insert(key, slots))
    driver.free(slots[:have])
    return have


def describe(benchmark: Any, op: str, leaves: int, impl: str) -> None:
    benchmark.extra_info.update(backend=impl, workload=f"radix-{op}", leaves=leaves, blocks_per_round=1)


def need(leaves: int, measuring: bool) -> None:
    if leaves > 10_000 and not measuring:
        pytest.skip("100k-leaf trees are measured by `nox -s bench` only")


@pytest.mark.benchmark_suite
@pytest.mark.parametrize("leaves", LEAVES)
@pytest.mark.parametrize("policy", ["lru", "lfu", "priority"])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_radix_evict_one_leaf_then_insert_one(
    benchmark: Any, measuring: bool, leaves: int, policy: str, impl: str
) -> None:
    need(leaves, measuring)
    driver, counter = grown(leaves, policy, impl)

    def round_() -> None:
        freed = evict_one_then_insert(driver, counter)
        assert freed == DEPTH - 1, f"{impl}: evict(1) freed {freed} tokens from a tree of 3-token leaves"

    describe(benchmark, f"evict-{policy}", leaves, impl)
    benchmark(round_)
    assert driver.evictable() == 1 + 3 * leaves, f"{impl}: the tree must keep its size round after round"


@pytest.mark.benchmark_suite
@pytest.mark.parametrize("leaves", LEAVES)
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_radix_match_a_cached_key(benchmark: Any, measuring: bool, leaves: int, impl: str) -> None:
    need(leaves, measuring)
    driver, _ = grown(leaves, impl=impl)
    key = [0, leaves // 2 + 1, leaves // 2 + 1, leaves // 2 + 1, 7, 7]
    describe(benchmark, "match", leaves, impl)
    length, _node = benchmark(driver.match, key)
    assert length == DEPTH, f"{impl}: match found {length} of {DEPTH} cached tokens"


@pytest.mark.benchmark_suite
@pytest.mark.parametrize("leaves", LEAVES)
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_radix_match_lock_unlock(benchmark: Any, measuring: bool, leaves: int, impl: str) -> None:
    """A request's life on the tree without its insert: match its prefix, lock it while it runs, unlock."""
    need(leaves, measuring)
    driver, _ = grown(leaves, impl=impl)
    key = [0, leaves // 3 + 1, leaves // 3 + 1, leaves // 3 + 1, 9]

    def round_() -> None:
        _, node = driver.match(key)
        driver.unlock(driver.lock(node))

    describe(benchmark, "match-lock-unlock", leaves, impl)
    benchmark(round_)
    assert driver.evictable() == 1 + 3 * leaves, f"{impl}: every lock taken was released, so all is evictable"


#: Rounds of the insert benchmark: each keeps one slot, so the allocator is sized for them and
#: nothing is evicted (an evict in the round would time SGLang's evict, not its insert).
INSERT_ROUNDS = 5_000


@pytest.mark.benchmark_suite
@pytest.mark.parametrize("leaves", LEAVES)
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_radix_insert_a_key_sharing_its_first_pages(benchmark: Any, measuring: bool, leaves: int, impl: str) -> None:
    need(leaves, measuring)
    driver, counter = grown(leaves, impl=impl, spare=64 + 5 * INSERT_ROUNDS)
    cached = [0]

    def round_() -> None:
        cached[0] = insert_a_new_leaf(driver, counter)

    describe(benchmark, "insert", leaves, impl)
    benchmark.pedantic(round_, rounds=INSERT_ROUNDS if measuring else 1, iterations=1)
    assert cached[0] == DEPTH, f"{impl}: insert found {cached[0]} of the key's {DEPTH} cached tokens"
