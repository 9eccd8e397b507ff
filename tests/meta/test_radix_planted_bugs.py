"""Meta-tests of chapter 06 and of the array surfaces (chapter 05's, and chapter 07's batched step over
the block surface): the suite and the scheduler machine catch every planted bug, naming its rule.

Allocator bugs run through the conformance suite's token-slot tests (``kvref conformance
--backend tests.meta.radix_bugs:X -- -k Slots``, `ci` profile, in a subprocess as any backend
would); tree bugs run under the scheduler machine of ``tests/test_radix_machine.py`` in process.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from kvref.contract.errors import KVRefError
from kvref.oracle.radix import OracleRadixCache
from tests.meta import radix_bugs
from tests.meta.array_surface_bugs import ARRAY_BUGS
from tests.meta.block_arrays_bugs import BLOCK_ARRAY_BUGS
from tests.meta.block_tables_bugs import BLOCK_TABLES_BUGS
from tests.meta.radix_bugs import EVENT_BUGS, ORDER_BUGS, SLOT_BUGS, TREE_BUGS
from tests.meta.test_planted_bugs import named_rules, run_suite
from tests.test_radix_machine import SchedulerMachine


@pytest.mark.rule("ERR-502")
@pytest.mark.parametrize(("bug", "rule_id"), sorted(SLOT_BUGS.items()))
def test_the_slot_suite_catches_the_planted_allocator_bug(tmp_path: Path, bug: str, rule_id: str) -> None:
    target = f"tests.meta.radix_bugs:{bug}"
    code, output, results = run_suite(target, tmp_path, "--no-shrink", "--", "-k", "Slots or SlotExtend")
    assert code != 0, f"the token-slot suite passed on {bug}, which breaks {rule_id}:\n{output[-2000:]}"
    named = named_rules(results)
    assert rule_id in named, f"the suite caught {bug} but named {sorted(named)}, not {rule_id}"


@pytest.mark.rule("RADIX-628")
@pytest.mark.parametrize(("bug", "rule_id"), sorted(ORDER_BUGS.items()))
def test_the_radix_suite_catches_the_planted_eviction_order_bug(tmp_path: Path, bug: str, rule_id: str) -> None:
    code, output, results = run_suite(f"tests.meta.radix_bugs:{bug}", tmp_path, "--no-shrink", "--", "-k", "TestRadix")
    assert code != 0, f"the radix suite passed on {bug}, which breaks {rule_id}:\n{output[-2000:]}"
    named = named_rules(results)
    assert rule_id in named, f"the suite caught {bug} but named {sorted(named)}, not {rule_id}"


@pytest.mark.rule("RADIX-635", "RADIX-636", "RADIX-637")
@pytest.mark.parametrize(("bug", "rule_id"), sorted(EVENT_BUGS.items()))
def test_the_radix_events_suite_catches_the_planted_event_bug(tmp_path: Path, bug: str, rule_id: str) -> None:
    code, output, results = run_suite(
        f"tests.meta.radix_bugs:{bug}", tmp_path, "--no-shrink", "--", "-k", "RadixEvents"
    )
    assert code != 0, f"the radix events suite passed on {bug}, which breaks {rule_id}:\n{output[-2000:]}"
    named = named_rules(results)
    assert rule_id in named, f"the suite caught {bug} but named {sorted(named)}, not {rule_id}"


@pytest.mark.rule("RADIX-622", "RADIX-624", "RADIX-625")
@pytest.mark.parametrize(("tree", "rule_id"), TREE_BUGS.items(), ids=[t.__name__ for t in TREE_BUGS])
def test_the_scheduler_machine_catches_the_planted_tree_bug(tree: type[OracleRadixCache], rule_id: str) -> None:
    machine: Any = type(f"Machine_{tree.__name__}", (SchedulerMachine,), {"tree_class": tree})
    with pytest.raises((AssertionError, KVRefError)) as caught:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=200,
                stateful_step_count=40,
                derandomize=True,
                deadline=None,
                report_multiple_bugs=False,
                suppress_health_check=list(HealthCheck),
            ),
        )
    message = str(caught.value)
    rules = set(re.findall(r"\[?(RADIX-\d{3})\]?", message))
    assert rule_id in rules, (
        f"the machine caught {tree.__name__} but its failure names {sorted(rules) or 'no rule'}, "
        f"not {rule_id}: {message[:600]}"
    )


@pytest.mark.rule("ERR-510", "ERR-511", "ERR-512", "ERR-513")
@pytest.mark.parametrize(("bug", "rule_id"), sorted(ARRAY_BUGS.items()))
def test_the_array_surface_suite_catches_the_planted_bug(tmp_path: Path, bug: str, rule_id: str) -> None:
    target = f"tests.meta.array_surface_bugs:{bug}"
    code, output, results = run_suite(target, tmp_path, "--no-shrink", "--", "-k", "SlotArrays")
    assert code != 0, f"the array-surface suite passed on {bug}, which breaks {rule_id}:\n{output[-2000:]}"
    named = named_rules(results)
    assert rule_id in named, f"the suite caught {bug} but named {sorted(named)}, not {rule_id}"


@pytest.mark.rule("ERR-511", "ERR-519", "POOL-108", "POOL-109")
@pytest.mark.parametrize(("bug", "rule_id"), sorted(BLOCK_ARRAY_BUGS.items()))
def test_the_block_arrays_suite_catches_the_planted_bug(tmp_path: Path, bug: str, rule_id: str) -> None:
    target = f"tests.meta.block_arrays_bugs:{bug}"
    code, output, results = run_suite(target, tmp_path, "--no-shrink", "--", "-k", "BlockArrays")
    assert code != 0, f"the block array-surface suite passed on {bug}, which breaks {rule_id}:\n{output[-2000:]}"
    named = named_rules(results)
    assert rule_id in named, f"the suite caught {bug} but named {sorted(named)}, not {rule_id}"


@pytest.mark.rule("REQ-750", "REQ-753", "REQ-755", "EVICT-402")
@pytest.mark.parametrize(("bug", "rule_id"), sorted(BLOCK_TABLES_BUGS.items()))
def test_the_block_tables_suite_catches_the_planted_bug(tmp_path: Path, bug: str, rule_id: str) -> None:
    target = f"tests.meta.block_tables_bugs:{bug}"
    code, output, results = run_suite(target, tmp_path, "--no-shrink", "--", "-k", "BlockTables")
    assert code != 0, f"the block-tables suite passed on {bug}, which breaks {rule_id}:\n{output[-2000:]}"
    named = named_rules(results)
    assert rule_id in named, f"the suite caught {bug} but named {sorted(named)}, not {rule_id}"


class _PlantedTreeTarget:
    """The reference's data plane beside a planted radix tree over the reference allocator."""

    name = "planted-tree"

    def __init__(self, tree: type[OracleRadixCache]) -> None:
        self.tree = tree

    def data_plane(self) -> Any:
        from kvref.oracle.data import DataPlane

        return DataPlane.reference()

    def create_radix(self, size: int, *, page_size: int = 1, **_: Any) -> Any:
        from kvref.oracle.radix.allocator import OracleSlotAllocator

        allocator = OracleSlotAllocator(size, page_size=page_size)
        return allocator, self.tree(allocator)


@pytest.mark.rule("RADIX-628", "DATA-801")
def test_the_radix_integrity_machine_sees_a_locked_prefix_evicted_under_a_running_request() -> None:
    from kvref_conformance.suites.data_integrity_radix import RadixIntegrityMachine

    machine: Any = type(
        "Integrity_EvictWhileLocked",
        (RadixIntegrityMachine,),
        {"target": _PlantedTreeTarget(radix_bugs.EvictWhileLocked)},
    )
    with pytest.raises((AssertionError, KVRefError)) as caught:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=200,
                stateful_step_count=40,
                derandomize=True,
                deadline=None,
                report_multiple_bugs=False,
                suppress_health_check=list(HealthCheck),
            ),
        )
    seen = str(caught.value)  # the running request's KV overwritten, or its freed slots refused at insert
    assert "[RADIX-628]" in seen or "[RADIX-626]" in seen, f"a locked prefix was evicted, but: {seen[:400]}"
