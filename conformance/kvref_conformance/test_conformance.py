"""The suite as collected by ``pytest --pyargs kvref_conformance --kvref-backend NAME``.

Each class adopts one base class for the backend the plugin selected; kvref's own backends are
tested through exactly this module, as any third party's would be.
"""

from __future__ import annotations

from kvref_conformance.suites.block_arrays import BlockArraysSuite
from kvref_conformance.suites.block_tables import BlockTablesSuite
from kvref_conformance.suites.budgets import BudgetsSuite
from kvref_conformance.suites.context_duties import ContextDutiesSuite
from kvref_conformance.suites.cuda_graph import CudaGraphSuite
from kvref_conformance.suites.data_device import DataDeviceChecksSuite
from kvref_conformance.suites.data_device_states import DataDeviceStatesSuite
from kvref_conformance.suites.data_integrity import DataIntegritySuite
from kvref_conformance.suites.data_integrity_radix import DataIntegrityRadixSuite
from kvref_conformance.suites.data_plane import DataPlaneSuite
from kvref_conformance.suites.error_order import ErrorOrderSuite
from kvref_conformance.suites.errors import ErrorSuite
from kvref_conformance.suites.event_index import EventIndexSuite
from kvref_conformance.suites.eviction import EvictionSuite
from kvref_conformance.suites.hashing import HashingSuite
from kvref_conformance.suites.manager import ManagerSuite
from kvref_conformance.suites.manager_groups import ManagerGroupsSuite
from kvref_conformance.suites.manager_mamba import ManagerMambaSuite
from kvref_conformance.suites.manager_pools import ManagerPoolsSuite
from kvref_conformance.suites.pool import PoolSuite
from kvref_conformance.suites.prefix_cache import PrefixCacheSuite
from kvref_conformance.suites.radix import RadixCacheSuite
from kvref_conformance.suites.radix_events import RadixEventsSuite
from kvref_conformance.suites.replay import ReplaySuite
from kvref_conformance.suites.slot_arrays import SlotArraysSuite
from kvref_conformance.suites.slot_extend import SlotExtendSuite
from kvref_conformance.suites.slots import SlotAllocatorSuite
from kvref_conformance.suites.starting_over import StartingOverSuite
from kvref_conformance.suites.stateful import StatefulSuite
from kvref_conformance.suites.tiers import TierSuite


class TestPool(PoolSuite):
    """Chapter 01 on the selected backend."""


class TestHashing(HashingSuite):
    """Chapter 02 on the selected backend's own hashing, where it has one."""


class TestPrefixCache(PrefixCacheSuite):
    """Chapter 03 on the selected backend."""


class TestEventIndex(EventIndexSuite):
    """Chapter 03's event index, a router's rebuild of caches from their KV events, where offered."""


class TestEviction(EvictionSuite):
    """Chapter 04 on the selected backend."""


class TestErrors(ErrorSuite):
    """Chapter 05 on the selected backend."""


class TestErrorOrder(ErrorOrderSuite):
    """Chapter 05's order of checks, where the selected backend declares it."""


class TestCudaGraph(CudaGraphSuite):
    """CONF-908 with a real captured graph, where the selected backend's pools live on a CUDA device."""


class TestSlots(SlotAllocatorSuite):
    """Chapter 06's token-slot allocator, where the selected backend has one."""


class TestSlotExtend(SlotExtendSuite):
    """Chapter 06's step allocations that continue prefixes (alloc_extend, alloc_decode), where offered."""


class TestRadix(RadixCacheSuite):
    """Chapter 06's radix cache over its allocator, where the selected backend has one."""


class TestRadixEvents(RadixEventsSuite):
    """Chapter 06's KV events of the radix tree, one per page, where the backend reports them."""


class TestSlotArrays(SlotArraysSuite):
    """Chapter 06's allocator with the array surface (ERR-510..ERR-514), where the selected backend has one."""


class TestBlockArrays(BlockArraysSuite):
    """Chapter 01's block pool with the array surface (ERR-517..ERR-520), where the selected backend has one."""


class TestBlockTables(BlockTablesSuite):
    """Chapter 07's batched step over the block array surface (REQ-750..REQ-756), where the backend has one."""


class TestStartingOver(StartingOverSuite):
    """Chapters 01 and 04: evict ahead of an allocation and clear everything, where the backend offers them."""


class TestBudgets(BudgetsSuite):
    """Chapter 07's one-line summary of the budgets, on any pool with paused holders."""


class TestManager(ManagerSuite):
    """Chapter 07's request-level manager: the selected backend's own, or kvref's over its prefix cache."""


class TestManagerGroups(ManagerGroupsSuite):
    """Chapter 07's KV cache groups: full attention beside a sliding window."""


class TestManagerMamba(ManagerMambaSuite):
    """Chapter 07's mamba groups: full attention beside a mamba group (vLLM's MambaManager, mode "all")."""


class TestManagerPools(ManagerPoolsSuite):
    """Chapter 07 with one pool per KV cache group, each its own budget, where the backend offers it."""


class TestContextDuties(ContextDutiesSuite):
    """Chapter 07's context duties on an engine's own request path, where the selected backend has one."""


class TestReplay(ReplaySuite):
    """Chapter 10's one-call replay, where the selected backend has one."""


class TestStateful(StatefulSuite):
    """Differential state machines against the oracle, on the selected backend."""


class TestDataPlane(DataPlaneSuite):
    """Chapter 08's data plane on the selected backend's tensor library, where it has one."""


class TestDataDeviceChecks(DataDeviceChecksSuite):
    """Chapter 08's checks on the device (DATA-815..DATA-817), where the selected backend makes them."""


class TestDataDeviceStates(DataDeviceStatesSuite):
    """Chapter 08's device checks of the state pool (DATA-825), where the backend has them."""


class TestDataIntegrity(DataIntegritySuite):
    """Chapter 08 end to end: the selected backend's pool and data plane together."""


class TestDataIntegrityRadix(DataIntegrityRadixSuite):
    """Chapter 08 over chapter 06's radix cache and token-slot allocator, where the backend has them."""


class TestTiers(TierSuite):
    """Chapter 11's tier store, where the selected backend offers one."""
