"""NVIDIA Dynamo's KV router index as a peer of chapter 03's event index (PFX-328..PFX-330).

Dynamo's router learns what each worker caches from the worker's KV events and scores workers by
the leading blocks of a request they hold. Its index is ``dynamo.llm.RadixTree`` (the Rust tree of
``ai-dynamo-runtime``, 1.6.1 here); this adapter drives it as Dynamo's own event relay and router
do, and makes no check of its own:

* a store -> ``apply_event(worker, {"event_id", "data": {"stored": {"parent_hash", "blocks":
  [{"block_hash", "tokens_hash"}]}}})``, each ``tokens_hash`` Dynamo's own hash of the block's
  token ids (``compute_block_hash_for_seq``), what its tree's edges and queries are keyed by;
* a removal -> ``{"removed": {"block_hashes": [...]}}``; a clear -> ``"cleared"``; a cache gone ->
  ``remove_worker``;
* a query -> ``find_matches`` of the chain's token hashes, as the router computes them from a
  request's tokens; its ``scores`` per (worker, data-parallel rank) are the answer.

Each cache is a worker of data-parallel rank 0. Where the tree refuses an event (a block or parent
it does not know: ``RuntimeError: Failed to apply event``), it has applied what it could of it, and
the adapter goes on as Dynamo's indexer does, logging; it keeps the refusals in ``refused``. The suite sends only events
a conforming cache sends, so a refusal shows up as the answers that follow it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from kvref.contract.errors import ConfigError
from kvref.contract.event_index import IndexedBlock

__all__ = ["MASK", "DynamoBackend", "DynamoEventIndex", "backend"]

INSTALL = "pip install ai-dynamo-runtime==1.6.1 (nox -s events-consumer does)"
#: Dynamo's hashes are unsigned 64-bit ints.
MASK = (1 << 64) - 1


class DynamoEventIndex:
    """``dynamo.llm.RadixTree`` fed events and asked for matches as Dynamo's router does (see the module)."""

    def __init__(self) -> None:
        from dynamo.llm import RadixTree, compute_block_hash_for_seq

        self.tree = RadixTree()
        self.hash_tokens = compute_block_hash_for_seq
        self.event_id = 0
        self.tokens_hashed: dict[tuple[int, ...], int] = {}  # a block's token ids -> Dynamo's hash of them
        #: The events the tree refused, in words, oldest first.
        self.refused: list[str] = []

    def token_hashes(self, blocks: Sequence[IndexedBlock]) -> list[int]:
        """Dynamo's hash of each block's token ids, as its relay and router compute them."""
        hashes = []
        for block in blocks:
            hashed = self.tokens_hashed.get(block.tokens)
            if hashed is None:
                [hashed] = self.hash_tokens(list(block.tokens), len(block.tokens))
                hashed = self.tokens_hashed[block.tokens] = int(hashed)
            hashes.append(hashed)
        return hashes

    def apply(self, cache: int, data: object) -> None:
        """One event of ``cache`` as Dynamo's relay hands it to the tree."""
        self.event_id += 1
        try:
            self.tree.apply_event(cache, json.dumps({"event_id": self.event_id, "data": data}).encode())
        except RuntimeError as refusal:  # the indexer logs it and goes on
            self.refused.append(f"event {self.event_id} of worker {cache}: {refusal}")

    def store(self, cache: int, blocks: Sequence[IndexedBlock], parent: int | None) -> None:
        """A ``stored`` event: the chain's hashes and Dynamo's hash of each block's tokens."""
        listed = [
            {"block_hash": block.hash & MASK, "tokens_hash": tokens}
            for block, tokens in zip(blocks, self.token_hashes(blocks), strict=True)
        ]
        top = None if parent is None else parent & MASK
        self.apply(cache, {"stored": {"parent_hash": top, "blocks": listed}})

    def remove(self, cache: int, hashes: Sequence[int]) -> None:
        """A ``removed`` event."""
        self.apply(cache, {"removed": {"block_hashes": [h & MASK for h in hashes]}})

    def clear(self, cache: int) -> None:
        """A ``cleared`` event."""
        self.apply(cache, "cleared")

    def remove_cache(self, cache: int) -> None:
        """``RadixTree.remove_worker``: the worker is gone."""
        self.tree.remove_worker(cache)

    def match(self, blocks: Sequence[IndexedBlock]) -> dict[int, int]:
        """``find_matches`` of the chain's token hashes: each worker's overlap score."""
        scores = self.tree.find_matches(self.token_hashes(blocks)).scores
        answers: dict[int, int] = {}
        for worker, score in scores.items():
            cache = worker[0] if isinstance(worker, tuple) else worker
            answers[int(cache)] = answers.get(int(cache), 0) + int(score)
        return answers


class DynamoBackend:
    """The ``dynamo`` entry point: Dynamo's router index, which has no block pool of its own."""

    name = "dynamo"
    #: An index only: the suite's tests of a block pool do not apply to it.
    has_block_pool = False

    def version(self) -> str:
        """The installed ``ai-dynamo-runtime``'s version."""
        try:
            return metadata.version("ai-dynamo-runtime")
        except metadata.PackageNotFoundError:
            return "not installed"

    def availability(self) -> str | None:
        """None when ``dynamo.llm.RadixTree`` imports; else why not and how to get it."""
        try:
            from dynamo.llm import RadixTree  # noqa: F401
        except ImportError as exc:
            return f"dynamo.llm does not import ({exc}); {INSTALL}"
        return None

    def device(self, requested: str | None = None) -> str:
        """The index lives in the router's host memory."""
        if requested not in (None, "cpu", "host"):
            raise ConfigError("CONF-907", f"backend 'dynamo' keeps its index on the host, not on {requested!r}")
        return "host"

    def capabilities(self) -> frozenset[str]:
        """An event index, nothing else."""
        return frozenset({"event-index"})

    def create(self, num_blocks: int, **settings: Any) -> Any:
        """Refused: Dynamo's router index has no block pool (CONF-904)."""
        raise ConfigError("CONF-904", "backend 'dynamo' is a router's event index; it has no block pool")

    def create_event_index(self, *, device: str | None = None) -> DynamoEventIndex:
        """A new ``RadixTree`` behind the adapter."""
        self.device(device)
        return DynamoEventIndex()


#: NVIDIA Dynamo's KV router index (entry point ``dynamo``).
backend = DynamoBackend()
