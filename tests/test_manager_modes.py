"""The oracle manager's modes beyond what vLLM 0.32 does: statistics counted at every lookup, and the
settings it refuses (REQ-716, REQ-730)."""

from __future__ import annotations

import pytest

from kvref.contract.errors import ConfigError
from kvref.contract.manager import FULL_ATTENTION, CacheGroup
from kvref.contract.requests import Request
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager


def manager(**settings: object) -> RequestManager:
    return RequestManager(OracleBlockPool(16), block_size=4, max_model_len=64, **settings)  # type: ignore[arg-type]


@pytest.mark.rule("REQ-716")
def test_seed_004_counts_every_lookup_and_ignores_the_admission_call() -> None:
    m = manager(stats_at="lookup")
    req = Request("a", list(range(9)), block_size=4)
    for _ in range(3):  # a request retried while it does not fit is counted at every try
        m.get_computed_blocks(req)
    m.record_prefix_cache_stats(req, 0)
    stats = m.make_prefix_cache_stats()
    assert stats is not None and (stats.requests, stats.queries) == (3, 27), (
        f"[REQ-716] stats_at='lookup': three lookups of 9 tokens must count 3 requests and 27 tokens, got {stats}"
    )


@pytest.mark.rule("REQ-716")
def test_vllm_032_counts_admissions_only() -> None:
    m = manager()
    req = Request("a", list(range(9)), block_size=4)
    for _ in range(3):
        m.get_computed_blocks(req)
    m.record_prefix_cache_stats(req, 0)
    stats = m.make_prefix_cache_stats()
    assert stats is not None and (stats.requests, stats.queries) == (1, 9), f"[REQ-716] got {stats}"


@pytest.mark.rule("REQ-730")
def test_a_window_beside_eagle_or_a_shared_last_block_is_refused() -> None:
    groups = (FULL_ATTENTION, CacheGroup.window(8))
    with pytest.raises(ConfigError):
        manager(groups=groups, use_eagle=True)
    with pytest.raises(ConfigError):
        manager(groups=groups, last_block="share")
    with pytest.raises(ConfigError):
        CacheGroup("sliding-window", 1)
    with pytest.raises(ConfigError):
        RequestManager(OracleBlockPool(16, reserved_ids=(5,)), block_size=4, max_model_len=64, groups=groups)
