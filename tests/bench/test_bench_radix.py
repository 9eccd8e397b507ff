"""Benchmarks of chapter 06's radix cache, the oracle beside SGLang's: evict, match and insert against the leaves.

SGLang's ``RadixCache.evict`` re-heapifies every evictable leaf on each call, so one call's cost
grows with the leaves (about 0.2 s at 100k leaves on a 2-core machine, the radix issue measured);
kvref's oracle keeps its leaves in a heap with lazy deletion, so one evict costs O(log n) per
node evicted. Each round here evicts one leaf and inserts one back, so the tree stays at its
size; the extra info names the leaves, so a report can plot cost against them. Where SGLang's
``RadixCache`` imports (``nox -s bench-peers``) it runs the same rounds over its own allocator,
through the peer adapter (``kvref_conformance.peers.sglang_radix``), in the same run.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvref.oracle.radix import OracleRadixCache, OracleSlotAllocator

LEAVES = [1_000, 10_000, 100_000]


def implementations() -> list[str]:
    """The oracle, and SGLang's RadixCache where it imports."""
    try:
        from kvref_conformance.peers.sglang_radix import load_radix_cache

        load_radix_cache()
    except Exception:  # SGLang absent, or a dependency of it
        return ["oracle"]
    return ["oracle", "sglang"]


IMPLEMENTATIONS = implementations()
#: Tokens of each leaf key below the shared root page.
DEPTH = 4


def grown(leaves: int, policy: str = "lru", impl: str = "oracle") -> tuple[Any, Any, list[int]]:
    """An allocator and a tree of ``leaves`` leaves, each a 4-token key under one shared first token, and a count."""
    size = leaves * DEPTH + 64
    tree: Any
    if impl == "sglang":
        from kvref_conformance.peers.sglang import SglangSlots
        from kvref_conformance.peers.sglang_radix import SglangRadixTree

        alloc: Any = SglangSlots(size, page_size=1, sort=False)
        tree = SglangRadixTree(alloc.allocator, page_size=1, policy=policy)
    else:
        alloc = OracleSlotAllocator(size)
        tree = OracleRadixCache(alloc, policy=policy)
    for i in range(leaves):
        key = [0, i + 1, i + 1, i + 1]
        slots = alloc.alloc(DEPTH) or []
        have = tree.insert(key, slots)
        alloc.free(slots[:have])
    return alloc, tree, [leaves + 1]


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
    alloc, tree, counter = grown(leaves, policy, impl)

    def round_() -> None:
        freed = tree.evict(1)
        key = [0, counter[0], counter[0], counter[0]]
        counter[0] += 1
        slots = alloc.alloc(DEPTH) or []
        have = tree.insert(key, slots)
        alloc.free(slots[:have])  # the shared first token was cached: its slot is a duplicate
        assert freed == DEPTH - 1, f"evict(1) freed {freed} tokens from a tree of 3-token leaves"

    describe(benchmark, f"evict-{policy}", leaves, impl)
    benchmark(round_)
    assert tree.evictable_size() == 1 + 3 * leaves, "the tree must keep its size round after round"


@pytest.mark.benchmark_suite
@pytest.mark.parametrize("leaves", LEAVES)
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_radix_match_a_cached_key(benchmark: Any, measuring: bool, leaves: int, impl: str) -> None:
    need(leaves, measuring)
    _, tree, _ = grown(leaves, impl=impl)
    key = [0, leaves // 2 + 1, leaves // 2 + 1, leaves // 2 + 1, 7, 7]
    describe(benchmark, "match", leaves, impl)
    result = benchmark(tree.match, key)
    assert result.length == DEPTH, f"match found {result.length} of {DEPTH} cached tokens"


@pytest.mark.benchmark_suite
@pytest.mark.parametrize("leaves", LEAVES)
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_radix_insert_a_key_sharing_its_first_pages(benchmark: Any, measuring: bool, leaves: int, impl: str) -> None:
    need(leaves, measuring)
    alloc, tree, counter = grown(leaves, impl=impl)

    def round_() -> None:
        key = [0, 1, 1, 1, counter[0]]  # splits nothing after the first round: a new leaf under a cached path
        counter[0] += 1
        slots = alloc.alloc(len(key)) or []
        have = tree.insert(key, slots)
        alloc.free(slots[:have])
        tree.evict(1)  # keep the allocator from running dry: the oldest leaf goes

    describe(benchmark, "insert", leaves, impl)
    benchmark(round_)
