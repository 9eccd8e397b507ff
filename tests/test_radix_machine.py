"""Chapter 06 driven as a scheduler drives it: the oracle allocator and tree, with a shadow KV store.

The machine is the conformance suite's (:class:`kvref_conformance.suites.radix.RadixSchedulerMachine`:
admissions, finishes inside and outside free groups, aborts, evictions, resets, a shadow store of
what each slot holds, conservation after every step); here it runs on the oracle's tree directly,
with ``tree_class`` swapped for the planted bugs of ``tests/meta``.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvref.oracle.radix import OracleRadixCache, OracleSlotAllocator
from kvref_conformance.suites.radix import RadixSchedulerMachine


class SchedulerMachine(RadixSchedulerMachine):
    """The suite's machine over ``tree_class`` (the oracle here, a planted bug in ``tests/meta``)."""

    tree_class: type[OracleRadixCache] = OracleRadixCache
    page = 1
    checks_receipts = True
    checks_events = True

    def make(self, page: int, policy: str) -> tuple[Any, Any]:
        """The oracle's allocator and ``tree_class`` over it, with KV events."""
        alloc = OracleSlotAllocator(24 * page, page_size=page, sort=page == 1)
        return alloc, self.tree_class(alloc, policy=policy, enable_events=True)


class PagedSchedulerMachine(SchedulerMachine):
    """The same in pages of two slots."""

    page = 2


TestScheduler = pytest.mark.rule("RADIX-622", "RADIX-623", "RADIX-625", "RADIX-628")(SchedulerMachine.TestCase)
TestScheduler = pytest.mark.rule("RADIX-634")(TestScheduler)
TestPagedScheduler = pytest.mark.rule("RADIX-624", "RADIX-627", "RADIX-630")(PagedSchedulerMachine.TestCase)
