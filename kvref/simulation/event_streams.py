"""Recorded KV-event streams: kvref's JSON Lines form, and a checker of any stream in it (PFX-322, PFX-323).

A stream is one event per line, oldest first::

    {"event": "stored", "hash": 17, "parent": null}      BlockStored: the hash became resident
    {"event": "removed", "hash": 17}                     BlockRemoved: its last copy left
    {"event": "cleared"}                                 AllBlocksCleared

(an optional ``"batch"`` field, an engine's batch id, is kept and shown). :func:`check_stream`
rebuilds the resident hashes event by event, as a router does (PFX-316), and reports the first
event that no cache keeping PFX-304 and PFX-317 could have sent (PFX-322): a store of a resident
hash, a removal of one that is not, a store under a parent that is not resident. With the
finding comes its **window**: the fewest earlier events that show it (the last event that made
the hash, or the parent, what it is), so that it can be pasted into a report.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kvref.contract.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from kvref.simulation.traces import TraceError

__all__ = ["StreamEvent", "StreamFinding", "check_stream", "read_stream", "write_stream"]


@dataclass(frozen=True)
class StreamEvent:
    """One event of a stream, with the line it was read from (1-based) and the engine's batch id, if any."""

    line: int
    event: KVEvent
    batch: int | None = None

    def describe(self) -> str:
        """The event as its line says it."""
        where = f"line {self.line}" + (f" (batch {self.batch})" if self.batch is not None else "")
        event = self.event
        if isinstance(event, BlockStored):
            return f"{where}: stored {event.block_hash} under {event.parent_hash}"
        if isinstance(event, BlockRemoved):
            return f"{where}: removed {event.block_hash}"
        return f"{where}: all cleared"


@dataclass(frozen=True)
class StreamFinding:
    """The first event no conforming cache could have sent: the rule, why, and the window that shows it."""

    rule: str
    event: StreamEvent
    reason: str
    window: tuple[StreamEvent, ...] = field(default=())

    def describe(self) -> str:
        """The finding in lines: the rule and reason, then the window and the event, oldest first."""
        lines = [f"[{self.rule}] {self.event.describe()}: {self.reason}"]
        lines += [f"  {e.describe()}" for e in (*self.window, self.event)]
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        """The finding as plain data (``kvref events check --json``)."""
        return {
            "rule": self.rule,
            "line": self.event.line,
            "reason": self.reason,
            "window": [e.describe() for e in (*self.window, self.event)],
        }


def write_stream(events: Iterable[KVEvent], path: Path) -> int:
    """Write ``events`` to ``path`` in kvref's JSON Lines form; return how many were written."""
    count = 0
    with path.open("w", encoding="utf-8") as out:
        for event in events:
            if isinstance(event, BlockStored):
                record: dict[str, object] = {"event": "stored", "hash": event.block_hash, "parent": event.parent_hash}
            elif isinstance(event, BlockRemoved):
                record = {"event": "removed", "hash": event.block_hash}
            else:
                record = {"event": "cleared"}
            out.write(json.dumps(record) + "\n")
            count += 1
    return count


def _hash(record: dict[str, object], key: str, where: str) -> int:
    value = record.get(key)
    if type(value) is not int or not 0 <= value < 2**64:
        raise TraceError("PFX-323", f"{where}: {key!r} must be a hash (an int in [0, 2**64)), got {value!r}")
    return value


def read_stream(path: Path) -> Iterator[StreamEvent]:
    """The events of a stream in kvref's JSON Lines form; a line that is not one stops the read with
    TraceError naming the file, the line and what is wrong (PFX-323). Blank lines are skipped."""
    with path.open("r", encoding="utf-8") as lines:
        for number, text in enumerate(lines, 1):
            if not text.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceError("PFX-323", f"{where}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise TraceError("PFX-323", f"{where}: an event is a JSON object, got {type(record).__name__}")
            batch = record.get("batch")
            if batch is not None and type(batch) is not int:
                raise TraceError("PFX-323", f"{where}: 'batch' must be an int, got {batch!r}")
            kind = record.get("event")
            event: KVEvent
            if kind == "stored":
                parent = None if record.get("parent") is None else _hash(record, "parent", where)
                event = BlockStored(_hash(record, "hash", where), parent)
            elif kind == "removed":
                event = BlockRemoved(_hash(record, "hash", where))
            elif kind == "cleared":
                event = AllBlocksCleared()
            else:
                raise TraceError("PFX-323", f"{where}: 'event' must be stored, removed or cleared, got {kind!r}")
            yield StreamEvent(number, event, batch)


def check_stream(events: Iterable[StreamEvent]) -> tuple[int, StreamFinding | None]:
    """How many events were read, and the first that breaks PFX-322 with its window (None: the stream
    is one a conforming cache could have sent)."""
    last: dict[int, StreamEvent] = {}  # each hash's last store or removal, since the last clear
    resident: set[int] = set()
    cleared: StreamEvent | None = None
    count = 0
    for item in events:
        count += 1
        event = item.event
        if isinstance(event, BlockStored):
            h, parent = event.block_hash, event.parent_hash
            if h in resident:
                reason = f"{h} is resident already: a store is due only when a hash gains its first copy (PFX-317)"
                return count, StreamFinding("PFX-322", item, reason, _window(last, cleared, h))
            if parent is not None and parent not in resident:
                reason = f"its parent {parent} is not resident: a registration's parent must be (PFX-304)"
                return count, StreamFinding("PFX-322", item, reason, _window(last, cleared, parent))
            resident.add(h)
            last[h] = item
        elif isinstance(event, BlockRemoved):
            h = event.block_hash
            if h not in resident:
                reason = (
                    f"{h} is not resident: a removal is due only when a resident hash loses its last copy (PFX-317)"
                )
                return count, StreamFinding("PFX-322", item, reason, _window(last, cleared, h))
            resident.discard(h)
            last[h] = item
        else:
            resident.clear()
            last.clear()
            cleared = item
    return count, None


def _window(last: dict[int, StreamEvent], cleared: StreamEvent | None, h: int) -> tuple[StreamEvent, ...]:
    """The fewest earlier events that show what ``h`` is now: its last store or removal, else the clear
    that emptied the cache since (none: the stream never named it)."""
    if h in last:
        return (last[h],)
    return (cleared,) if cleared is not None else ()
