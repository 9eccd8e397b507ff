"""Recorded KV-event streams and their checker (PFX-322..PFX-326).

A stream is what a cache told the outside world about its contents, oldest first: stores of a
chain of block hashes under a parent, removals of hashes, and clears. Two forms are read:

* kvref's JSON Lines, one hash per line (``kvref replay --events`` writes the oracle's)::

      {"event": "stored", "hash": 17, "parent": null}      BlockStored: the hash became resident
      {"event": "removed", "hash": 17}                     BlockRemoved: its last copy left
      {"event": "cleared"}                                 AllBlocksCleared

  (an optional ``"batch"`` field, an engine's batch id, is kept and shown);
* the engines' own: vLLM's and SGLang's ``KVEventBatch`` messages, MessagePack
  (:mod:`kvref.simulation.engine_events`).

:class:`StreamChecker` rebuilds what a router rebuilds from a stream, per cache (an engine's
data-parallel rank, KV cache group and medium: a :class:`Scope`), and reports the first event
that no cache keeping PFX-304 and PFX-317 could have sent (PFX-322): a store of a resident hash,
a removal of one that is not, a store under a parent that is not resident. For an engine that
reports every copy of a hash (vLLM keeps several), ``copies=True`` counts copies per hash
instead (PFX-324). A store must carry the tokens of the blocks it names (PFX-325) and batches
come in time order (PFX-326). With a finding comes its **window**: the fewest earlier events that
show it (the last event that made the hash, or the parent, what it is, or the clear since), so
that it can be pasted into a report.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from kvref.contract.events import BlockRemoved, BlockStored, KVEvent
from kvref.simulation.traces import TraceError

__all__ = [
    "Hash",
    "Scope",
    "StreamChecker",
    "StreamEvent",
    "StreamFinding",
    "check_stream",
    "read_json_lines",
    "write_stream",
]

#: A block hash as engines send it: an int (kvref, SGLang, vLLM with integer hashes) or bytes (vLLM).
Hash = int | bytes

STORED, REMOVED, CLEARED = "stored", "removed", "cleared"
#: The start of an engine's message: its sequence number (``batch``), time and rank; no change of state.
MESSAGE = "message"


class Scope(NamedTuple):
    """Which cache an event describes: an engine's data-parallel rank, KV cache group and medium
    (each None where the stream does not say). Residency is rebuilt per scope; a clear empties
    every scope of its rank."""

    rank: int | None = None
    group: int | None = None
    medium: str | None = None

    def describe(self) -> str:
        """The scope in words, empty for the default one."""
        parts = [
            f"rank {self.rank}" if self.rank is not None else "",
            f"group {self.group}" if self.group is not None else "",
        ]
        parts.append(self.medium or "")
        return ", ".join(p for p in parts if p)


DEFAULT_SCOPE = Scope()


def _show(h: Hash | None) -> str:
    if isinstance(h, bytes):
        return "0x" + h.hex()[:16] + ("..." if len(h) > 8 else "")
    return str(h)


class StreamEvent(NamedTuple):
    """One event of a stream: a store of ``hashes`` (a chain, the first under ``parent``), a removal
    of ``hashes`` or a clear; where it was read (``line``: the line of a JSON Lines stream, the
    message of a MessagePack one, 1-based; ``position``: its place in that message), the engine's
    ``batch`` id and timestamp ``ts`` where it has them (an engine's events have their message's),
    its :class:`Scope`, and for a store the number of token ids it carries and the block size it
    names (None where the form has none), and the token ids themselves where the reader was asked
    to keep them (a consumer that hashes tokens needs them; the checker does not)."""

    line: int
    kind: str
    hashes: tuple[Hash, ...] = ()
    parent: Hash | None = None
    batch: int | None = None
    scope: Scope = DEFAULT_SCOPE
    tokens: int | None = None
    block_size: int | None = None
    ts: float | None = None
    position: int = 0
    token_ids: tuple[int, ...] | None = None

    @classmethod
    def of(cls, line: int, event: KVEvent, batch: int | None = None) -> StreamEvent:
        """The stream event of one of kvref's own events (one hash each)."""
        if isinstance(event, BlockStored):
            return cls(line, STORED, (event.block_hash,), event.parent_hash, batch)
        if isinstance(event, BlockRemoved):
            return cls(line, REMOVED, (event.block_hash,), None, batch)
        return cls(line, CLEARED, (), None, batch)

    def describe(self) -> str:
        """The event as its line says it."""
        where = f"line {self.line}" if self.ts is None else f"message {self.line} event {self.position + 1}"
        if self.batch is not None:
            where += f" (batch {self.batch})"
        scope = self.scope.describe()
        if scope:
            where += f" [{scope}]"
        names = " ".join(_show(h) for h in self.hashes[:4]) + (
            f" ... ({len(self.hashes)} hashes)" if len(self.hashes) > 4 else ""
        )
        if self.kind == STORED:
            return f"{where}: stored {names} under {_show(self.parent)}"
        if self.kind == REMOVED:
            return f"{where}: removed {names}"
        if self.kind == MESSAGE:
            return (
                f"message {self.line}"
                + (f" (batch {self.batch})" if self.batch is not None else "")
                + f": sent at {self.ts}"
            )
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
        """The finding as plain data (``kvref events check --format json``)."""
        return {
            "rule": self.rule,
            "line": self.event.line,
            "position": self.event.position,
            "batch": self.event.batch,
            "reason": self.reason,
            "window": [e.describe() for e in (*self.window, self.event)],
        }


class StreamChecker:
    """A router's view of a stream, rebuilt event by event, that stops at the first event no
    conforming cache sends (PFX-322; PFX-324 with ``copies``; PFX-325; PFX-326).

    ``feed(event)`` returns that finding, or None; ``events`` counts the events fed (an engine's
    message markers aside).
    ``resident(scope)`` is the rebuilt set of hashes of one cache.
    """

    def __init__(self, *, copies: bool = False) -> None:
        """``copies``: the engine reports every copy of a hash (a store per copy, a removal per copy),
        so copies are counted per hash; else a hash is resident or not (PFX-317)."""
        self.copies = copies
        self.events = 0
        self._copies: dict[Scope, dict[Hash, int]] = {}
        self._last: dict[Scope, dict[Hash, StreamEvent]] = {}  # each hash's last store or removal, per cache
        self._cleared: dict[int | None, StreamEvent] = {}  # each rank's last clear
        self._messages: dict[int | None, StreamEvent] = {}  # each rank's last message

    def resident(self, scope: Scope = DEFAULT_SCOPE) -> frozenset[Hash]:
        """The hashes the stream says one cache holds now."""
        return frozenset(self._copies.get(scope, ()))

    def feed(self, event: StreamEvent) -> StreamFinding | None:
        """Apply one event; the finding it makes, or None."""
        scope = event.scope
        if event.kind == MESSAGE:
            return self._message(event, scope.rank)
        self.events += 1
        if event.kind == STORED:
            return self._store(event, scope)
        if event.kind == REMOVED:
            return self._remove(event, scope)
        for each in [s for s in self._copies if s.rank == scope.rank]:
            del self._copies[each]
            self._last.pop(each, None)
        self._cleared[scope.rank] = event
        return None

    def _message(self, event: StreamEvent, rank: int | None) -> StreamFinding | None:
        """An engine's message begins: its sequence number follows the last one's, its time is not
        earlier (PFX-326)."""
        before = self._messages.get(rank)
        self._messages[rank] = event
        if before is None:
            return None
        if event.batch is not None and before.batch is not None and event.batch != before.batch + 1:
            what = "repeats or goes back" if event.batch <= before.batch else f"skips {event.batch - before.batch - 1}"
            reason = (
                f"its sequence number {event.batch} {what} after {before.batch}: a consumer missed or replayed events"
            )
            return StreamFinding("PFX-326", event, reason, (before,))
        if event.ts is not None and before.ts is not None and event.ts < before.ts:
            reason = f"it was sent at {event.ts}, before the {before.ts} of the message before"
            return StreamFinding("PFX-326", event, reason, (before,))
        return None

    def _store(self, event: StreamEvent, scope: Scope) -> StreamFinding | None:
        if event.tokens is not None and event.block_size is not None:
            want = len(event.hashes) * event.block_size
            if event.block_size <= 0 or event.tokens != want:
                reason = (
                    f"it names {len(event.hashes)} blocks of {event.block_size} tokens but carries "
                    f"{event.tokens} token ids: a consumer cannot tell which tokens each hash covers"
                )
                return StreamFinding("PFX-325", event, reason)
        held = self._copies.get(scope)
        if held is None:
            held = self._copies[scope] = {}
            self._last[scope] = {}
        parent = event.parent
        if parent is not None and parent not in held:
            reason = f"its parent {_show(parent)} is not resident: a registration's parent must be (PFX-304)"
            return StreamFinding("PFX-324" if self.copies else "PFX-322", event, reason, self._window(scope, parent))
        last = self._last[scope]
        for h in event.hashes:
            count = held.get(h, 0)
            if count and not self.copies:
                reason = (
                    f"{_show(h)} is resident already: a store is due only when a hash gains its first copy (PFX-317)"
                )
                return StreamFinding("PFX-322", event, reason, self._window(scope, h))
            held[h] = count + 1
            last[h] = event
        return None

    def _remove(self, event: StreamEvent, scope: Scope) -> StreamFinding | None:
        held = self._copies.get(scope)
        if held is None:
            held = self._copies[scope] = {}
            self._last[scope] = {}
        last = self._last[scope]
        for h in event.hashes:
            count = held.get(h, 0)
            if not count:
                if self.copies:
                    rule, reason = "PFX-324", f"{_show(h)} has no stored copy left to remove"
                else:
                    rule = "PFX-322"
                    reason = f"{_show(h)} is not resident: a removal is due only when a resident hash loses its"
                    reason += " last copy (PFX-317)"
                return StreamFinding(rule, event, reason, self._window(scope, h))
            if count == 1:
                del held[h]
            else:
                held[h] = count - 1
            last[h] = event
        return None

    def _window(self, scope: Scope, h: Hash) -> tuple[StreamEvent, ...]:
        """The fewest earlier events that show what ``h`` is now: its last store or removal, else the
        clear that emptied the cache since (none: the stream never named it)."""
        last = self._last.get(scope, {}).get(h)
        if last is not None:
            return (last,)
        cleared = self._cleared.get(scope.rank)
        return (cleared,) if cleared is not None else ()


def check_stream(events: Iterable[StreamEvent], *, copies: bool = False) -> tuple[int, StreamFinding | None]:
    """How many events were read, and the first that breaks PFX-322..PFX-326 with its window (None: the
    stream is one a conforming cache could have sent). ``copies``: see :class:`StreamChecker`."""
    checker = StreamChecker(copies=copies)
    feed = checker.feed
    for event in events:
        finding = feed(event)
        if finding is not None:
            return checker.events, finding
    return checker.events, None


def write_stream(events: Iterable[KVEvent], path: Path) -> int:
    """Write ``events`` to ``path`` in kvref's JSON Lines form; return how many were written."""
    count = 0
    with path.open("w", encoding="utf-8") as out:
        for event in events:
            if isinstance(event, BlockStored):
                record: dict[str, object] = {"event": STORED, "hash": event.block_hash, "parent": event.parent_hash}
            elif isinstance(event, BlockRemoved):
                record = {"event": REMOVED, "hash": event.block_hash}
            else:
                record = {"event": CLEARED}
            out.write(json.dumps(record) + "\n")
            count += 1
    return count


def _hash(record: dict[str, object], key: str, where: str) -> int:
    value = record.get(key)
    if type(value) is not int or not 0 <= value < 2**64:
        raise TraceError("PFX-323", f"{where}: {key!r} must be a hash (an int in [0, 2**64)), got {value!r}")
    return value


def read_json_lines(path: Path) -> Iterator[StreamEvent]:
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
            if kind == STORED:
                parent = None if record.get("parent") is None else _hash(record, "parent", where)
                yield StreamEvent(number, STORED, (_hash(record, "hash", where),), parent, batch)
            elif kind == REMOVED:
                yield StreamEvent(number, REMOVED, (_hash(record, "hash", where),), None, batch)
            elif kind == CLEARED:
                yield StreamEvent(number, CLEARED, (), None, batch)
            else:
                raise TraceError("PFX-323", f"{where}: 'event' must be stored, removed or cleared, got {kind!r}")
