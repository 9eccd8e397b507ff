"""Trace files: one request a JSON line, block ids or token ids (spec chapter 10, TRACE-100x).

The Mooncake traces (``timestamp``, ``input_length``, ``output_length``, ``hash_ids`` with one
id per 512-token block) load as they are; a line may carry ``token_ids`` instead, which are
hashed with :mod:`kvref.contract.hashing` into chained block ids. Every line is checked; the first bad one
stops loading with :class:`TraceError` naming the file, the line and the reason (TRACE-1001).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kvref.contract.errors import KVRefError
from kvref.contract.hashing import DEFAULT_ALGORITHM, ROOT_HASH, hash_block
from kvref.contract.validate import HASH_MAX, prefix_tree_violation

__all__ = [
    "Trace",
    "TraceError",
    "TraceRequest",
    "MAX_LENGTH",
    "MAX_TIMESTAMP",
    "load_trace",
    "requests_from_tokens",
    "text_lines",
    "token_block_ids",
]


class TraceError(KVRefError, ValueError):
    """A trace line is malformed; the message names the file, the line number and the reason."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request: arrival time (ms), prompt and output lengths, one block id per prompt block."""

    timestamp: int
    input_length: int
    output_length: int
    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class Trace:
    """A workload: requests in arrival order, the block size their ids refer to, and its origin."""

    requests: tuple[TraceRequest, ...]
    block_size: int
    source: str

    @property
    def block_references(self) -> int:
        """Block ids over all requests (what a replay processes)."""
        return sum(len(r.block_ids) for r in self.requests)


def token_block_ids(token_ids: list[int], block_size: int, *, algorithm: str = DEFAULT_ALGORITHM) -> tuple[int, ...]:
    """Chained block ids of a prompt, its last partial block hashed like a full one (TRACE-1004)."""
    out: list[int] = []
    parent = ROOT_HASH
    for start in range(0, len(token_ids), block_size):
        parent = hash_block(parent, token_ids[start : start + block_size], algorithm=algorithm)
        out.append(parent)
    return tuple(out)


#: The largest length (tokens) and timestamp (ms) a trace line may give: beyond any real request or
#: trace, and small enough that no arithmetic on them overflows.
MAX_LENGTH = 2**31 - 1
MAX_TIMESTAMP = 2**53


def _int_field(obj: dict[str, object], key: str, minimum: int, where: str, maximum: int = MAX_LENGTH) -> int:
    value = obj.get(key)
    if type(value) is not int or not minimum <= value <= maximum:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise TraceError("TRACE-1001", f"{where}: {key!r} must be an integer in [{minimum}, {maximum}], got {shown}")
    return value


def _parse_line(text: str, where: str, block_size: int, algorithm: str) -> TraceRequest:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError("TRACE-1001", f"{where}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise TraceError("TRACE-1001", f"{where}: JSON nested too deeply to be a trace line") from None
    if not isinstance(obj, dict):
        raise TraceError("TRACE-1001", f"{where}: a line must be a JSON object, got {type(obj).__name__}")
    timestamp = _int_field(obj, "timestamp", 0, where, MAX_TIMESTAMP)
    output_length = _int_field(obj, "output_length", 0, where)
    if ("hash_ids" in obj) == ("token_ids" in obj):
        raise TraceError("TRACE-1001", f"{where}: a line needs exactly one of 'hash_ids' and 'token_ids'")
    if "token_ids" in obj:
        tokens = obj["token_ids"]
        if not isinstance(tokens, list) or not tokens or any(type(t) is not int or t < 0 for t in tokens):
            raise TraceError("TRACE-1004", f"{where}: 'token_ids' must be a non-empty list of integers >= 0")
        if "input_length" in obj and obj["input_length"] != len(tokens):
            raise TraceError("TRACE-1004", f"{where}: input_length {obj['input_length']!r} but {len(tokens)} token ids")
        return TraceRequest(
            timestamp, len(tokens), output_length, token_block_ids(tokens, block_size, algorithm=algorithm)
        )
    input_length = _int_field(obj, "input_length", 1, where)
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or any(type(h) is not int or not 0 <= h < HASH_MAX for h in ids):
        raise TraceError("TRACE-1002", f"{where}: 'hash_ids' must be a list of integers in [0, 2**63)")
    expected = math.ceil(input_length / block_size)
    if len(ids) != expected:
        raise TraceError(
            "TRACE-1002",
            f"{where}: {len(ids)} hash_ids for input_length {input_length} in blocks of {block_size} "
            f"(expected {expected}); is the block size right?",
        )
    return TraceRequest(timestamp, input_length, output_length, tuple(ids))


def text_lines(raw: Iterable[bytes], source: str) -> Iterator[str]:
    """The lines of a binary file as text, refusing the first that is not UTF-8 with its line number (TRACE-1001)."""
    for number, line in enumerate(raw, 1):
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError("TRACE-1001", f"{source}:{number}: not UTF-8 text: {exc.reason}") from None


def _parse(lines: Iterable[str], source: str, block_size: int, algorithm: str) -> Iterator[TraceRequest]:
    last = 0
    parent_of: dict[int, int | None] = {}  # block id -> the id before it (None: first)
    for number, line in enumerate(lines, 1):
        where = f"{source}:{number}"
        if not line.strip():
            raise TraceError("TRACE-1001", f"{where}: empty line")
        request = _parse_line(line, where, block_size, algorithm)
        if request.timestamp < last:
            raise TraceError("TRACE-1003", f"{where}: timestamp {request.timestamp} before the previous {last}")
        last = request.timestamp
        _check_prefix_tree(request.block_ids, parent_of, where)
        yield request


def _check_prefix_tree(ids: tuple[int, ...], parent_of: dict[int, int | None], where: str) -> None:
    """TRACE-1006: an id names one prefix, so it always follows the same id, once per request."""
    violation = prefix_tree_violation(ids, parent_of)
    if violation is not None:
        raise TraceError("TRACE-1006", f"{where}: {violation[1]}")


def load_trace(path: str | Path, *, block_size: int = 512, algorithm: str = DEFAULT_ALGORITHM) -> Trace:
    """Load a JSON Lines trace; ``block_size`` is what its block ids refer to (512 for Mooncake)."""
    if type(block_size) is not int or block_size < 1:
        raise TraceError("TRACE-1002", f"block_size must be a positive integer, got {block_size!r}")
    file = Path(path)
    try:
        with file.open("rb") as fh:
            requests = tuple(_parse(text_lines(fh, str(file)), str(file), block_size, algorithm))
    except OSError as exc:
        raise TraceError("TRACE-1001", f"{file}: cannot read: {exc.strerror or exc}") from None
    if not requests:
        raise TraceError("TRACE-1001", f"{file}: no requests")
    return Trace(requests, block_size, str(file))


def requests_from_tokens(
    prompts: Iterable[list[int]], block_size: int, *, source: str, algorithm: str = DEFAULT_ALGORITHM
) -> Trace:
    """A trace from token lists arriving 1 ms apart (generated workloads)."""
    requests = tuple(
        TraceRequest(i, len(tokens), 0, token_block_ids(tokens, block_size, algorithm=algorithm))
        for i, tokens in enumerate(prompts)
        if tokens
    )
    return Trace(requests, block_size, source)
