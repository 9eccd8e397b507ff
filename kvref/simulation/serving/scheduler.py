"""The serving replay: requests overlapping in time through one request manager (TRACE-1030..TRACE-1040).

:class:`ServingReplay` is a scheduler over a chapter 07 manager, driven as vLLM's V1 scheduler
drives its ``KVCacheManager``: each step first the running requests in admission order (their
prompt chunk or one decode token, within the token budget), preempting the most recently
admitted when a request cannot get its next block (or pausing it, as Megatron-Core does); then,
if nothing was preempted, waiting requests first come first served until one does not fit. What a
request hits, holds and caches is the manager's answer; the replay keeps only the clock and the
queues. Stretches of steps in which nothing but decoding happens are advanced in one move
(TRACE-1040).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kvref.contract.manager import KVCacheBlocks
from kvref.contract.requests import Request, RequestStatus
from kvref.oracle.manager import RequestManager
from kvref.simulation.replay import warmup_cut
from kvref.simulation.serving.model import StepModel
from kvref.simulation.serving.results import Percentiles, RequestRecord, ServingResult, thin_timeline
from kvref.simulation.serving.tiers import TierCascade, TierLoad
from kvref.simulation.serving.workload import ServedRequest, ServingWorkload

__all__ = ["ServingReplay"]

#: What a finished request's ``req`` becomes: a one-token request, so the finished keep no tokens.
_DONE = Request("finished", [0], block_size=1)


class _Live:
    """A request the replay has seen arrive: its manager request and what the scheduler keeps of it."""

    __slots__ = (
        "admitted_us",
        "appended",
        "arrival_us",
        "decoding",
        "first_token_step",
        "first_token_us",
        "generated",
        "hit_blocks",
        "hit_tokens",
        "index",
        "load",
        "load_tokens",
        "loaded",
        "paused",
        "preemptions",
        "ready_us",
        "req",
        "spec",
        "stored",
    )

    def __init__(self, index: int, spec: ServedRequest, req: Request) -> None:
        self.index = index
        self.spec = spec
        self.req = req
        self.arrival_us = spec.arrival_us
        self.generated = 0  # output tokens sampled
        self.appended = 0  # of them, appended to ``req`` (appending waits for the next manager call)
        self.decoding = False  # computed everything but the last sampled token
        self.paused = False
        self.admitted_us = -1
        self.first_token_us = -1
        self.first_token_step = -1
        self.preemptions = 0
        self.hit_tokens = -1
        self.hit_blocks = 0
        self.load: TierLoad | None = None  # a load from the tiers in flight (TIER-1127)
        self.ready_us = -1  # when it ends
        self.load_tokens = 0  # the tokens computed once it ends: the device hit and the loaded blocks
        self.loaded = False  # the request holds its blocks and waits to be scheduled after its load
        self.stored = 0  # leading blocks the request will not store into the tiers (TIER-1126)

    def catch_up(self) -> Request:
        """Append the output tokens sampled since the last call, and return the request (REQ-702).

        Tokens are appended lazily, before the manager next sees the request: a decode step that
        neither opens nor fills a block asks nothing of the manager (TRACE-1040).
        """
        req = self.req
        start, stop = self.appended, self.generated
        if stop > start:
            req.append_output_token_ids(self.spec.output_token_span(self.index, start, stop))
            self.appended = stop
        return req


@dataclass
class _Tally:
    """Counts over the whole replay."""

    prefill_computed: int = 0
    prefill_saved: int = 0
    preemptions: int = 0
    rejected: int = 0
    steps: int = 0
    peak_in_use: int = 0
    in_use_time: int = 0  # blocks x microseconds


def _is_decode(live: _Live, n: int) -> bool:
    """Whether ``n`` scheduled tokens are a decode token (TRACE-1033): the one token of a request that
    has computed all its tokens but the last sampled one, re-admitted after a preemption or not."""
    req = live.req
    return n == 1 and live.generated > 0 and req.num_computed_tokens == req.num_tokens - 1


class ServingReplay:
    """Replay ``workload`` through ``manager`` under ``model`` (TRACE-1030).

    ``warmup``: the fraction of requests, in arrival order, that run but are not counted
    (TRACE-1013). ``fast_forward=False`` steps one by one and asks the manager for every token (the
    definition TRACE-1040's shortcuts must equal); a manager with a sliding-window or mamba group is
    always stepped so. ``progress(done, total)`` is called as requests finish. ``tiers``: the
    tiers below the device pool (TIER-1126..TIER-1129).
    """

    def __init__(
        self,
        workload: ServingWorkload,
        manager: RequestManager,
        model: StepModel,
        *,
        warmup: float = 0.0,
        fast_forward: bool = True,
        progress: Callable[[int, int], None] | None = None,
        tiers: TierCascade | None = None,
    ) -> None:
        self.workload = workload
        self.tiers = tiers
        self.manager = manager
        self.model = model
        # A window (or mamba) group frees the blocks that slide out of it at any token, not only where a
        # block opens or fills: its steps are never quiet, so they run one by one (TRACE-1040).
        self.fast_forward = fast_forward and all(g.spec.window_tokens is None for g in manager.groups)
        self.first_counted = warmup_cut(warmup, len(workload.requests))
        self._progress = progress
        self._size = manager.block_size
        self._pools = manager.pools  # one, or one per KV cache group (REQ-735): every count sums them
        self._capacity = sum(p.num_usable for p in self._pools)
        # each pool's usable blocks and how many groups draw from it (TRACE-1037)
        self._pool_groups = [(p.num_usable, sum(g.pool is p for g in manager.groups)) for p in self._pools]
        self._waiting: deque[_Live] = deque()
        self._loading: list[_Live] = []  # admitted, waiting for their loads from the tiers (TIER-1127)
        self._running: list[_Live] = []
        self._finished: list[_Live] = []
        self._now = 0
        self._tally = _Tally()
        self._timeline: list[tuple[int, int]] = []

    @property
    def now_us(self) -> int:
        """The clock: the current step's start while it schedules, in microseconds (TRACE-1031)."""
        return self._now

    def running(self) -> list[tuple[str, bool]]:
        """The running requests in admission order, each with whether it is paused (TRACE-1036)."""
        return [(live.req.request_id, live.paused) for live in self._running]

    def records(self) -> tuple[RequestRecord, ...]:
        """What each finished request met, in workload order, warm-up included (TRACE-1050)."""
        return tuple(
            RequestRecord(live.index, live.hit_tokens, live.preemptions, live.first_token_step, live.first_token_us)
            for live in sorted(self._finished, key=lambda live: live.index)
        )

    # ------------------------------------------------------------------ the loop

    def run(self, *, backend: str = "oracle", policy: str = "") -> ServingResult:
        """Replay every request to completion (or rejection) and return what was measured (TRACE-1039)."""
        specs = self.workload.requests
        n = len(specs)
        nxt = 0
        pool = self.manager.pool
        caching = "prefix-cache" in pool.capabilities()
        evictions_before = sum(p.stats.evictions for p in self._pools) if caching else 0
        started = time.perf_counter()
        while nxt < n or self._waiting or self._running or self._loading:
            while nxt < n and specs[nxt].arrival_us <= self._now:
                self._arrive(nxt, specs[nxt])
                nxt += 1
            if self._loading:
                self._end_loads()
            if not (self._waiting or self._running):
                self._idle_until(self._next_event(specs[nxt].arrival_us if nxt < n else None))
                continue
            steady, duration = self._step()
            if not duration:  # idle until the next load ends or request arrives
                self._idle_until(self._next_event(specs[nxt].arrival_us if nxt < n else None))
            elif steady and self.fast_forward:
                self._skip_quiet_steps(duration, self._next_event(specs[nxt].arrival_us if nxt < n else None))
        seconds = time.perf_counter() - started
        evictions = (sum(p.stats.evictions for p in self._pools) if caching else 0) - evictions_before
        return self._result(backend, policy or getattr(pool.policy, "value", ""), evictions, seconds)

    def _next_event(self, arrival_us: int | None) -> int | None:
        """When the next request arrives or the next load ends, whichever is first; None if neither is due."""
        events = [live.ready_us for live in self._loading]
        if arrival_us is not None:
            events.append(arrival_us)
        return min(events) if events else None

    def _idle_until(self, when: int | None) -> None:
        """Move the clock to ``when`` with no step run, counting the blocks that loads hold meanwhile (TRACE-1039)."""
        if when is None or when <= self._now:
            return
        in_use = sum(p.num_in_use for p in self._pools)
        self._tally.in_use_time += in_use * (when - self._now)
        if not self._timeline or self._timeline[-1][1] != in_use:
            self._timeline.append((self._now, in_use))
        self._now = when

    def _arrive(self, index: int, spec: ServedRequest) -> None:
        """A request joins the waiting queue, or is rejected when it could never run (TRACE-1037)."""
        limit = self.model.max_model_len
        if not all(spec.fits(self._size, usable, limit, groups=n) for usable, n in self._pool_groups):
            self._tally.rejected += 1
            if self._progress:
                self._progress(1, len(self.workload.requests))
            return
        req = spec.make_request(index, self._size, self.workload.algorithm)
        self._waiting.append(_Live(index, spec, req))

    def _step(self) -> tuple[bool, int]:
        """One scheduler step (TRACE-1032..TRACE-1036); returns whether it was quiet and its length.

        It starts as vLLM's ``schedule`` does, with the manager's ``new_step_starts`` (REQ-759)."""
        manager = self.manager
        manager.new_step_starts()
        model = self.model
        size = self._size
        budget = model.max_num_batched_tokens
        running = self._running
        scheduled: list[tuple[_Live, int]] = []
        prefill = decode = 0
        preempted = False
        quiet = True
        pause = model.preemption == "pause"
        i = 0
        while i < len(running) and budget > 0:
            live = running[i]
            req = live.req
            if live.decoding and not live.paused and self.fast_forward:
                c = req.num_computed_tokens
                if c % size and (c + 1) % size:
                    # Neither opens nor fills a block: allocate_slots would return no blocks and
                    # change nothing (REQ-708, REQ-710), so it is not asked (TRACE-1040).
                    scheduled.append((live, 1))
                    decode += 1
                    budget -= 1
                    i += 1
                    continue
            req = live.catch_up()
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            got = manager.allocate_slots(req, n)
            if got is None and pause:
                if not live.paused:
                    live.paused = True
                    quiet = False
                i += 1
                continue
            while got is None:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is live:
                    break
                got = manager.allocate_slots(req, n)
            if got is None:
                break
            if live.paused:
                live.paused = False
            quiet = False  # a prompt chunk, a new block, or a block filled and cached
            if _is_decode(live, n):
                decode += n
            else:
                prefill += n
            scheduled.append((live, n))
            budget -= n
            i += 1
        if preempted or len(scheduled) < sum(1 for live in running if not live.paused):
            quiet = False
        any_paused = pause and any(live.paused for live in running)
        if not preempted and not any_paused:
            before = len(scheduled)
            budget = self._admit(scheduled, budget)
            for live, n in scheduled[before:]:
                quiet = False
                if _is_decode(live, n):
                    decode += n
                else:
                    prefill += n
        if pause and running and not scheduled:
            self._break_pause_deadlock()
            quiet = False
        if not scheduled and not preempted and self._loading:
            return False, 0  # nothing runs until a load ends or a request arrives: no step, no time (TIER-1127)
        if not scheduled and not running:
            holders = [live for live in self._waiting if live.loaded]
            if holders:  # loaded requests hold the blocks the queue's head needs: the last gives them back
                self._release_loaded(holders[-1])
                quiet = False
        duration = model.duration_us(prefill, decode)
        self._account(duration, 1)  # during the step: after its allocations, before its frees
        self._now += duration
        self._tally.prefill_computed += prefill
        if self._finish_step(scheduled):
            quiet = False
        return quiet, duration

    def _admit(self, scheduled: list[tuple[_Live, int]], budget: int) -> int:
        """Admit waiting requests first come first served until one does not fit (TRACE-1032); the budget left.

        Under ``reserve_full_sequence`` a request fits when blocks for all its tokens do, as vLLM asks;
        without ``chunked_prefill`` only when what it has left to compute fits the budget."""
        manager = self.manager
        waiting = self._waiting
        running = self._running
        whole = self.model.reserve_full_sequence
        chunked = self.model.chunked_prefill
        while waiting and budget > 0 and len(running) < self.model.max_num_seqs:
            live = waiting[0]
            req = live.req
            if live.loaded:  # its blocks are held and its loaded tokens computed (TIER-1127)
                if not chunked and req.num_tokens - req.num_computed_tokens > budget:
                    break
                n = min(req.num_tokens - req.num_computed_tokens, budget)
                if manager.allocate_slots(req, n, full_sequence_must_fit=whole) is None:
                    break
                waiting.popleft()
                running.append(live)
                live.loaded = False
                req.status = RequestStatus.RUNNING
                scheduled.append((live, n))
                budget -= n
                continue
            blocks, hit = manager.get_computed_blocks(req)
            load = self._plan_load(req, blocks, hit)
            if load is not None:
                if not self._start_load(live, blocks, hit, load):
                    break
                continue
            if not chunked and req.num_tokens - hit > budget:
                break
            n = min(req.num_tokens - hit, budget)
            got = manager.allocate_slots(req, n, hit, blocks, full_sequence_must_fit=whole)
            if got is None:
                break
            waiting.popleft()
            running.append(live)
            req.num_computed_tokens = hit
            req.status = RequestStatus.RUNNING
            self._tally.prefill_saved += hit
            if live.hit_tokens < 0:  # the first admission is the one counted (TRACE-1039)
                live.hit_tokens = hit
                live.hit_blocks = len(blocks.blocks[0]) if hit else 0
                live.admitted_us = self._now
            live.stored = max(live.stored, hit // self._size)
            scheduled.append((live, n))
            budget -= n
        return budget

    # ------------------------------------------------------------------ tiers

    def _plan_load(self, req: Request, blocks: KVCacheBlocks, hit: int) -> TierLoad | None:
        """What the tiers serve after the device hit, within the hit bound (TIER-1127)."""
        if self.tiers is None:
            return None
        bound = (req.num_tokens - 1) // self._size  # REQ-701: the last token is always computed
        return self.tiers.plan_load(req.block_hashes[:bound], len(blocks.blocks[0]) if hit else 0)

    def _start_load(self, live: _Live, blocks: KVCacheBlocks, hit: int, load: TierLoad) -> bool:
        """Take device blocks for the device hit and the loaded tokens and start the load; False if they do not fit."""
        tiers = self.tiers
        if tiers is None:
            return False
        req = live.req
        external = load.blocks * self._size
        got = self.manager.allocate_slots(
            req,
            0,
            hit,
            blocks,
            num_external_computed_tokens=external,
            delay_cache_blocks=True,
            full_sequence_must_fit=self.model.reserve_full_sequence,
        )
        if got is None:
            return False
        self._waiting.popleft()
        tiers.start_load(req.request_id, load, counted=live.index >= self.first_counted)
        live.load = load
        live.ready_us = self._now + load.load_us
        live.load_tokens = hit + external
        if live.hit_tokens < 0:
            live.hit_tokens = hit
            live.hit_blocks = len(blocks.blocks[0]) if hit else 0
            live.admitted_us = self._now
        live.stored = max(live.stored, hit // self._size + load.blocks)
        self._tally.prefill_saved += hit + external
        self._loading.append(live)
        return True

    def _release_loaded(self, live: _Live) -> None:
        """A queued request that holds its loaded blocks frees them and will recompute, as a preempted
        request does (TIER-1127, TRACE-1035); it keeps its place in the queue."""
        self.manager.preempt(live.catch_up())
        live.loaded = False
        live.preemptions += 1
        self._tally.preemptions += 1

    def _end_loads(self) -> None:
        """Loads that have ended: unpin, cache the blocks on the device, queue the requests first (TIER-1128)."""
        tiers = self.tiers
        if tiers is None:
            return
        done = [live for live in self._loading if live.ready_us <= self._now]
        for live in reversed(done):
            self._loading.remove(live)
            load = live.load
            req = live.req
            if load is not None:
                tiers.end_load(req.request_id, load)
            req.num_computed_tokens = live.load_tokens
            self.manager.cache_blocks(req, live.load_tokens)
            live.load = None
            live.loaded = True
            self._waiting.appendleft(live)

    def _preempt(self, live: _Live) -> None:
        """Free a running request to recompute later, at the front of the queue (REQ-714, TRACE-1035)."""
        self.manager.preempt(live.catch_up())
        live.decoding = False
        live.paused = False
        live.preemptions += 1
        self._waiting.appendleft(live)
        self._tally.preemptions += 1

    def _break_pause_deadlock(self) -> None:
        """Every running request is paused and none resumed: preempt the most recently admitted (TRACE-1036)."""
        self._preempt(self._running.pop())

    def _finish_step(self, scheduled: list[tuple[_Live, int]]) -> bool:
        """Count computed tokens, sample, finish (TRACE-1034); whether anything but decoding happened."""
        now = self._now
        eventful = False
        tiers = self.tiers
        for live, n in scheduled:
            req = live.req
            req.num_computed_tokens += n
            if tiers is not None:  # blocks this step filled go down to the tiers (TIER-1126)
                full = min(req.num_computed_tokens // self._size, len(req.block_hashes))
                if full > live.stored:
                    tiers.store(req.request_id, req.block_hashes[live.stored : full])
                    live.stored = full
            if not live.decoding and req.num_computed_tokens < req.num_tokens:
                continue
            spec = live.spec
            if live.first_token_us < 0:
                live.first_token_us = now
                live.first_token_step = self._tally.steps
                eventful = True
            if spec.output_length:
                live.generated += 1
            if live.generated >= spec.output_length:
                self._finish(live)
                eventful = True
                continue
            if not live.decoding:
                live.decoding = True
                eventful = True
        return eventful

    def _finish(self, live: _Live) -> None:
        req = live.req
        self.manager.free(req)
        if self.tiers is not None:
            self.tiers.finish(req.request_id)
        req.status = RequestStatus.FINISHED
        self._running.remove(live)
        live.req = _DONE  # what the request held is freed; its tokens need not stay in memory
        self._finished.append(live)
        if self._progress:
            self._progress(1, len(self.workload.requests))

    def _account(self, duration: int, steps: int) -> None:
        """Blocks in use during ``steps`` steps of ``duration`` starting now (TRACE-1039)."""
        in_use = sum(p.num_in_use for p in self._pools)
        tally = self._tally
        tally.steps += steps
        tally.in_use_time += in_use * duration * steps
        if in_use > tally.peak_in_use:
            tally.peak_in_use = in_use
        if not self._timeline or self._timeline[-1][1] != in_use:
            self._timeline.append((self._now, in_use))

    # ------------------------------------------------------------------ quiet stretches

    def _skip_quiet_steps(self, duration: int, next_arrival: int | None) -> None:
        """Advance the steps that would repeat the quiet step just run, in one move (TRACE-1040).

        A step repeats it while every running request decodes one token that neither opens nor
        fills a block nor is its last, no request arrives before the step starts, and the queue's
        head still does not fit (nothing was freed or taken). Each such step lasts ``duration``.
        """
        active = [live for live in self._running if not live.paused]
        if not active:
            return
        size = self._size
        steps = math.inf if next_arrival is None else max(0, -(-(next_arrival - self._now) // duration))
        for live in active:
            c = live.req.num_computed_tokens
            to_open = -c % size  # first step computing a block's first token
            to_fill = (size - 1 - c) % size  # first step computing a block's last token
            to_last = live.spec.output_length - live.generated - 1  # first step sampling the last token
            steps = min(steps, to_open, to_fill, to_last)
            if steps <= 0:
                return
        k = int(steps)
        for live in active:
            live.req.num_computed_tokens += k
            live.generated += k  # appended at the request's next manager call
        self._account(duration, k)
        self._now += k * duration

    # ------------------------------------------------------------------ result

    def _result(self, backend: str, policy: str, evictions: int, seconds: float) -> ServingResult:
        size = self._size
        counted = [live for live in self._finished if live.index >= self.first_counted]
        counted.sort(key=lambda live: live.index)
        tally = self._tally
        return ServingResult(
            source=self.workload.source,
            backend=backend,
            policy=policy,
            capacity=self._capacity,
            block_size=size,
            preemption=self.model.preemption,
            requests=len(self.workload.requests),
            counted_requests=len(counted),
            rejected=tally.rejected,
            blocks=sum(-(-live.spec.prompt_length // size) for live in counted),
            block_hits=sum(live.hit_blocks for live in counted),
            tokens=sum(live.spec.prompt_length for live in counted),
            token_hits=sum(live.hit_tokens for live in counted),
            prefill_tokens_computed=tally.prefill_computed,
            prefill_tokens_saved=tally.prefill_saved,
            preemptions=tally.preemptions,
            evictions=evictions,
            ttft_ms=Percentiles.of([(live.first_token_us - live.arrival_us) / 1000 for live in counted]),
            queue_ms=Percentiles.of([(live.admitted_us - live.arrival_us) / 1000 for live in counted]),
            peak_blocks_in_use=tally.peak_in_use,
            mean_blocks_in_use=tally.in_use_time / self._now if self._now else 0.0,
            makespan_ms=self._now / 1000,
            steps=tally.steps,
            seconds=seconds,
            outputs_hit=self.workload.outputs_hit,
            tiers=self.tiers.report() if self.tiers is not None else None,
            timeline=thin_timeline(self._timeline),
        )
