"""Engines' recorded KV-event streams: vLLM's and SGLang's ``KVEventBatch`` in MessagePack (PFX-323).

vLLM (``vllm.distributed.kv_events``) and SGLang (``sglang.srt.disaggregation.kv_events``) publish
one shape over ZeroMQ, each message a topic, a sequence number (8 bytes, big-endian) and a
payload. The payload is a batch, the MessagePack array ``[ts, events, data_parallel_rank]``, and
each event is a tagged map (vLLM 0.32, SGLang 0.5)::

    {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h, "token_ids": [...],
     "block_size": n, "lora_id": None, "medium": "GPU", "group_idx": 0, ...}
    {"type": "BlockRemoved", "block_hashes": [...], "medium": "GPU", "group_idx": 0}
    {"type": "AllBlocksCleared"}

or, as releases that encoded events as arrays sent them, a tagged array in field order
(``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]``,
``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``). A recorded stream is a
file of MessagePack values one after another, each a payload as the engine sent it or a
subscriber's ``[sequence, payload]`` pair (the payload's bytes as received), whose sequence numbers
must then run on by one (PFX-326). Fields a release adds are ignored; a value that is none of
these stops the read naming the file and the message (PFX-323).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kvref.simulation.event_streams import CLEARED, MESSAGE, REMOVED, STORED, Scope, StreamEvent, is_hash
from kvref.simulation.traces import TraceError

__all__ = ["EngineBatch", "read_engine_stream", "write_engine_stream"]

#: A batch as :func:`write_engine_stream` takes it: (ts, events as their maps, data-parallel rank).
EngineBatch = tuple[float, list[dict[str, Any]], "int | None"]

_ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def _msgpack() -> Any:
    try:
        import msgpack
    except ImportError:  # pragma: no cover - msgpack comes with kvref[events]
        raise TraceError(
            "PFX-323", "reading an engine's MessagePack stream needs msgpack: pip install 'kvref[events]'"
        ) from None
    return msgpack


def _all_hashes(values: list[object]) -> bool:
    """Whether every value is a hash: a 64-bit int, signed (SGLang's) or not (vLLM's), checked at once
    where all are ints, or bytes (vLLM's digests)."""
    if len(values) == 1:
        return is_hash(values[0])
    if all(type(v) is int for v in values):
        return not values or (min(values) >= -(2**63) and max(values) < 2**64)  # type: ignore[type-var, operator]
    return all(is_hash(v) for v in values)


def _refused(where: str, why: str) -> TraceError:
    return TraceError("PFX-323", f"{where}: {why}")


KINDS = "events are BlockStored, BlockRemoved or AllBlocksCleared"


def _event(
    where: str,
    number: int,
    index: int,
    raw: object,
    ts: float,
    rank: int | None,
    seq: int | None,
    with_tokens: bool = False,
) -> StreamEvent:
    """One event of a batch as a :class:`StreamEvent`; TraceError naming ``where`` when it is none."""
    at = f"{where}, event {index + 1}"
    if isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        tag = raw[0]
        names = _ARRAY_FIELDS.get(tag)
        if names is None:
            raise _refused(at, f"it is a {tag!r}; {KINDS}")
        fields: dict[Any, Any] = dict(zip(names, raw[1:], strict=False))
    elif isinstance(raw, dict):
        fields = raw
        tag = str(fields.get("type"))
    else:
        raise _refused(at, f"it is neither a tagged map nor a tagged array: {raw!r:.80}")
    group, medium = fields.get("group_idx"), fields.get("medium")
    if not (group is None or type(group) is int):
        raise _refused(at, f"'group_idx' must be an int, got {group!r:.40}")
    if medium is not None and not isinstance(medium, str):
        raise _refused(at, f"'medium' must be a string, got {medium!r:.40}")
    scope = Scope(rank, group, medium)
    if tag == "AllBlocksCleared":
        return StreamEvent(number, CLEARED, (), None, seq, scope, None, None, ts, index)
    hashes = fields.get("block_hashes")
    if not isinstance(hashes, list) or not _all_hashes(hashes):
        why = f"'block_hashes' must be a list of hashes (64-bit ints, or bytes), got {hashes!r:.80}"
        raise _refused(at, why)
    if tag == "BlockRemoved":
        return StreamEvent(number, REMOVED, tuple(hashes), None, seq, scope, None, None, ts, index)
    if tag != "BlockStored":
        raise _refused(at, f"it has type {tag!r}; {KINDS}")
    parent, tokens, size = fields.get("parent_block_hash"), fields.get("token_ids"), fields.get("block_size")
    if parent is not None and not is_hash(parent):
        raise _refused(at, f"'parent_block_hash' must be a hash or None, got {parent!r:.40}")
    if not isinstance(tokens, list):
        raise _refused(at, f"'token_ids' must be a list, got {tokens!r:.40}")
    if type(size) is not int:
        raise _refused(at, f"'block_size' must be an int, got {size!r:.40}")
    kept = tuple(tokens) if with_tokens else None
    return StreamEvent(number, STORED, tuple(hashes), parent, seq, scope, len(tokens), size, ts, index, kept)


def read_engine_stream(path: Path, *, with_tokens: bool = False) -> Iterator[StreamEvent]:
    """The events of an engine's recorded stream (see the module), message by message, in order; a
    sequence number that does not follow the one before is a finding the checker reports
    (PFX-326), so the read goes on. ``with_tokens`` keeps each store's token ids."""
    msgpack = _msgpack()
    with path.open("rb") as source:
        unpacker = msgpack.Unpacker(source, raw=False, strict_map_key=False)
        number = 0
        while True:
            try:
                value = next(unpacker)
            except StopIteration:
                if unpacker.tell() < path.stat().st_size:
                    raise _refused(
                        f"{path}: message {number + 1}", "it is cut short: the file ends inside it"
                    ) from None
                return
            except Exception as exc:  # msgpack's own errors for a torn or foreign file
                why = f"it is not MessagePack ({type(exc).__name__}: {exc})"
                raise _refused(f"{path}: message {number + 1}", why) from None
            number += 1
            where = f"{path}: message {number}"
            seq = None
            if isinstance(value, list) and len(value) == 2 and type(value[0]) is int and isinstance(value[1], bytes):
                seq = value[0]
                try:
                    value = msgpack.unpackb(value[1], raw=False, strict_map_key=False)
                except Exception as exc:
                    raise _refused(where, f"its payload is not MessagePack ({type(exc).__name__})") from None
            if not (isinstance(value, list) and 2 <= len(value) <= 3 and isinstance(value[1], list)):
                raise _refused(where, f"a batch is [ts, events, rank], got {value!r:.80}")
            ts, events = value[0], value[1]
            rank = value[2] if len(value) == 3 else None
            if type(ts) not in (int, float):
                raise _refused(where, f"the batch's ts must be a number, got {ts!r:.40}")
            if rank is not None and type(rank) is not int:
                raise _refused(where, f"the batch's rank must be an int, got {rank!r:.40}")
            yield StreamEvent(number, MESSAGE, (), None, seq, Scope(rank), None, None, float(ts))
            for index, raw in enumerate(events):
                yield _event(where, number, index, raw, float(ts), rank, seq, with_tokens)


def write_engine_stream(batches: Iterable[EngineBatch], path: Path, *, sequenced: bool = True) -> int:
    """Write ``batches`` to ``path`` as an engine's recorded stream (each event a tagged map): as a
    subscriber's ``[sequence, payload]`` pairs numbered from 0, or bare payloads; return how many
    batches were written."""
    msgpack = _msgpack()
    count = 0
    with path.open("wb") as out:
        for ts, events, rank in batches:
            payload = msgpack.packb([ts, events, rank], use_bin_type=True)
            out.write(msgpack.packb([count, payload], use_bin_type=True) if sequenced else payload)
            count += 1
    return count
