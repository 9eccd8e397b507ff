"""The one-line summary of a pool's budgets (REQ-746), printed alike by every implementation with
paused holders: Megatron-Core's allocator's own ``str`` format, from kvref's counts."""

from __future__ import annotations

from kvref.contract.pausing import pool_budget_line
from kvref_conformance.suites.base import ConformanceSuite, requires, rule
from kvref_conformance.target import Target

__all__ = ["BudgetsSuite"]


@requires("pause")
class BudgetsSuite(ConformanceSuite):
    """REQ-746 on any pool with paused holders."""

    @rule("REQ-746", "POOL-113")
    def test_the_budget_line_counts_distinct_blocks_of_active_and_paused_holders(self, impl: Target) -> None:
        pool = self.pool(impl, 12, paused_limit=4)  # 11 usable: 7 active, 4 paused
        assert pool_budget_line(pool) == "using: total 0/11; active 0/7; paused 0/4", pool_budget_line(pool)
        a = pool.allocate(3, holder="a")
        b = pool.allocate(2, holder="b")
        pool.acquire(a[:2], holder="b")  # b shares a's first two blocks
        pool.pause("b")
        got = pool_budget_line(pool)
        assert got == "using: total 5/11; active 3/7; paused 4/4", (
            f"[REQ-746] a holds 3 blocks, the paused b holds 4 distinct blocks (2 of them a's): got {got!r}"
        )
        pool.resume("b")
        pool.free(b + a[:2], holder="b")
        got = pool_budget_line(pool)
        assert got == "using: total 3/11; active 3/7; paused 0/4", f"[REQ-746] b let go of everything: got {got!r}"
