"""Benchmarks of chapter 11's tier store, the oracle beside vLLM's ``CPUOffloadingManager``, per call.

A tier of 4,096 slots under lru or arc serves a stream of requests of 32 blocks each, drawn so that
most share a prefix with an earlier one and the tier evicts steadily (the keys of 64 prefixes of
32 blocks, each request one prefix cut at a random depth and extended by fresh blocks). Each
round is one request as vLLM's connector serves it: ``lookup`` of each key until the first miss,
``prepare_load`` and ``complete_load`` of the hits, ``prepare_store`` and ``complete_store`` of the
rest, ``on_request_finished``. The ``lookup`` benchmark times the lookups of a round alone.

Where vLLM imports (``nox -s bench-peers``) the same rounds run on its manager through its own
calls and keys (``OffloadKey`` bytes, a ``ReqContext`` per request), not through the conformance
adapter, whose conversions would add to vLLM's time.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvref.oracle.tiers import OracleTierStore

CAPACITY = 4_096
BLOCKS = 32
ROUNDS = 2_000


def implementations() -> list[str]:
    """The oracle, and vLLM's CPUOffloadingManager where it imports."""
    try:
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: F401
    except Exception:  # vLLM absent, or a dependency of it
        return ["oracle"]
    return ["oracle", "vllm"]


IMPLEMENTATIONS = implementations()


def request_keys(seed: int = 0) -> list[list[int]]:
    """``ROUNDS`` requests of ``BLOCKS`` keys: a cut of one of 64 shared prefixes, then fresh keys."""
    draw = random.Random(seed)
    prefixes = [[1_000_000 * p + b for b in range(BLOCKS)] for p in range(64)]
    fresh = iter(range(10**9, 2 * 10**9))
    requests = []
    for _ in range(ROUNDS):
        cut = draw.randint(0, BLOCKS)
        requests.append(prefixes[draw.randrange(64)][:cut] + [next(fresh) for _ in range(BLOCKS - cut)])
    return requests


class OracleDriver:
    """kvref's oracle tier store, called as a connector would."""

    def __init__(self, policy: str) -> None:
        self.tier = OracleTierStore(CAPACITY, policy=policy)

    def lookups(self, keys: list[int]) -> int:
        hits = 0
        for key in keys:
            if self.tier.lookup(key) != "hit":
                break
            hits += 1
        return hits

    def serve(self, request: int, keys: list[int]) -> None:
        hits = self.lookups(keys)
        if hits:
            self.tier.prepare_load(keys[:hits], request=request)
            self.tier.complete_load(keys[:hits], request=request)
        plan = self.tier.prepare_store(keys[hits:], request=request)
        if plan is not None:
            self.tier.complete_store(plan.keys, request=request)
        self.tier.finish_request(request)


class VllmDriver:
    """vLLM 0.32's ``CPUOffloadingManager``, called as its ``OffloadingConnector`` calls it."""

    def __init__(self, policy: str) -> None:
        from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

        self.manager = CPUOffloadingManager(CAPACITY, cache_policy=policy)
        self.context_class = ReqContext
        self.hit = LookupResult.HIT
        self.make_key = make_offload_key
        self.scratch = ReqContext(req_id="lookups")
        self.keys: dict[int, Any] = {}

    def key_list(self, keys: list[int]) -> list[Any]:
        """The engine's keys; made once per integer, as the connector makes them once per block."""
        made = self.keys
        out = []
        for key in keys:
            found = made.get(key)
            if found is None:
                found = made[key] = self.make_key(key.to_bytes(16, "big"), 0)
            out.append(found)
        return out

    def lookups(self, keys: list[Any], context: Any = None) -> int:
        hits = 0
        for key in keys:
            if self.manager.lookup(key, context or self.scratch) != self.hit:
                break
            hits += 1
        return hits

    def serve(self, request: int, keys: list[Any]) -> None:
        context = self.context_class(req_id=str(request))
        self.manager.on_new_request(context)
        hits = self.lookups(keys, context)
        if hits:
            self.manager.prepare_load(keys[:hits], context)
            self.manager.complete_load(keys[:hits], context)
        output = self.manager.prepare_store(keys[hits:], context)
        if output is not None:
            self.manager.complete_store(output.keys_to_store, context)
        self.manager.on_request_finished(context)


def driver(name: str, policy: str) -> OracleDriver | VllmDriver:
    return OracleDriver(policy) if name == "oracle" else VllmDriver(policy)


def prepared(name: str, policy: str) -> tuple[OracleDriver | VllmDriver, list[Any]]:
    """A driver and the requests in its own keys (vLLM's bytes made before the clock starts)."""
    tier = driver(name, policy)
    requests: list[Any] = request_keys()
    if isinstance(tier, VllmDriver):
        requests = [tier.key_list(keys) for keys in requests]
    return tier, requests


@pytest.mark.rule("TIER-1104", "TIER-1107", "TIER-1112", "TIER-1116", "TIER-1120")
@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_bench_tier_request_rounds(benchmark: Any, implementation: str, policy: str) -> None:
    """2,000 requests served one after the other: lookups, a load of the hits, a store of the rest, the end."""

    def serve_all(tier: Any, requests: list[Any]) -> None:
        for number, keys in enumerate(requests):
            tier.serve(number, keys)

    benchmark.extra_info.update({"implementation": implementation, "policy": policy, "rounds": ROUNDS})
    benchmark.pedantic(serve_all, setup=lambda: (prepared(implementation, policy), {}), rounds=3)


@pytest.mark.rule("TIER-1103")
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_bench_tier_lookups(benchmark: Any, implementation: str) -> None:
    """The lookups of 2,000 requests against a tier the same requests filled."""
    tier, requests = prepared(implementation, "lru")
    for number, keys in enumerate(requests):
        tier.serve(number, keys)
    benchmark.extra_info.update({"implementation": implementation, "policy": "lru", "rounds": ROUNDS})
    benchmark(lambda: [tier.lookups(keys) for keys in requests])
