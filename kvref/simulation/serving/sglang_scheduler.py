"""The serving replay on SGLang's own scheduler: ``sglang.srt.managers.scheduler.Scheduler`` with its own
``UnifiedRadixCache``, token allocator and request pool, driven on a CPU without a model (TRACE-1054).

SGLang's ``Scheduler.__init__`` starts process groups, a model worker and ZeroMQ sockets, so the
scheduler is made with ``object.__new__`` and given what its scheduling code reads: SGLang's own
objects where they only keep books (``ReqToTokenPool``, ``TokenToKVPoolAllocator`` or
``PagedTokenToKVPoolAllocator``, ``UnifiedRadixCache`` as its cache registry builds it for a
full-attention model, and, from SGLang's own ``init_running_status``, ``init_schedule_policy`` and
``init_batch_result_processor``, its waiting queue, running batch, ``SchedulePolicy``,
``NewTokenRatioTracker`` and batch result processor), the published ``ServerArgs`` SGLang's
scheduling reads its switches from, and inert stand-ins for telemetry, inter-process channels and
GPU-only parts. Each step is one turn of SGLang's ``event_loop_normal`` (the loop without overlap):
``get_next_batch_to_run``, a model run replaced by the output a model would give (for each
request, the next token of its recorded output), and ``process_batch_result``. SGLang runs a
prefill batch or a decode batch in a step, never both; the clock advances by the step model
(TRACE-1033) on the tokens the batch ran.

Nothing SGLang decides is recomputed: a request's cached tokens are SGLang's ``cached_tokens``
(what its server reports in ``meta_info``), its preemptions its ``retraction_count``, its first
token the step whose batch result gave it one, evictions the pages its radix cache's
``BlockRemoved`` events name. SGLang is imported only here, only when this replay runs.
"""

from __future__ import annotations

import logging
import time
import warnings
from array import array
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from kvref.contract.errors import InvalidValueError
from kvref.simulation.replay import warmup_cut
from kvref.simulation.serving.model import StepModel
from kvref.simulation.serving.results import RequestRecord, ServingResult, engine_result
from kvref.simulation.serving.vllm_scheduler import prompt_token_ids
from kvref.simulation.serving.workload import ServingWorkload

__all__ = ["SglangSchedulerReplay", "sglang_version"]

#: How to install what the replay imports (SGLang's wheel without its CUDA pins, then what it imports).
INSTALL = (
    "pip install --no-deps sglang==0.5.23, then its pure-Python imports as noxfile.py's SGLANG_IMPORTS, "
    "SGLANG_RADIX_IMPORTS and SGLANG_SCHEDULER_IMPORTS list them (nox -s sim-to-real installs them all)"
)


def sglang_version() -> str:
    """The installed SGLang's version; refuses with how to install it where there is none (TRACE-1054)."""
    try:
        return version("sglang")
    except PackageNotFoundError:
        raise InvalidValueError("TRACE-1054", f"--engine sglang drives SGLang's own scheduler: {INSTALL}") from None


#: The switches of ``Scheduler.__init__`` this replay leaves off: priorities, LoRA, overlap, hierarchical
#: and external caches, hybrid models, data-parallel synchronisation.
_FEATURES_OFF = (
    "enable_priority_scheduling",
    "abort_on_priority_when_disabled",
    "schedule_low_priority_values_first",
    "enable_lora",
    "enable_overlap",
    "enable_overlap_mlx",
    "enable_pdmux",
    "enable_hierarchical_cache",
    "enable_lmcache",
    "enable_session_radix_cache",
    "enable_hicache_storage",
    "enable_unified_cache_external_linker",
    "enable_decode_hicache",
    "enable_hisparse",
    "require_mlp_sync",
    "enable_priority_preemption",
    "is_hybrid_swa",
    "is_hybrid_ssm",
    "enable_fpm",
    "_sched_idled",
)
#: What ``Scheduler.__init__`` would make and this replay has none of: its model worker and draft
#: worker, tokenizer, telemetry, hooks, limits left unset, and no chunked request yet.
_PARTS_ABSENT = (
    "cur_batch_for_debug",
    "max_new_tokens_limit",
    "dllm_config",
    "truncation_align_size",
    "sliding_window_size",
    "hisparse_coordinator",
    "decode_offload_manager",
    "draft_worker",
    "tokenizer",
    "max_queued_requests",
    "metrics_collector",
    "scheduler_stage_metrics",
    "load_snapshot_writer",
    "rust_server",
    "_prev_step",
    "_prev_prefill_end_ts",
    "_pause_started_at",
    "scripted_scheduler_hook",
    "min_free_slots_delayer",
    "dynamic_chunk_sizer",
    "lora_drainer",
    "future_map",
    "model_worker",
    "chunked_req",
    "_pending_chunked_abort_req",
)


class _Inert:
    """A stand-in for a part SGLang's scheduler reports to but this replay has none of (metrics,
    output streaming, load publishing, profiling): every attribute is another inert part, every
    call returns None, and it is false. ``values`` are attributes read as numbers."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __bool__(self) -> bool:
        return False


class SglangSchedulerReplay:
    """Replay ``workload`` through SGLang's ``Scheduler`` with ``capacity`` usable blocks (TRACE-1054).

    The workload's block size is SGLang's ``page_size`` and its KV pool holds ``capacity`` pages.
    ``model`` gives the limits: ``max_num_seqs`` is ``max_running_requests`` (and the request
    pool's rows), ``max_num_batched_tokens`` is ``max_prefill_tokens`` and, with chunked prefill,
    ``chunked_prefill_size`` (without, ``-1``), ``max_model_len`` the model's context length; its
    costs time the steps. SGLang retracts a request by recompute, so ``model.preemption`` must be
    ``"recompute"``; its admission is its own (``new_token_ratio``), so ``reserve_full_sequence``
    has no meaning here. ``prefix_caching=False`` is SGLang's ``disable_radix_cache``.
    Everything else is SGLang's default (``schedule_policy`` ``fcfs``, ``radix_eviction_policy``
    ``lru``, ``schedule_conservativeness`` 1.0). ``warmup`` and ``progress`` are as in
    :class:`~kvref.simulation.serving.ServingReplay`.
    """

    def __init__(
        self,
        workload: ServingWorkload,
        capacity: int,
        model: StepModel,
        *,
        prefix_caching: bool = True,
        warmup: float = 0.0,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        if type(capacity) is not int or capacity < 1:
            raise InvalidValueError("TRACE-1030", f"capacity must be a positive integer, got {capacity!r}")
        if model.preemption != "recompute":
            raise InvalidValueError(
                "TRACE-1054",
                f"SGLang's scheduler retracts by recompute; preemption {model.preemption!r} is not its own",
            )
        self.version = sglang_version()
        self.workload = workload
        self.capacity = capacity
        self.model = model
        self.prefix_caching = prefix_caching
        self.first_counted = warmup_cut(warmup, len(workload.requests))
        self._progress = progress
        self._records: list[RequestRecord] = []

    def records(self) -> tuple[RequestRecord, ...]:
        """What each finished request met, in workload order, warm-up included (TRACE-1055)."""
        return tuple(sorted(self._records, key=lambda r: r.index))

    @property
    def context_length(self) -> int:
        """The model's context length as SGLang is given it: ``max_model_len``."""
        return self.model.max_model_len

    def longest_request(self) -> int:
        """The most tokens a request of the workload has, prompt and output."""
        return max((s.prompt_length + s.output_length for s in self.workload.requests), default=1)

    def _publish_server_args(self) -> Any:
        """SGLang's ``ServerArgs`` for this replay, published as its scheduler process publishes them."""
        from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
        from sglang.srt.server_args import ServerArgs

        model = self.model
        args = ServerArgs(
            model_path="dummy",  # SGLang reads no model config for this name
            device="cpu",
            page_size=self.workload.block_size,
            chunked_prefill_size=model.max_num_batched_tokens if model.chunked_prefill else -1,
            max_prefill_tokens=model.max_num_batched_tokens,
            max_running_requests=model.max_num_seqs,
            disable_radix_cache=not self.prefix_caching,
            disable_overlap_schedule=True,  # event_loop_normal: one batch in flight
        )
        reset_context()
        publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None))
        return args

    def _request(self, scheduler: Any, index: int) -> Any:
        """SGLang's ``Req`` for a plain text request, as its ``handle_generate_request`` builds it:
        greedy, ``max_new_tokens`` the recorded output's length, no stop token."""
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        spec = self.workload.requests[index]
        sampling = SamplingParams(max_new_tokens=max(1, spec.output_length), temperature=0.0, ignore_eos=True)
        sampling.normalize(None)
        sampling.verify(scheduler.model_config.vocab_size)
        prompt = array("q", prompt_token_ids(spec, self.workload.block_size))
        request = Req(f"r{index}", "", prompt, sampling, vocab_size=scheduler.model_config.vocab_size)
        request.tokenizer = None
        scheduler.init_req_max_new_tokens(request)
        return request

    def run(self) -> ServingResult:
        """Replay every request to completion (or rejection) and return what was measured (TRACE-1039, TRACE-1054)."""
        logging.getLogger("sglang").setLevel(logging.ERROR)
        from kvref.simulation.sglang_imports import stand_in_torchvision

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SGLang's import warns of kernels it has only for GPUs
            stand_in_torchvision()
            scheduler = _cpu_scheduler(self, self._publish_server_args())
        return self._replay(scheduler)

    def _next_tokens(self, batch: Any) -> list[int]:
        """What a model would sample for each request of ``batch``: the next token of its recorded
        output (TRACE-1038)."""
        specs = self.workload.requests
        tokens = []
        for request in batch.reqs:
            index = int(request.rid[1:])
            position = len(request.output_ids)
            spec = specs[index]
            tokens.append(spec.output_token(index, position) if position < spec.output_length else 0)
        return tokens

    def _replay(self, scheduler: Any) -> ServingResult:
        """The steps of :meth:`run` on ``scheduler``."""
        workload = self.workload
        specs = workload.requests
        page = workload.block_size
        model = self.model
        total = len(specs)
        allocator, tree = scheduler.token_to_kv_pool_allocator, scheduler.tree_cache
        pool_tokens = scheduler.max_total_num_tokens
        live: dict[str, tuple[int, Any]] = {}
        running: dict[str, int] = {}  # admitted requests: their retraction count at the admission
        first: dict[int, tuple[int, int]] = {}
        admitted: dict[int, int] = {}
        now = steps = rejected = nxt = evicted = 0
        prefill_computed = prefill_saved = peak = in_use_time = 0
        timeline: list[tuple[int, int]] = []
        started = time.perf_counter()
        while nxt < total or live:
            while nxt < total and specs[nxt].arrival_us <= now:
                request = self._request(scheduler, nxt)
                if len(request.origin_input_ids) >= scheduler.max_req_input_len:  # SGLang aborts it
                    rejected += 1
                    if self._progress:
                        self._progress(1, total)
                else:
                    scheduler.add_request(request)
                    live[request.rid] = (nxt, request)
                nxt += 1
            if not live:  # idle: the clock moves to the next arrival (TRACE-1031)
                now = specs[nxt].arrival_us
                continue
            batch = scheduler.next_batch()
            if batch is None:
                if nxt >= total:
                    stuck = ", ".join(sorted(live)[:5])
                    raise InvalidValueError(
                        "TRACE-1054",
                        f"SGLang's scheduler ran nothing with {len(live):,} requests left ({stuck}) and none to "
                        "arrive: it would never finish them",
                    )
                now = specs[nxt].arrival_us
                continue
            prefill = decode = 0
            if batch.forward_mode.is_extend():
                for request in batch.reqs:
                    prefill += request.extend_len
                    if running.get(request.rid) != request.retraction_count:  # admitted in this batch
                        running[request.rid] = request.retraction_count
                        prefill_saved += request.prefix_len
                        admitted.setdefault(live[request.rid][0], now)
            else:
                decode = len(batch.reqs)
            outputs_before = {request.rid: len(request.output_ids) for request in batch.reqs}
            in_use = (pool_tokens - allocator.available_size() - tree.evictable_size()) // page
            duration = model.duration_us(prefill, decode)
            steps += 1
            in_use_time += in_use * duration
            peak = max(peak, in_use)
            if not timeline or timeline[-1][1] != in_use:
                timeline.append((now, in_use))
            now += duration
            prefill_computed += prefill
            scheduler.finish_batch(batch, self._next_tokens(batch))
            evicted += _removed_pages(tree)
            for request in batch.reqs:
                index = int(request.rid[1:])
                if index not in first and len(request.output_ids) > outputs_before[request.rid]:
                    first[index] = (steps, now)
                if request.finished() and request.rid in live:
                    del live[request.rid]
                    running.pop(request.rid, None)
                    step, at = first[index]
                    self._records.append(
                        RequestRecord(index, request.cached_tokens, request.retraction_count, step, at)
                    )
                    if self._progress:
                        self._progress(1, total)
        seconds = time.perf_counter() - started
        tally = {"steps": steps, "now": now, "rejected": rejected, "peak": peak, "in_use_time": in_use_time}
        tally.update(prefill_computed=prefill_computed, prefill_saved=prefill_saved, evictions=evicted)
        return self._result(tally, timeline, admitted, seconds)

    def _result(
        self, tally: dict[str, int], timeline: list[tuple[int, int]], admitted: dict[int, int], seconds: float
    ) -> ServingResult:
        return engine_result(
            self.workload,
            self.records(),
            tally,
            capacity=self.capacity,
            backend=f"sglang {self.version}",
            policy="radix-lru" if self.prefix_caching else "none",
            first_counted=self.first_counted,
            timeline=timeline,
            admitted=admitted,
            seconds=seconds,
        )


def _cpu_scheduler(replay: SglangSchedulerReplay, server_args: Any) -> Any:
    """SGLang's ``Scheduler`` for ``replay``, its constructor replaced by one that builds its pools, radix
    cache and scheduling state on the CPU and no model worker (TRACE-1054)."""
    import torch
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.runtime_context import get_context, get_parallel, get_schedule
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    class CpuScheduler(Scheduler):  # type: ignore[misc]
        """SGLang's ``Scheduler`` whose scheduling code runs as it is; only its constructor is this one."""

        running_batch: Any  # set by SGLang's init_running_status
        last_batch: Any

        def __init__(self) -> None:
            self.server_args = server_args
            schedule = get_schedule()
            page = replay.workload.block_size
            tokens = replay.capacity * page
            self.server_args = server_args
            # what Scheduler.__init__ reads from the published arguments: every feature off
            self.schedule_policy = schedule.schedule_policy
            self.page_size = schedule.page_size
            self.spec_algorithm = SpeculativeAlgorithm.from_string(None)
            self.disaggregation_mode = DisaggregationMode.NULL
            for name in _FEATURES_OFF:
                setattr(self, name, False)
            for name in _PARTS_ABSENT:
                setattr(self, name, None)
            self.forward_ct = self.processed_tokens_counter = self.priority_scheduling_preemption_threshold = 0
            self.total_prefill_busy_us = self.total_prefill_uncached_tokens = 0
            self.is_generation = True
            self.kv_shard_widening = 1
            self._pause_intervals: list[Any] = []
            self.decode_moment_totals = [0.0] * 6
            self.return_health_check_ipcs: list[Any] = []
            # the model: only what the batch code reads (no vocabulary check bites: any token id is taken)
            self.model_config = _model_config(replay.context_length)
            # the memory pools as SGLang's model runner makes them, on the CPU; a request pool row holds
            # the longest request of the workload (its width changes no decision, only memory)
            rows = replay.model.max_num_seqs
            width = min(replay.context_length, replay.longest_request()) + 4
            if page == 1:
                allocator = TokenToKVPoolAllocator(tokens, torch.float16, "cpu", None, False)
            else:
                allocator = PagedTokenToKVPoolAllocator(tokens, page, torch.float16, "cpu", None, False)
            self.token_to_kv_pool_allocator = allocator
            self.req_to_token_pool = ReqToTokenPool(rows, width, "cpu", False)
            self.max_total_num_tokens = tokens
            self.max_running_requests = rows
            self.max_prefill_tokens = schedule.max_prefill_tokens
            # as SGLang's model worker reports them (tp_worker.get_worker_info)
            self.max_req_len = min(replay.context_length - 1, tokens - 1)
            self.max_req_input_len = self.max_req_len - 5
            self.device = "cpu"
            params = CacheInitParams(
                disable=not replay.prefix_caching,
                req_to_token_pool=self.req_to_token_pool,
                token_to_kv_pool_allocator=allocator,
                page_size=page,
                eviction_policy=server_args.radix_eviction_policy,
                enable_kv_cache_events=replay.prefix_caching,
                chunked_prefill_size=schedule.chunked_prefill_size,
            )
            params.tree_components = (ComponentType.FULL,)  # what its cache registry gives a full-attention model
            self.tree_cache = UnifiedRadixCache(params)
            self.disable_radix_cache = not replay.prefix_caching
            if not get_parallel().pp_max_micro_batch_size:  # as init_model_worker sets it
                get_context().override(
                    "scheduler.pp_max_micro_batch_size_default",
                    pp_max_micro_batch_size=max(rows // get_parallel().pp_size, 1),
                )
            # what the scheduler reports to, and the GPU-only parts: inert
            self.metrics_reporter = _Inert(
                enable_metrics=False, num_generated_tokens=0, forward_ct_decode=0, num_retracted_reqs=0
            )
            self.output_streamer = self.load_publisher = self.profiler_manager = _Inert()
            self.load_inquirer = _Inert(_get_num_pending_tokens=lambda **kwargs: 0)
            self.tp_worker = _Namespace(model_runner=_Namespace(attn_backend=object(), prefill_aware_swa=False))
            self.grammar_manager = _Namespace(has_waiting_grammars=lambda: False)
            self.dp_attn_adapter = _Namespace(
                maybe_prepare_mlp_sync_batch=lambda batch, need_sync=False: batch,
                maybe_convert_decode_to_extend=lambda batch: batch,
            )
            self.ngram_embedding_manager = _Namespace(prepare_for_forward=lambda batch, chunked_req=None: batch)
            # SGLang's own initialisers of its scheduling state
            self.init_running_status()
            self.chunked_prefill_size = schedule.chunked_prefill_size  # as init_chunked_prefill
            if self.chunked_prefill_size is not None and self.chunked_prefill_size <= 0:
                self.chunked_prefill_size = None
            self.prefill_decode_interval = self._prefill_decode_interval_remaining = 0
            self.prefill_decode_interval_min_bs = schedule.prefill_decode_interval_min_bs
            self.is_mixed_chunk = self.chunked_prefill_size is not None and schedule.enable_mixed_chunk
            self.init_schedule_policy()
            self.init_batch_result_processor()

        def add_request(self, request: Any) -> None:
            """What ``handle_generate_request`` ends with: the request into the waiting queue."""
            self._add_request_to_queue(request)

        def next_batch(self) -> Any:
            """``get_next_batch_to_run`` as ``event_loop_normal`` calls it; with none to run, the loop's idle marks."""
            plan = self.get_next_batch_to_run(running_batch=self.running_batch, last_batch=self.last_batch)
            self.running_batch = plan.running_batch
            if plan.batch_to_run is None:
                self._sched_idled = True
                self.last_batch = None
            return plan.batch_to_run

        def finish_batch(self, batch: Any, tokens: list[int]) -> None:
            """``run_batch``'s counters, ``tokens`` (one per request) as the model's output, then
            ``process_batch_result`` as ``event_loop_normal`` calls it."""
            self.forward_ct += 1
            batch.forward_iter = self.forward_ct
            batch.launch_ts = time.monotonic()
            batch.after_idle_gap = self._sched_idled
            self._sched_idled = False
            if batch.extend_num_tokens:
                self.processed_tokens_counter += batch.extend_num_tokens
            extending = batch.forward_mode.is_extend()
            result = GenerationBatchResult(
                logits_output=None,
                next_token_ids=torch.tensor(tokens, dtype=torch.int64),
                extend_input_len_per_req=[r.extend_len for r in batch.reqs] if extending else None,
                extend_logprob_start_len_per_req=None,
                can_run_cuda_graph=False,
            )
            self.process_batch_result(batch, result)
            self.last_batch = batch

    return CpuScheduler()


class _Namespace:
    """Named values, for the few parts of a model worker the scheduling code reads."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


def _model_config(context_length: int) -> Any:
    """What SGLang's batch code reads of a model's configuration: a vocabulary wider than any token
    id a workload gives, no encoder, no images, no end-of-sequence token of its own."""
    return _Namespace(
        vocab_size=1 << 62,
        is_encoder_decoder=False,
        is_multimodal=False,
        hf_eos_token_id=None,
        context_len=context_length,
        num_key_value_heads=1,
        is_hybrid_swa=False,
        think_end_ids=None,
        self_opened_think_start_ids=None,
    )


def _removed_pages(tree: Any) -> int:
    """The pages the radix cache's ``BlockRemoved`` events name since the last call (its events taken)."""
    removed = 0
    for event in tree.take_events() if hasattr(tree, "take_events") else ():
        if type(event).__name__ == "BlockRemoved":
            removed += len(event.block_hashes)
    return removed
