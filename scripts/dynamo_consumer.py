"""NVIDIA Dynamo's KV router index fed the engines' recorded KV-event streams, beside kvref's rebuild.

A router such as Dynamo's decides where a request goes by how many of its leading blocks each
worker caches, which it learns from the workers' KV events. This script feeds each recorded
stream (by default the samples under ``tests/data/engine-events/``, from vLLM 0.32's scheduler and
SGLang 0.5.23's radix cache) to Dynamo's own index, ``dynamo.llm.RadixTree`` of
``ai-dynamo-runtime``, and to kvref's :class:`~kvref.simulation.event_streams.StreamChecker`
counting copies (PFX-324). After every message it asks both, for every chain of blocks the stream
has stored so far, how many leading blocks are cached: Dynamo's overlap score against the number
of the chain's leading hashes with a copy left in kvref's rebuild. A difference is a finding about
the stream or the consumer.

How an engine's event becomes Dynamo's (``RadixTree.apply_event`` takes one event as JSON):

* ``BlockStored`` -> ``{"stored": {"parent_hash": P, "blocks": [{"block_hash": H, "tokens_hash": T}]}}``:
  ``H`` and ``P`` the engine's hashes as unsigned 64-bit ints (vLLM's byte digests as vLLM's own
  integer form takes them, SGLang's signed ones masked), ``T`` Dynamo's own hash of each block's
  tokens (``compute_block_hash_for_seq``), what its tree's edges and queries are keyed by; token
  ids that do not fit 32 bits are renumbered, one for one, as Dynamo hashes 32-bit ids;
* ``BlockRemoved`` -> ``{"removed": {"block_hashes": [H, ...]}}``; ``AllBlocksCleared`` -> ``"cleared"``.

Each cache of the stream (rank, KV cache group, medium) is a worker of its own. An event Dynamo
refuses (a parent or a block it does not know) is counted, not fatal: Dynamo drops it and goes on.

    python scripts/dynamo_consumer.py [STREAM ...] [--out results/events-consumer-dynamo.md]

(``nox -s events-consumer`` installs ``ai-dynamo-runtime`` and runs it.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvref.simulation.event_streams import CLEARED, MESSAGE, REMOVED, STORED, Hash, Scope, StreamChecker, StreamEvent
from kvref.simulation.stream_files import read_stream

MASK = (1 << 64) - 1
SAMPLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "engine-events"


def unsigned(h: Hash) -> int:
    """An engine's hash as Dynamo takes it: an unsigned 64-bit int (bytes as vLLM's integer form reads them)."""
    return (int.from_bytes(h, "big") if isinstance(h, bytes) else h) & MASK


@dataclass
class Comparison:
    """What one stream gave: the chains compared, the differences, what Dynamo refused."""

    stream: str
    events: int = 0
    pairs: int = 0
    lower: int = 0  # Dynamo saw fewer cached blocks than kvref's rebuild
    higher: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    first: str = ""


class DynamoBeside:
    """Dynamo's index and kvref's rebuild of one stream, fed event by event."""

    def __init__(self, radix_tree: Any, hash_tokens: Callable[[list[int], int], list[int]]) -> None:
        self.tree = radix_tree
        self.hash_tokens = hash_tokens
        self.checker = StreamChecker(copies=True)
        self.workers: dict[Scope, int] = {}
        self.tokens: dict[int, int] = {}  # a token id that does not fit 32 bits -> its stand-in
        self.stored: dict[tuple[Scope, Hash], tuple[Hash | None, int]] = {}  # -> (parent, Dynamo's tokens hash)
        self.event_id = 0

    def _tokens(self, ids: tuple[int, ...]) -> list[int]:
        if not self.tokens and all(0 <= t < 2**32 for t in ids):
            return list(ids)
        return [self.tokens.setdefault(t, len(self.tokens)) for t in ids]

    def feed(self, event: StreamEvent, result: Comparison) -> None:
        """Apply one event to both consumers."""
        self.checker.feed(event)
        if event.kind == MESSAGE:
            return
        result.events += 1
        worker = self.workers.setdefault(event.scope, len(self.workers))
        if event.kind == STORED:
            if event.token_ids is None or not event.block_size:  # kvref's own form carries no tokens
                result.refused["stored: no token ids to hash"] += 1
                return
            hashed = self.hash_tokens(self._tokens(event.token_ids), event.block_size)
            parent = event.parent
            for h, t in zip(event.hashes, hashed, strict=False):
                self.stored[(event.scope, h)] = (parent, int(t))
                parent = h
            blocks = [
                {"block_hash": unsigned(h), "tokens_hash": int(t)} for h, t in zip(event.hashes, hashed, strict=False)
            ]
            top = None if event.parent is None else unsigned(event.parent)
            data: object = {"stored": {"parent_hash": top, "blocks": blocks}}
        elif event.kind == REMOVED:
            data = {"removed": {"block_hashes": [unsigned(h) for h in event.hashes]}}
        else:
            data = "cleared"
        self.event_id += 1
        try:
            self.tree.apply_event(worker, json.dumps({"event_id": self.event_id, "data": data}).encode())
        except RuntimeError as exc:  # Dynamo refuses the event and goes on
            result.refused[f"{event.kind}: {str(exc).split(':')[-1].strip()}"] += 1
        if event.kind == CLEARED:
            self.stored = {k: v for k, v in self.stored.items() if k[0].rank != event.scope.rank}

    def compare(self, message: int, result: Comparison) -> None:
        """Every chain stored so far: Dynamo's overlap score against kvref's leading cached hashes."""
        for scope, end in list(self.stored):
            chain: list[tuple[Hash, int]] = []
            h: Hash | None = end
            while h is not None and (scope, h) in self.stored and len(chain) < 10_000:
                parent, tokens_hash = self.stored[(scope, h)]
                chain.append((h, tokens_hash))
                h = parent
            chain.reverse()
            if h is not None:  # the chain leads to a parent never stored: not a prefix Dynamo can score
                continue
            resident = self.checker.resident(scope)
            ours = next((i for i, (g, _) in enumerate(chain) if g not in resident), len(chain))
            scores = self.tree.find_matches([t for _, t in chain]).scores
            theirs = int(scores.get((self.workers[scope], 0), 0))
            result.pairs += 1
            if theirs != ours:
                if theirs < ours:
                    result.lower += 1
                else:
                    result.higher += 1
                if not result.first:
                    result.first = (
                        f"after message {message} [{scope.describe() or 'one cache'}]: a chain of {len(chain)} blocks "
                        f"ending {unsigned(end):#x}: Dynamo {theirs} cached, kvref {ours}"
                    )


def compare_stream(path: Path) -> Comparison:
    """Feed ``path`` to Dynamo's index and to kvref's rebuild, comparing after every message."""
    from dynamo.llm import RadixTree, compute_block_hash_for_seq

    both = DynamoBeside(RadixTree(), compute_block_hash_for_seq)
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
        "# Dynamo's KV router index beside kvref's rebuild, on the engines' own streams",
        "",
        f"- `ai-dynamo-runtime` {version('ai-dynamo-runtime')}: `dynamo.llm.RadixTree` fed each stream event by "
        "event, each cache (rank, group, medium) a worker; kvref's `StreamChecker` counting copies (PFX-324) fed "
        "the same.",
        "- After every message, every chain the stream has stored: Dynamo's overlap score against the number of the "
        "chain's leading hashes with a copy left in kvref's rebuild. *lower*: Dynamo counted fewer cached blocks.",
        f"- Made by `python scripts/dynamo_consumer.py` in {time.perf_counter() - started:.1f} s.",
        "",
        "| stream | events | chains compared | Dynamo lower | Dynamo higher | events Dynamo refused |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        refused = "; ".join(f"{n} {why}" for why, n in r.refused.most_common()) or "none"
        lines.append(f"| {r.stream} | {r.events:,} | {r.pairs:,} | {r.lower:,} | {r.higher:,} | {refused} |")
    lines += ["", "First differences:", ""]
    lines += [f"- {r.stream}: {r.first}" for r in results if r.first] or ["- none"]
    if any(r.lower or r.higher for r in results):
        lines += [
            "",
            "Where vLLM reports a second copy of a block (its hybrid models' groups do,",
            "`results/engine-event-streams.md`), Dynamo's index keeps one entry per block and worker: the first",
            "removal drops it though a copy stays cached, and later removals and stores under it are refused.",
            "Its router then counts fewer cached blocks than the engine holds. On streams without second copies,",
            "Dynamo and kvref agree on every chain.",
        ]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
