"""What a decode step costs the oracle manager (REQ-722): pool work independent of the blocks held.

A proxy counts the pool calls the manager makes and the ids and hashes it passes; a decode
``allocate_slots`` of a request holding 4 blocks and of one holding 400 must do the same work.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from kvref.contract.requests import Request
from kvref.oracle import OracleBlockPool
from kvref.oracle.manager import RequestManager


class CountingPool:
    """Forwards to an oracle pool, counting each call and the length of every list argument."""

    def __init__(self, pool: OracleBlockPool) -> None:
        self._pool = pool
        self.work: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._pool, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.work[name] += 1
            for arg in (*args, *kwargs.values()):
                if isinstance(arg, (list, tuple)):
                    self.work[f"{name} items"] += len(arg)
            return attr(*args, **kwargs)

        return counted


def decode_work(prompt_blocks: int) -> Counter[str]:
    """Pool work of one decode step that fills a block, for a request of ``prompt_blocks`` whole blocks."""
    pool = CountingPool(OracleBlockPool(prompt_blocks + 8))
    manager = RequestManager(pool, block_size=4, max_model_len=4 * (prompt_blocks + 4))
    req = Request("r", list(range(4 * prompt_blocks - 1)), block_size=4, algorithm="xxh3_64")
    manager.allocate_slots(req, req.num_tokens)
    req.num_computed_tokens = req.num_tokens
    req.append_output_token_ids([1])
    pool.work.clear()
    manager.allocate_slots(req, 1, num_lookahead_tokens=4)
    return pool.work


@pytest.mark.rule("REQ-722")
def test_a_decode_step_costs_the_same_whatever_the_request_holds() -> None:
    small, large = decode_work(4), decode_work(400)
    assert small == large, f"[REQ-722] a decode step's pool work grew with the blocks held: {small} vs {large}"
