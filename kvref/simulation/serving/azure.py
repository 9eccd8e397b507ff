"""The Azure LLM inference traces as serving workloads, with a stated synthetic prefix structure (TRACE-1045).

The Azure traces (2023, also known as the Splitwise traces) give each request an arrival time, a
context length and an output length, and no token ids. A prefix cache needs to know which prompts
share a prefix, so kvref gives them one, seeded and stated: a fraction of the requests open with
one of a few shared prefixes (system prompts), the rest of every prompt is its own.
"""

from __future__ import annotations

import csv
import random
from datetime import UTC, datetime
from pathlib import Path

from kvref.contract.hashing import DEFAULT_ALGORITHM
from kvref.simulation.serving.workload import ServedRequest, ServingWorkload
from kvref.simulation.traces import MAX_LENGTH, TraceError, text_lines

__all__ = ["AZURE_COLUMNS", "AzurePrefixes", "load_azure_trace"]

#: The header an Azure trace file starts with.
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

_PREFIX_ID_BASE = 1 << 32  # ids of shared prefix blocks: base * (prefix + 1) + position
_OWN_ID_BASE = 1 << 48  # ids of blocks a request has to itself, counted up from here


class AzurePrefixes:
    """The synthetic prefix structure (TRACE-1045): ``count`` shared prefixes of 256..2,048 tokens,
    opening a ``shared`` fraction of the requests; seeded by ``seed``."""

    def __init__(self, *, shared: float = 0.5, count: int = 8, seed: int = 0) -> None:
        if isinstance(shared, bool) or not isinstance(shared, (int, float)) or not 0.0 <= shared <= 1.0:
            raise TraceError("TRACE-1045", f"the shared fraction must be in [0, 1], got {shared!r}")
        if type(count) is not int or count < 1:
            raise TraceError("TRACE-1045", f"the number of shared prefixes must be an integer >= 1, got {count!r}")
        self.shared = float(shared)
        self.count = count
        self.seed = seed
        rng = random.Random(seed)
        self.lengths = [rng.randint(256, 2048) for _ in range(count)]
        self._rng = rng
        self._next_own = _OWN_ID_BASE

    def block_ids(self, context: int, block_size: int) -> tuple[int, ...]:
        """Ids of one request's blocks, drawn in arrival order (TRACE-1045, TRACE-1002)."""
        rng = self._rng
        blocks = -(-context // block_size)
        shared_blocks = 0
        prefix = 0
        if rng.random() < self.shared:
            prefix = rng.randrange(self.count)
            covered = min(self.lengths[prefix], context - 1)
            shared_blocks = covered // block_size
        base = _PREFIX_ID_BASE * (prefix + 1)
        ids = [base + j for j in range(shared_blocks)]
        own = blocks - shared_blocks
        ids.extend(range(self._next_own, self._next_own + own))
        self._next_own += own
        return tuple(ids)

    def describe(self) -> str:
        """The structure in one line, for reports (TRACE-1045, TRACE-1046)."""
        return (
            f"synthetic prefixes (the trace has no token ids): {self.shared:.0%} of requests open with one of "
            f"{self.count} shared prefixes of {min(self.lengths):,}..{max(self.lengths):,} tokens (seed {self.seed}); "
            "the rest of every prompt is its own; output blocks are cached but never hit (TRACE-1038)"
        )


def _timestamp_us(text: str, where: str) -> int:
    """Microseconds since the epoch of ``2023-11-16 18:17:03.9799600`` (digits past the sixth dropped)."""
    whole, _, fraction = text.strip().partition(".")
    try:
        moment = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise TraceError("TRACE-1001", f"{where}: TIMESTAMP {text!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction]'") from None
    if fraction and not (fraction.isascii() and fraction.isdigit()):
        raise TraceError("TRACE-1001", f"{where}: TIMESTAMP {text!r} has a fraction that is not digits")
    micros = int((fraction + "000000")[:6]) if fraction else 0
    return int(moment.replace(tzinfo=UTC).timestamp()) * 1_000_000 + micros


def _count(text: str, name: str, minimum: int, where: str) -> int:
    value = text.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 10 or not minimum <= int(value) <= MAX_LENGTH:
        shown = repr(text) if len(text) <= 40 else repr(text[:37]) + "..."
        raise TraceError("TRACE-1001", f"{where}: {name} must be an integer in [{minimum}, {MAX_LENGTH}], got {shown}")
    return int(value)


def load_azure_trace(
    path: str | Path,
    *,
    block_size: int = 16,
    prefixes: AzurePrefixes | None = None,
    algorithm: str = DEFAULT_ALGORITHM,
) -> ServingWorkload:
    """Load an Azure trace CSV as a serving workload, arrivals from its first timestamp (TRACE-1045).

    Every line is checked; the first bad one stops loading with :class:`TraceError` naming the
    file and line (TRACE-1001); timestamps must not go back (TRACE-1003).
    """
    if type(block_size) is not int or block_size < 1:
        raise TraceError("TRACE-1002", f"block_size must be a positive integer, got {block_size!r}")
    structure = prefixes or AzurePrefixes()
    file = Path(path)
    requests = []
    try:
        with file.open("rb") as fh:
            rows = csv.reader(text_lines(fh, str(file)))
            header = next(rows, None)
            if header is None or tuple(h.strip() for h in header) != AZURE_COLUMNS:
                wanted = ",".join(AZURE_COLUMNS)
                raise TraceError("TRACE-1001", f"{file}:1: the header must be {wanted}, got {header!r}")
            start = last = None
            ended = rows.line_num
            for row in rows:
                first, ended = ended + 1, rows.line_num
                where = f"{file}:{first}"
                if ended != first:
                    raise TraceError("TRACE-1001", f"{where}: a quoted field runs on to line {ended}")
                if len(row) != 3:
                    raise TraceError("TRACE-1001", f"{where}: expected 3 columns, got {len(row)}")
                at = _timestamp_us(row[0], where)
                if last is not None and at < last:
                    raise TraceError("TRACE-1003", f"{where}: TIMESTAMP {row[0].strip()} before the previous line's")
                start = at if start is None else start
                last = at
                context = _count(row[1], "ContextTokens", 1, where)
                output = _count(row[2], "GeneratedTokens", 0, where)
                ids = structure.block_ids(context, block_size)
                requests.append(ServedRequest(at - start, context, output, block_ids=ids))
    except OSError as exc:
        raise TraceError("TRACE-1001", f"{file}: cannot read: {exc.strerror or exc}") from None
    except csv.Error as exc:
        raise TraceError("TRACE-1001", f"{file}:{rows.line_num}: not CSV: {exc}") from None
    if not requests:
        raise TraceError("TRACE-1001", f"{file}: no requests")
    return ServingWorkload(
        tuple(requests),
        block_size,
        str(file),
        outputs_hit=False,
        fixed_block_size=False,
        algorithm=algorithm,
        note=structure.describe(),
    )
