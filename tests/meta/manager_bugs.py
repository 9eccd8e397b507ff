"""Planted bugs of chapter 07: the oracle manager, each with one bug from vLLM's or Megatron-Core's history.

Each is a backend the conformance suite loads by name (``tests.meta.manager_bugs:X``): the
oracle's pools, with a ``create_manager`` that builds the buggy manager over one. The meta-test
runs the manager suite (``-k Manager``) on each and requires a failure naming the rule.
"""

from __future__ import annotations

from typing import Any

from kvref.contract.manager import KVCacheBlocks
from kvref.contract.requests import Request
from kvref.oracle.backend import OracleBackend
from kvref.oracle.blockpool.pool import OracleBlockPool
from kvref.oracle.manager import RequestManager
from kvref.oracle.manager.groups import GroupTables


class LastTokenHit(RequestManager):
    """A prompt of whole blocks hits all of them, so no token is left to compute the logits from
    (vLLM had to add ``max_cache_hit_length = num_tokens - 1``)."""

    def _hit_bound(self, num_tokens: int) -> int:
        return num_tokens // self.block_size


class EvictableHitsNotCounted(RequestManager):
    """The fit check counts new blocks only, though pinning a cached hit takes it out of the free
    queue (vLLM's ``get_num_blocks_to_allocate`` had to count ``new_computed_blocks`` with ref 0)."""

    def _fits(self, rid: str, required: int, hits: list[list[int]], num_computed: int, *, capped: bool = False) -> bool:
        new = 0
        for g, group_hits in zip(self.groups, hits, strict=True):
            table = g.tables.get(rid)
            new += max(required - (len(table) if table is not None else len(group_hits)), 0)
        return new <= self.pool.num_available


class HitsPinnedOnRefusal(RequestManager):
    """The hits are touched before the fit check, and stay pinned when the allocation is refused
    (the reason vLLM appends the new computed blocks only after ``can_allocate``)."""

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        got = super().allocate_slots(
            request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, *args, **kwargs
        )
        if got is None and new_computed_blocks is not None and new_computed_blocks.num_blocks:
            self.pool.acquire(list(new_computed_blocks.blocks[0]), holder=f"{request.request_id}/touched")
        return got


class FreeHeadFirst(RequestManager):
    """Blocks go back in table order, so a request's head is evicted before its tail (vLLM frees
    ``reversed(blocks)``; an early version did not)."""

    def free(self, request: Request) -> None:
        for g in self.groups:
            table = g.tables.pop(request.request_id, None)
            g.num_cached.pop(request.request_id, None)
            if table:
                self.pool.free([b for b in table if b != 0], holder=request.request_id)
        super().free(request)


class PreemptionKeepsHits(RequestManager):
    """Preemption releases the blocks the request allocated but not the cached hits it pinned:
    they leak until the engine restarts (a release path that frees only "its own" blocks)."""

    def preempt(self, request: Request) -> None:
        hits = self.num_cached_blocks(request.request_id)
        table = self.get_block_ids(request.request_id)[0]
        super().preempt(request)
        if hits:
            self.pool.acquire(table[:hits], holder=f"{request.request_id}/leaked")


class PreemptedCountedAsNew(RequestManager):
    """A resumed request counts as a new one, inflating requests, queries and hits (vLLM split
    ``preempted_requests`` off for this)."""

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        saved, request.num_preemptions = request.num_preemptions, 0
        try:
            super().record_prefix_cache_stats(request, num_hits)
        finally:
            request.num_preemptions = saved


class ResetClaimedWhileInUse(RequestManager):
    """``reset_prefix_cache`` says True while blocks are in use and resets nothing, so an RLHF
    weight update keeps serving stale KV."""

    def reset_prefix_cache(self) -> bool:
        if self.pool.num_in_use:
            return True
        return super().reset_prefix_cache()


class DelayIgnored(RequestManager):
    """``delay_cache_blocks`` is ignored: blocks whose KV is still in flight from a remote prefill
    are cached at once and can be hit before they hold anything."""

    def allocate_slots(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("delay_cache_blocks", None)
        if len(args) > 5:
            args = (*args[:5], False, *args[6:])
        return super().allocate_slots(request, *args, **kwargs)


class ComputedBlocksTouched(RequestManager):
    """``get_computed_blocks`` pins the hits and releases them head first, which changes the
    eviction order of a lookup that must change nothing (a match used as a lookup)."""

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        found, computed = super().get_computed_blocks(request)
        ids = list(found.blocks[0])
        if ids:
            self.pool.acquire(ids, holder="probe")
            self.pool.free(ids, holder="probe")
        return found, computed


class EagleKeepsLastBlock(RequestManager):
    """With EAGLE the last matched block is kept, so the drafter lacks the hidden states it needs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.use_eagle = False


class MaxModelLenIgnored(RequestManager):
    """Lookahead slots are allocated past ``max_model_len``."""

    @property
    def max_model_len(self) -> int:
        return 1 << 30

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._max_model_len = 1 << 30


class DraftSlotsNotReserved(RequestManager):
    """The draft tokens scheduled beside a decode get no slots: blocks are sized for the verified
    tokens only, and the drafts' KV is written past the request's last block."""

    def allocate_slots(self, request: Request, num_new_tokens: int, *args: Any, **kwargs: Any) -> KVCacheBlocks | None:
        draft = kwargs.pop("num_draft_tokens", 0)
        return super().allocate_slots(request, num_new_tokens - draft, *args, **kwargs)


class HitsNotCountedAsCached(RequestManager):
    """The hits are not counted among the request's cached blocks, so they are registered again
    when the first new block fills (vLLM's ``num_cached_block`` bookkeeping)."""

    def allocate_slots(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        had = request.request_id in self.groups[0].tables
        got = super().allocate_slots(request, *args, **kwargs)
        if got is not None and not had:
            self.groups[0].num_cached[request.request_id] = 0
        return got


def _with_groups(group_class: type[GroupTables]) -> Any:
    """A RequestManager whose groups are ``group_class``."""

    class Manager(RequestManager):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.groups = [group_class(g.index, g.spec, g.pool, g.block_size) for g in self.groups]

    return Manager


class _NeverReleases(GroupTables):
    def release_skipped(self, rid: str, num_computed: int) -> None:
        return None


#: The window keeps every block it has left behind: a long request holds its whole history in a
#: sliding-window layer (what SWA models cost before vLLM's ``remove_skipped_blocks``).
WindowKeepsBlocks = _with_groups(_NeverReleases)


class _LeftmostRun(GroupTables):
    def find_hit(self, keys: list[int], max_blocks: int) -> list[int]:
        if self.window is None:
            return super().find_hit(keys, max_blocks)
        return self.pool.lookup(keys[:max_blocks])  # a prefix walk, as full attention finds its hit


#: The window's hit is found left to right, as full attention's is: a run behind a released block
#: is never found, and the hit stops where the window's first released block was.
WindowHitLeftToRight = _with_groups(_LeftmostRun)


class _SharedKeys(GroupTables):
    def keys(self, req: Request) -> list[int]:
        return req.block_hashes


#: Every group caches under the bare block hash (vLLM keys by hash and group id for this reason): a
#: window's block can answer a full-attention lookup, though it holds another layer's KV.
GroupsShareKeys = _with_groups(_SharedKeys)


class _MambaNeverReleases(GroupTables):
    def release_skipped(self, rid: str, num_computed: int) -> None:
        if not self.is_mamba:
            super().release_skipped(rid, num_computed)


#: The mamba group keeps the state block of every position it has passed, as an attention layer
#: keeps its KV: a long request holds one state per block where it needs one (REQ-757).
MambaKeepsEveryState = _with_groups(_MambaNeverReleases)


class _MambaPrefixHit(GroupTables):
    def find_hit(self, keys: list[int], max_blocks: int) -> list[int]:
        if not self.is_mamba:
            return super().find_hit(keys, max_blocks)
        return self.pool.lookup(keys[:max_blocks])  # a prefix walk: stops at the first released state


#: The mamba hit is found left to right, as full attention's: a state behind released ones is never
#: found, so a request recomputes what one cached state would have given it (REQ-758).
MambaHitLeftToRight = _with_groups(_MambaPrefixHit)


class _MambaTakesFreshStates(GroupTables):
    def blocks_to_take(self, rid: str, required: int, hits: list[int], num_computed: int) -> int:
        saved, self.cached_this_step = self.cached_this_step, set()
        try:
            return super().blocks_to_take(rid, required, hits, num_computed)
        finally:
            self.cached_this_step = saved


#: A request starts from a state another request cached in the same step, before that step has
#: written it (the case vLLM's ``cached_blocks_this_step`` guards): its recurrent state is garbage.
MambaStateFromThisStep = _with_groups(_MambaTakesFreshStates)


#: Each planted bug and the rule the suite must name.
MANAGER_BUGS: dict[str, str] = {
    "LastTokenHit": "REQ-701",
    "EvictableHitsNotCounted": "REQ-709",
    "HitsPinnedOnRefusal": "REQ-709",
    "FreeHeadFirst": "REQ-713",
    "PreemptionKeepsHits": "REQ-714",
    "PreemptedCountedAsNew": "REQ-716",
    "ResetClaimedWhileInUse": "REQ-715",
    "DelayIgnored": "REQ-711",
    "ComputedBlocksTouched": "REQ-706",
    "EagleKeepsLastBlock": "REQ-707",
    "MaxModelLenIgnored": "REQ-720",
    "HitsNotCountedAsCached": "REQ-710",
    "DraftSlotsNotReserved": "REQ-708",
    "WindowKeepsBlocks": "REQ-730",
    "WindowHitLeftToRight": "REQ-731",
    "GroupsShareKeys": "REQ-733",
    "MambaKeepsEveryState": "REQ-757",
    "MambaHitLeftToRight": "REQ-758",
    "MambaStateFromThisStep": "REQ-759",
}


def _backend(manager: type[RequestManager]) -> type[OracleBackend]:
    class PlantedManagerBackend(OracleBackend):
        name = manager.__name__

        def create_manager(
            self, num_blocks: int, *, policy: str = "lru", device: str | None = None, **settings: Any
        ) -> RequestManager:
            pool = OracleBlockPool(num_blocks, policy=policy, enable_events=settings["enable_kv_cache_events"])
            return manager(pool, **settings)

    PlantedManagerBackend.__name__ = PlantedManagerBackend.__qualname__ = manager.__name__ + "Backend"
    return PlantedManagerBackend


for _name in MANAGER_BUGS:
    globals()[_name] = _backend(globals()[_name])
