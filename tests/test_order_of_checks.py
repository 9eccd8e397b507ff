"""The order of checks is written once: the spec's table is the code's table (ERR-509)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvref.contract.checks import ORDER_OF_CHECKS, explain_register, order_table
from kvref.contract.errors import HashConflictError
from kvref.oracle import OracleBlockPool

SPEC = Path(__file__).resolve().parents[1] / "spec" / "05-errors.md"


@pytest.mark.rule("ERR-509")
def test_the_spec_prints_the_order_of_checks_the_code_uses() -> None:
    text = SPEC.read_text(encoding="utf-8")
    found = re.search(r"<!-- order-of-checks: begin -->\n(.*?)\n<!-- order-of-checks: end -->", text, re.S)
    assert found is not None, f"{SPEC.name} has no order-of-checks table between its markers"
    assert found.group(1).strip() == order_table(), (
        f"{SPEC.name}'s order-of-checks table differs from kvref.contract.checks.ORDER_OF_CHECKS; "
        "paste kvref.contract.checks.order_table() between the markers"
    )


@pytest.mark.rule("ERR-509")
def test_every_operation_that_changes_a_pool_has_an_order_of_checks() -> None:
    changing = {"allocate", "free", "acquire", "register", "match", "allocate_many", "free_many", "match_many"}
    assert changing <= set(ORDER_OF_CHECKS), f"operations without an order of checks: {changing - set(ORDER_OF_CHECKS)}"


@pytest.mark.rule("ERR-509", "PFX-306")
def test_an_explainer_that_finds_nothing_wrong_returns_and_one_that_does_raises_the_first() -> None:
    pool = OracleBlockPool(8)
    ids = pool.allocate(3, holder="r")
    explain_register(pool, ids, [1, 2, 3], None, "register")  # breaks no rule: returns
    assert pool.resident_hashes() == frozenset(), "explain_register changed the pool it explains"
    with pytest.raises(HashConflictError, match=r"^\[PFX-306\] register: hash 0x1 cannot be its own parent"):
        explain_register(pool, ids[:2], [1, 1], None, "register")
