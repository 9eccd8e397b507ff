"""A router's event index as every implementation shows it (chapter 03, PFX-328..PFX-330).

A router learns what each cache holds from the cache's KV-event stream and sends a request where
most of its leading blocks are. An event index is that rebuild: it takes each cache's stores,
removals and clears, and answers a chain of blocks with, per cache, how many of its leading blocks
the cache holds. Caches are named by ints (a router's worker ids); a block by its
:class:`IndexedBlock`: the engine's hash of the block and the block's token ids, since an index
may key its tree by either (kvref's by the hash, Dynamo's by its own hash of the tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from kvref.contract.errors import InvalidTypeError
from kvref.contract.validate import as_int, as_list

__all__ = ["EventIndex", "IndexedBlock", "as_indexed_blocks"]


class IndexedBlock(NamedTuple):
    """One block of a chain: the engine's hash of it (``hash``) and its token ids (``tokens``)."""

    hash: int
    tokens: tuple[int, ...]


@runtime_checkable
class EventIndex(Protocol):
    """What the suite drives: the events of each cache's stream, then queries (PFX-328..PFX-330)."""

    def store(self, cache: int, blocks: Sequence[IndexedBlock], parent: int | None) -> None:
        """A ``BlockStored`` of ``cache``: ``blocks``, a chain, the first under ``parent`` (None: a root)."""

    def remove(self, cache: int, hashes: Sequence[int]) -> None:
        """A ``BlockRemoved`` of ``cache``: one copy of each of ``hashes`` left it."""

    def clear(self, cache: int) -> None:
        """An ``AllBlocksCleared`` of ``cache``: it holds nothing now."""

    def remove_cache(self, cache: int) -> None:
        """``cache`` is gone (a worker that left): forget everything it held."""

    def match(self, blocks: Sequence[IndexedBlock]) -> dict[int, int]:
        """Per cache holding at least the first of ``blocks``, how many leading blocks it holds (PFX-328)."""


def as_indexed_blocks(blocks: object, *, op: str) -> list[IndexedBlock]:
    """``blocks`` checked as a list of :class:`IndexedBlock` (each a hash and its token ids, ints), or
    InvalidTypeError naming ERR-503 and the first entry that is not one."""
    checked = []
    for i, block in enumerate(as_list(blocks, op=op, arg="blocks")):
        if not isinstance(block, tuple) or len(block) != 2 or not isinstance(block[1], tuple):
            raise InvalidTypeError("ERR-503", f"{op}: blocks[{i}] must be a (hash, tokens) pair, got {block!r}")
        tokens = tuple(as_int(t, op=op, arg=f"blocks[{i}].tokens") for t in block[1])
        checked.append(IndexedBlock(as_int(block[0], op=op, arg=f"blocks[{i}].hash"), tokens))
    return checked
