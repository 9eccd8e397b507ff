"""NVIDIA Dynamo's KV router index fed the engines' recorded KV-event streams, beside kvref's.

A router such as Dynamo's decides where a request goes by how many of its leading blocks each
worker caches, which it learns from the workers' KV events. This script feeds each recorded
stream (by default the samples under ``tests/data/engine-events/``, from vLLM 0.32's scheduler and
SGLang 0.5.23's radix cache) to Dynamo's own index, ``dynamo.llm.RadixTree`` of
``ai-dynamo-runtime``, through the conformance suite's adapter
(:class:`kvref_conformance.peers.dynamo.DynamoEventIndex`), and to kvref's
:class:`~kvref.oracle.event_index.OracleEventIndex`, which counts copies (PFX-329). After every
message it asks both, for every chain of blocks the stream has stored so far, how many leading
blocks each worker holds (PFX-328). A difference is a finding about the stream or the consumer.

Each cache of the stream (rank, KV cache group, medium) is a worker of its own; a clear empties
every worker of its rank. Hashes go to both as unsigned 64-bit ints (vLLM's byte digests as
vLLM's own integer form takes them, SGLang's signed ones masked); token ids that do not fit 32 bits
are renumbered, one for one, as Dynamo hashes 32-bit ids. An event an index refuses (a parent or a
block it does not know) is counted, not fatal: Dynamo's indexer drops it and goes on, and so does
this script for kvref's.

    python scripts/dynamo_consumer.py [STREAM ...] [--out results/events-consumer-dynamo.md]

(``nox -s events-consumer`` installs ``ai-dynamo-runtime``, runs the suite's event-index tests on it
and runs this.)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kvref.contract.errors import KVRefError
from kvref.contract.event_index import IndexedBlock
from kvref.oracle.event_index import OracleEventIndex
from kvref.simulation.event_streams import CLEARED, MESSAGE, REMOVED, STORED, Hash, Scope, StreamEvent
from kvref.simulation.stream_files import read_stream
from kvref_conformance.peers.dynamo import MASK, DynamoEventIndex

SAMPLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "engine-events"


def unsigned(h: Hash) -> int:
    """An engine's hash as Dynamo takes it: an unsigned 64-bit int (bytes as vLLM's integer form reads them)."""
    return (int.from_bytes(h, "big") if isinstance(h, bytes) else h) & MASK


@dataclass
class Comparison:
    """What one stream gave: the chains compared, the differences, what each index refused."""

    stream: str
    events: int = 0
    pairs: int = 0
    lower: int = 0  # Dynamo saw fewer cached blocks than kvref's index
    higher: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    kvref_refused: Counter[str] = field(default_factory=Counter)
    first: str = ""


class DynamoBeside:
    """Dynamo's index and kvref's fed one stream event by event, each cache a worker."""

    def __init__(self) -> None:
        self.dynamo = DynamoEventIndex()
        self.kvref = OracleEventIndex()
        self.workers: dict[Scope, int] = {}
        self.tokens: dict[int, int] = {}  # a token id that does not fit 32 bits -> its stand-in
        self.stored: dict[tuple[Scope, int], tuple[int | None, IndexedBlock]] = {}  # -> (parent, block)

    def _tokens(self, ids: tuple[int, ...]) -> tuple[int, ...]:
        if not self.tokens and all(0 <= t < 2**32 for t in ids):
            return ids
        return tuple(self.tokens.setdefault(t, len(self.tokens)) for t in ids)

    def feed(self, event: StreamEvent, result: Comparison) -> None:
        """Apply one event to both indexes."""
        if event.kind == MESSAGE:
            return
        result.events += 1
        worker = self.workers.setdefault(event.scope, len(self.workers))
        refused_before = len(self.dynamo.refused)
        try:
            if event.kind == STORED:
                if event.token_ids is None or not event.block_size:  # kvref's own form carries no tokens
                    result.refused["stored: no token ids to hash"] += 1
                    return
                tokens, size = self._tokens(event.token_ids), event.block_size
                parent = None if event.parent is None else unsigned(event.parent)
                blocks = [
                    IndexedBlock(unsigned(h), tokens[i * size : (i + 1) * size]) for i, h in enumerate(event.hashes)
                ]
                above = parent
                for block in blocks:
                    self.stored[(event.scope, block.hash)] = (above, block)
                    above = block.hash
                self.dynamo.store(worker, blocks, parent)
                self.kvref.store(worker, blocks, parent)
            elif event.kind == REMOVED:
                hashes = [unsigned(h) for h in event.hashes]
                self.dynamo.remove(worker, hashes)
                self.kvref.remove(worker, hashes)
            elif event.kind == CLEARED:
                for scope, each in self.workers.items():
                    if scope.rank == event.scope.rank:
                        self.dynamo.clear(each)
                        self.kvref.clear(each)
                self.stored = {k: v for k, v in self.stored.items() if k[0].rank != event.scope.rank}
        except KVRefError as refusal:
            result.kvref_refused[f"{event.kind}: {refusal.rule}"] += 1
        for said in self.dynamo.refused[refused_before:]:
            result.refused[f"{event.kind}: {said.rsplit(':', 1)[-1].strip()}"] += 1

    def compare(self, message: int, result: Comparison) -> None:
        """Every chain stored so far: Dynamo's leading cached blocks against kvref's."""
        for scope, end in list(self.stored):
            chain: list[IndexedBlock] = []
            h: int | None = end
            while h is not None and (scope, h) in self.stored and len(chain) < 10_000:
                parent, block = self.stored[(scope, h)]
                chain.append(block)
                h = parent
            chain.reverse()
            if h is not None:  # the chain leads to a parent never stored: not a prefix Dynamo can score
                continue
            worker = self.workers[scope]
            ours = self.kvref.match(chain).get(worker, 0)
            theirs = self.dynamo.match(chain).get(worker, 0)
            result.pairs += 1
            if theirs != ours:
                if theirs < ours:
                    result.lower += 1
                else:
                    result.higher += 1
                if not result.first:
                    result.first = (
                        f"after message {message} [{scope.describe() or 'one cache'}]: a chain of {len(chain)} blocks "
                        f"ending {end:#x}: Dynamo {theirs} cached, kvref {ours}"
                    )


def compare_stream(path: Path) -> Comparison:
    """Feed ``path`` to Dynamo's index and to kvref's rebuild, comparing after every message."""
    both = DynamoBeside()
    result = Comparison(path.name)
    message = 0
    for event in read_stream(path, with_tokens=True):
        if event.kind == MESSAGE and message:
            both.compare(message, result)
        message = event.line if event.kind == MESSAGE else message
        both.feed(event, result)
    if message:
        both.compare(message, result)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("streams", nargs="*", type=Path, help="recorded streams (default: the committed samples)")
    parser.add_argument("--out", type=Path, default=Path("results/events-consumer-dynamo.md"))
    args = parser.parse_args()
    streams = args.streams or sorted(SAMPLES.glob("*.msgpack"))
    from importlib.metadata import version

    started = time.perf_counter()
    results = []
    for path in streams:
        results.append(compare_stream(path))
        r = results[-1]
        print(f"{r.stream}: {r.pairs:,} pairs, {r.lower:,} lower, {r.higher:,} higher, refused {dict(r.refused)}")
    lines = [
        "# Dynamo's KV router index beside kvref's, on the engines' own streams",
        "",
        f"- `ai-dynamo-runtime` {version('ai-dynamo-runtime')}: `dynamo.llm.RadixTree` fed each stream event by "
        "event through the suite's adapter, each cache (rank, group, medium) a worker; kvref's event index "
        "(`OracleEventIndex`, copies counted: PFX-329) fed the same.",
        "- After every message, every chain the stream has stored: each index's leading cached blocks of it for "
        "the worker that stored it (PFX-328). *lower*: Dynamo counted fewer cached blocks.",
        "- The rule-by-rule verdict is `results/verdicts/dynamo-host@*.json` (`kvref conformance --backend dynamo`).",
        f"- Made by `python scripts/dynamo_consumer.py` in {time.perf_counter() - started:.1f} s.",
        "",
        "| stream | events | chains compared | Dynamo lower | Dynamo higher | events Dynamo refused "
        "| events kvref refused |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        refused = "; ".join(f"{n} {why}" for why, n in r.refused.most_common()) or "none"
        ours = "; ".join(f"{n} {why}" for why, n in r.kvref_refused.most_common()) or "none"
        row = f"| {r.stream} | {r.events:,} | {r.pairs:,} | {r.lower:,} | {r.higher:,} | {refused} | {ours} |"
        lines.append(row)
    lines += ["", "First differences:", ""]
    lines += [f"- {r.stream}: {r.first}" for r in results if r.first] or ["- none"]
    if any(r.lower or r.higher for r in results):
        lines += [
            "",
            "Two designs of Dynamo's index meet vLLM's streams of hybrid models (`deviations/dynamo.toml`). It",
            "keeps one entry per block and worker, so where vLLM reports a second copy of a block the first",
            "removal drops it though a copy stays cached (PFX-329); and a removal of a block whose descendants",
            "the worker holds prunes them all, so the sliding-window group's removals of early blocks, which",
            "vLLM sends before those of later ones, leave later removals refused and later blocks uncounted",
            "(PFX-328). Its router then counts fewer cached blocks than the engine holds. On streams of full",
            "attention, which remove children first and report no second copy, Dynamo and kvref agree on every chain.",
        ]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
