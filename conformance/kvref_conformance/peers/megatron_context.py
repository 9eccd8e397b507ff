"""Megatron-Core's ``DynamicInferenceContext`` request path, run for real on a CPU stand-in of the context.

Checked with ``megatron-core==0.19.2``. The context itself cannot be built without CUDA and a
model-parallel group (its constructor sizes CUDA buffers and graph metadata), but its request-path
methods need only its request tables and its ``KVBlockAllocator``. :class:`MegatronContextEngine`
makes a context object without running its constructor (``object.__new__``), gives it those
tables as CPU tensors, and then calls the context's own methods unmodified, in the order its
engine (``DynamicInferenceEngine``) calls them:

- admission: ``check_availability`` (its three answers must all be true), then ``add_request``
  with the whole prompt, or with a chunk of it (the engine's chunked prefill: one request at a
  time, its row kept between steps as ``chunked_prefill_request_id``);
- a step: ``update_requests(mask, new_tokens)``, which releases finished requests, pauses those
  whose last block is full, resumes and evicts paused ones; then the engine's
  ``prefix_cache_lru_clock += 1``.

Nothing is checked here: what the context does is what the suite sees. Read-only views
(:meth:`rows`, :meth:`allocator`) let the suite check chapter 07's context duties (REQ-740..).
Megatron hashes whole prompt blocks with its own ``compute_block_hashes_batched``; those are the
hashes its allocator registers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["MegatronContextEngine"]


class MegatronContextEngine:
    """The engine's loop around a real ``DynamicInferenceContext`` whose state lives on the CPU."""

    def __init__(
        self,
        *,
        block_size: int,
        num_blocks: int,
        paused_blocks: int,
        max_requests: int = 6,
        max_tokens: int = 256,
        max_sequence_length: int = 64,
        policy: str = "lru",
    ) -> None:
        import torch
        from megatron.core.inference.config import PrefixCachingEvictionPolicy
        from megatron.core.inference.contexts.dynamic_context import DynamicInferenceContext
        from megatron.core.inference.contexts.kv_block_allocator import KVBlockAllocator
        from megatron.core.inference.inference_request import DynamicInferenceRequest

        self.torch = torch
        c: Any = object.__new__(DynamicInferenceContext)
        int32 = torch.int32
        c.enable_prefix_caching = True
        c.prefix_caching_eviction_policy = (
            PrefixCachingEvictionPolicy.LRU if policy == "lru" else PrefixCachingEvictionPolicy.REF_ZERO
        )
        c.prefix_cache_lru_clock = 0
        c.prefix_cache_hits = c.prefix_cache_blocks_matched = 0
        c.prefix_cache_prefill_computed_tokens = c.prefix_cache_prefill_skipped_tokens = 0
        c.lifetime_prefill_token_count = 0
        c.step_count = 0
        c.block_size_tokens = block_size
        c.num_speculative_tokens = 0
        c.is_hybrid_model = False
        c.mamba_slot_allocator = None
        c.enable_chunked_prefill = True
        c.max_requests = max_requests
        c.max_tokens = max_tokens
        c.max_sequence_length = max_sequence_length
        c.max_kv_block_count = math.ceil(max_sequence_length / block_size)
        c.kv_block_allocator = KVBlockAllocator(
            context=c,
            total_count=num_blocks,
            paused_count=paused_blocks,
            enable_prefix_caching=True,
            prefix_caching_eviction_policy=c.prefix_caching_eviction_policy,
        )
        c.request_metadata_types = DynamicInferenceRequest.get_metadata_types()
        c.non_graph_attn_metadata = {}
        c.graph_attn_metadata = {}
        c.is_tensor_state_allocated = True
        c.request_ids = torch.full((max_requests,), -1, dtype=int32)
        for name in (
            "request_query_lengths",
            "request_in_prefill_status_tensor",
            "request_output_lengths",
            "request_kv_length_offsets",
            "request_kv_block_counts",
            "request_last_kv_block_id",
            "request_last_kv_block_offset",
        ):
            setattr(c, name, torch.zeros(max_requests, dtype=int32))
        c.request_to_kv_block_ids = torch.full((max_requests, c.max_kv_block_count), -1, dtype=int32)
        c.request_metadata = {label: torch.zeros(max_requests, dtype=dt) for label, dt in c.request_metadata_types}
        c.token_to_input_ids = torch.zeros(max_tokens, dtype=torch.int64)
        c.token_to_pos_ids = torch.zeros(max_tokens, dtype=torch.int64)
        c.token_to_block_idx = torch.full((max_tokens,), -1, dtype=torch.int64)
        c.token_to_local_position_within_kv_block = torch.zeros(max_tokens, dtype=int32)
        c.token_to_request_idx = torch.full((max_tokens,), -1, dtype=int32)
        c.token_to_position_in_request = torch.zeros(max_tokens, dtype=int32)
        c.total_request_count = c.paused_request_count = 0
        c.active_token_count = 0
        c.num_prefill_requests = 0
        c.chunked_prefill_request_id = -1
        c.paused_tokens = c.paused_speculative_tokens = None
        self.context = c
        self.block_size = block_size
        self._request_class = DynamicInferenceRequest
        self.requests: dict[int, Any] = {}
        self.chunked: Any = None  # the request being prefilled in chunks

    # ------------------------------------------------------------------ the engine's calls

    def make_request(self, request_id: int, tokens: Sequence[int], *, output_tokens: int = 8) -> Any:
        """A request as the engine builds one (its prompt's block hashes computed at once)."""
        from megatron.core.inference.sampling_params import SamplingParams

        return self._request_class(
            request_id=request_id,
            prompt_tokens=self.torch.tensor(list(tokens), dtype=self.torch.int64),
            sampling_params=SamplingParams(num_tokens_to_generate=output_tokens, termination_id=-1),
            block_size_tokens=self.block_size,
            enable_prefix_caching=True,
        )

    def admit(self, request: Any, chunk: int | None = None) -> bool:
        """The engine's admission: ``check_availability``, then ``add_request`` (a chunk of it when asked)."""
        c = self.context
        if not all(c.check_availability(request)):
            return False
        remaining = int(request.remaining_prompt_length)
        if chunk is None or chunk >= remaining:
            c.chunked_prefill_request_id = -1
            c.add_request(request)
            request.remaining_prompt_tokens = request.remaining_prompt_tokens.new_empty(0)
            self.chunked = None
        else:
            c.add_request(request, prefill_chunk_length=chunk)
            c.chunked_prefill_request_id = request.request_id
            request.remaining_prompt_tokens = request.remaining_prompt_tokens[chunk:]
            request.finished_chunk_token_count += chunk
            self.chunked = request
        self.requests[request.request_id] = request
        return True

    def step(self, finished: set[int], first_token: int = 100) -> None:
        """``update_requests`` after a forward pass in which ``finished`` requests ended; the clock moves on."""
        c, torch = self.context, self.torch
        active = c.request_ids[c.paused_request_count : c.total_request_count].tolist()
        mask = torch.tensor([0 if rid in finished else 1 for rid in active], dtype=torch.uint8)
        tokens = torch.arange(first_token, first_token + len(active), dtype=torch.int64)
        try:
            c.update_requests(mask, tokens)
        finally:
            c.step_count += 1
            c.prefix_cache_lru_clock += 1
        for rid in finished:
            self.requests.pop(rid, None)

    # ------------------------------------------------------------------ what the suite reads

    @property
    def allocator(self) -> Any:
        """Megatron's ``KVBlockAllocator``."""
        return self.context.kv_block_allocator

    def rows(self) -> dict[int, tuple[str, list[int]]]:
        """Each request row holding blocks: ``(kind, block ids)``, kind ``paused``, ``active`` or ``chunk``."""
        c = self.context
        out: dict[int, tuple[str, list[int]]] = {}
        for row in range(c.max_requests):
            ids = [b for b in c.request_to_kv_block_ids[row].tolist() if b != -1]
            rid = int(c.request_ids[row])
            if not ids:
                continue
            if row < c.paused_request_count:
                kind = "paused"
            elif row < c.total_request_count:
                kind = "active"
            else:
                kind = "chunk"
            out[rid] = (kind, ids)
        return out

    def registered_hashes(self, request_id: int) -> list[int]:
        """The block hashes Megatron computed for a request's prompt."""
        return list(self.requests[request_id].precomputed_block_hashes or [])
