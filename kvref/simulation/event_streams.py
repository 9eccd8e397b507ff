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

An event lost without a trace (a removal of a hash never stored again) leaves a stream a cache
could send; a :class:`Snapshot` of what the cache held (``kvref replay --snapshot`` writes the
oracle's) is the witness: the rebuild must hold the same hashes there (PFX-327).

Lines are read with msgspec's typed decoder, which checks each line's fields as it parses it; a
line it refuses is read again with the standard library to say what is wrong with it.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, TypeGuard

import msgspec

from kvref.contract.events import BlockRemoved, BlockStored, KVEvent
from kvref.simulation.traces import TraceError

__all__ = [
    "Hash",
    "Scope",
    "StreamChecker",
    "StreamEvent",
    "StreamFinding",
    "check_stream",
    "is_hash",
    "Snapshot",
    "read_json_lines",
    "read_snapshots",
    "write_snapshot",
    "write_stream",
]

#: A block hash as engines send it: an int (kvref, SGLang, vLLM with integer hashes) or bytes (vLLM).
Hash = int | bytes

STORED, REMOVED, CLEARED = "stored", "removed", "cleared"
#: The start of an engine's message: its sequence number (``batch``), time and rank; no change of state.
MESSAGE = "message"
#: A snapshot of a cache compared with the rebuild (PFX-327); no change of state.
SNAPSHOT = "snapshot"


class Scope(msgspec.Struct, frozen=True, gc=False):
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


class StreamEvent(msgspec.Struct, frozen=True, gc=False):
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
        if self.kind == SNAPSHOT:
            where = f"snapshot {self.position} (after {self.line})" if self.position else f"snapshot after {self.line}"
            return where + (f" [{scope}]" if scope else "") + f": {names}"
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
    conforming cache sends (PFX-322; PFX-324 with ``copies``; PFX-325; PFX-326), and compares the
    rebuild with a snapshot of the cache where one is given (PFX-327).

    ``feed(event)`` returns that finding, or None; ``compare(snapshot)`` the finding that the
    rebuild and the snapshot differ, or None; ``events`` counts the events fed (an engine's message
    markers aside); ``resident(scope)`` is the rebuilt set of hashes of one cache.
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
        # The cache of the event before: most streams name one cache, so its two maps are kept at hand.
        self._scope: Scope | None = None
        self._held: dict[Hash, int] = {}
        self._made: dict[Hash, StreamEvent] = {}

    def resident(self, scope: Scope = DEFAULT_SCOPE) -> frozenset[Hash]:
        """The hashes the stream says one cache holds now."""
        return frozenset(self._copies.get(scope, ()))

    def _open(self, scope: Scope) -> None:
        """Make ``scope`` the cache at hand, with empty maps if the stream has not named it yet."""
        held = self._copies.get(scope)
        if held is None:
            held = self._copies[scope] = {}
            self._last[scope] = {}
        self._scope, self._held, self._made = scope, held, self._last[scope]

    def feed(self, event: StreamEvent) -> StreamFinding | None:
        """Apply one event; the finding it makes, or None."""
        kind = event.kind
        if kind == MESSAGE:
            return self._message(event, event.scope.rank)
        self.events += 1
        if event.scope is not self._scope:
            self._open(event.scope)
        held, made = self._held, self._made
        if kind == STORED:
            if event.tokens is not None and event.block_size is not None:
                finding = self._token_span(event)
                if finding is not None:
                    return finding
            parent = event.parent
            if parent is not None and parent not in held:
                reason = f"its parent {_show(parent)} is not resident: a registration's parent must be (PFX-304)"
                rule = "PFX-324" if self.copies else "PFX-322"
                return StreamFinding(rule, event, reason, self._window(event.scope, parent))
            for h in event.hashes:
                count = held.get(h, 0)
                if count and not self.copies:
                    reason = f"{_show(h)} is resident already: a store is due only when a hash gains its first copy"
                    return StreamFinding("PFX-322", event, reason + " (PFX-317)", self._window(event.scope, h))
                held[h] = count + 1
                made[h] = event
            return None
        if kind == REMOVED:
            for h in event.hashes:
                count = held.get(h, 0)
                if count == 1:
                    del held[h]
                elif count:
                    held[h] = count - 1
                else:
                    if self.copies:
                        rule, reason = "PFX-324", f"{_show(h)} has no stored copy left to remove"
                    else:
                        rule = "PFX-322"
                        reason = f"{_show(h)} is not resident: a removal is due only when a resident hash loses its"
                        reason += " last copy (PFX-317)"
                    return StreamFinding(rule, event, reason, self._window(event.scope, h))
                made[h] = event
            return None
        rank = event.scope.rank
        for each in [s for s in self._copies if s.rank == rank]:
            del self._copies[each]
            del self._last[each]
        self._scope = None
        self._cleared[rank] = event
        return None

    def _token_span(self, event: StreamEvent) -> StreamFinding | None:
        """PFX-325: a store's token ids span exactly the blocks it names."""
        size, tokens = event.block_size, event.tokens
        if size is not None and (size <= 0 or tokens != len(event.hashes) * size):
            reason = (
                f"it names {len(event.hashes)} blocks of {size} tokens but carries "
                f"{tokens} token ids: a consumer cannot tell which tokens each hash covers"
            )
            return StreamFinding("PFX-325", event, reason)
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

    def compare(self, snapshot: Snapshot) -> StreamFinding | None:
        """PFX-327: the rebuilt cache of ``snapshot.scope`` holds exactly the hashes the snapshot
        lists (with ``copies``, as many copies of each); the finding names one difference, how many
        there are, and the event that made that hash what the stream says it is."""
        held = self._copies.get(snapshot.scope, {})
        cache = snapshot.copies if self.copies else dict.fromkeys(snapshot.copies, 1)
        lost_stores = [h for h, n in cache.items() if held.get(h, 0) < n]
        lost_removals = [h for h, n in held.items() if cache.get(h, 0) < n]
        if not lost_stores and not lost_removals:
            return None
        counts = f"{len(lost_stores)} {'copies of ' if self.copies else ''}hashes the cache holds beyond the rebuild,"
        counts += f" {len(lost_removals)} the rebuild holds beyond the cache"
        if lost_stores:
            h = lost_stores[0]
            what = f"the cache holds {cache[h]} of {_show(h)}, the stream left {held.get(h, 0)}: a store was lost"
        else:
            h = lost_removals[0]
            what = f"the stream left {held[h]} of {_show(h)}, the cache holds {cache.get(h, 0)}: a removal was lost"
        event = StreamEvent(snapshot.after, SNAPSHOT, (h,), scope=snapshot.scope, position=snapshot.line)
        return StreamFinding("PFX-327", event, f"{what} ({counts})", self._window(snapshot.scope, h))

    def _window(self, scope: Scope, h: Hash) -> tuple[StreamEvent, ...]:
        """The fewest earlier events that show what ``h`` is now: its last store or removal, else the
        clear that emptied the cache since (none: the stream never named it)."""
        last = self._last.get(scope, {}).get(h)
        if last is not None:
            return (last,)
        cleared = self._cleared.get(scope.rank)
        return (cleared,) if cleared is not None else ()


class Snapshot(NamedTuple):
    """What one cache held at a point of its stream, as the cache itself says (``snapshot()``, or an
    engine's own dump): after every event up to line (or message) ``after``, the cache ``scope``
    held ``copies[h]`` copies of each hash ``h`` (one each for a cache that keeps one copy).
    ``line`` is where the snapshot was read (its line in the snapshots file)."""

    after: int
    copies: dict[Hash, int]
    scope: Scope = DEFAULT_SCOPE
    line: int = 0


def check_stream(
    events: Iterable[StreamEvent], *, copies: bool = False, snapshots: Iterable[Snapshot] = ()
) -> tuple[int, StreamFinding | None]:
    """How many events were read, and the first that breaks PFX-322..PFX-326 with its window (None: the
    stream is one a conforming cache could have sent). ``copies``: see :class:`StreamChecker`.

    Each of ``snapshots`` (in order of ``after``) is compared with the rebuild once every event up to
    its ``after`` is fed (PFX-327); snapshots after the stream's end are compared at its end.
    """
    checker = StreamChecker(copies=copies)
    feed = checker.feed
    pending = deque(sorted(snapshots, key=lambda s: s.after))
    due = pending[0].after if pending else None
    for event in events:
        while due is not None and event.line > due:
            finding = checker.compare(pending.popleft())
            if finding is not None:
                return checker.events, finding
            due = pending[0].after if pending else None
        finding = feed(event)
        if finding is not None:
            return checker.events, finding
    for snapshot in pending:
        finding = checker.compare(snapshot)
        if finding is not None:
            return checker.events, finding
    return checker.events, None


def write_snapshot(path: Path, after: int, resident: Iterable[Hash], scope: Scope = DEFAULT_SCOPE) -> None:
    """Append to ``path`` a snapshot of a cache in kvref's form (PFX-327): one JSON line saying that
    after line (or message) ``after`` of its stream the cache ``scope`` held ``resident``, each hash
    once per copy. An int hash is written as a number, a bytes hash (vLLM's digests) as
    ``"0x"`` and its hex digits."""
    record: dict[str, object] = {
        "after": after,
        "resident": [h if isinstance(h, int) else "0x" + h.hex() for h in resident],
    }
    record.update(
        (k, v) for k, v in (("rank", scope.rank), ("group", scope.group), ("medium", scope.medium)) if v is not None
    )
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


class _SnapshotLine(msgspec.Struct, gc=False):
    after: int
    resident: list[int | str]
    rank: int | None = None
    group: int | None = None
    medium: str | None = None


def read_snapshots(path: Path) -> list[Snapshot]:
    """The snapshots in ``path`` (see :func:`write_snapshot`); a line that is not one stops the read with
    TraceError naming the file, the line and what is wrong (PFX-323). Blank lines are skipped."""
    decode = msgspec.json.Decoder(_SnapshotLine).decode
    snapshots = []
    with path.open("rb") as lines:
        for number, text in enumerate(lines, 1):
            if not text.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = decode(text)
            except msgspec.DecodeError as exc:
                why = 'a snapshot is {"after": LINE, "resident": [HASH, ...]} with an optional rank, group, medium'
                raise TraceError("PFX-323", f"{where}: {exc}; {why}") from None
            if record.after < 0:
                raise TraceError("PFX-323", f"{where}: 'after' must be a line or message number, got {record.after}")
            copies: dict[Hash, int] = {}
            for value in record.resident:
                h = _snapshot_hash(value, where)
                copies[h] = copies.get(h, 0) + 1
            snapshots.append(Snapshot(record.after, copies, Scope(record.rank, record.group, record.medium), number))
    return snapshots


def is_hash(value: object) -> TypeGuard[Hash]:
    """Whether ``value`` is a block hash as engines send them: a 64-bit int, unsigned (vLLM's) or
    signed (SGLang's), or bytes (vLLM's digests)."""
    return (type(value) is int and -(2**63) <= value < 2**64) or type(value) is bytes


def _snapshot_hash(value: int | str, where: str) -> Hash:
    """A snapshot's hash: an int as engines send them (:func:`is_hash`), or ``0x`` and hex digits."""
    parsed: object = value
    if isinstance(value, str) and value.startswith("0x"):
        with suppress(ValueError):
            parsed = bytes.fromhex(value[2:])
    if is_hash(parsed):
        return parsed
    raise TraceError("PFX-323", f"{where}: a resident hash must be a 64-bit int or '0x' and hex digits, got {value!r}")


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


def _refused_line(text: bytes, where: str) -> TraceError:
    """Why a line that the fast reader refused is not an event, found by reading it slowly (PFX-323)."""
    if text.startswith(b"\xef\xbb\xbf"):
        return TraceError(
            "PFX-323", f"{where}: the line starts with a byte-order mark; write the file as UTF-8 without one"
        )
    try:
        record = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return TraceError("PFX-323", f"{where}: not JSON ({getattr(exc, 'msg', exc)})")
    if not isinstance(record, dict):
        return TraceError("PFX-323", f"{where}: an event is a JSON object, got {type(record).__name__}")
    batch = record.get("batch")
    if batch is not None and type(batch) is not int:
        return TraceError("PFX-323", f"{where}: 'batch' must be an int, got {batch!r}")
    kind = record.get("event")
    if kind not in (STORED, REMOVED, CLEARED):
        return TraceError("PFX-323", f"{where}: 'event' must be stored, removed or cleared, got {kind!r}")
    try:
        if kind != CLEARED:
            _hash(record, "hash", where)
        if kind == STORED and record.get("parent") is not None:
            _hash(record, "parent", where)
    except TraceError as refused:
        return refused
    return TraceError("PFX-323", f"{where}: not an event of kvref's form")  # pragma: no cover - read above


class _StoredLine(msgspec.Struct, tag_field="event", tag=STORED, gc=False):
    hash: int
    parent: int | None = None
    batch: int | None = None


class _RemovedLine(msgspec.Struct, tag_field="event", tag=REMOVED, gc=False):
    hash: int
    batch: int | None = None


class _ClearedLine(msgspec.Struct, tag_field="event", tag=CLEARED, gc=False):
    batch: int | None = None


_LINE = msgspec.json.Decoder(_StoredLine | _RemovedLine | _ClearedLine)


def read_json_lines(path: Path) -> Iterator[StreamEvent]:
    """The events of a stream in kvref's JSON Lines form; a line that is not one stops the read with
    TraceError naming the file, the line and what is wrong (PFX-323). Blank lines are skipped."""
    decode = _LINE.decode
    with path.open("rb") as lines:
        for number, text in enumerate(lines, 1):
            try:
                record = decode(text)
            except msgspec.DecodeError:  # a blank line, or one that is no event: say which
                if text.strip():
                    raise _refused_line(text, f"{path}:{number}") from None
                continue
            if type(record) is _StoredLine:
                h, parent = record.hash, record.parent
                if not 0 <= h < 2**64 or not (parent is None or 0 <= parent < 2**64):
                    raise _refused_line(text, f"{path}:{number}")
                yield StreamEvent(number, STORED, (h,), parent, record.batch)
            elif type(record) is _RemovedLine:
                if not 0 <= record.hash < 2**64:
                    raise _refused_line(text, f"{path}:{number}")
                yield StreamEvent(number, REMOVED, (record.hash,), None, record.batch)
            else:
                yield StreamEvent(number, CLEARED, (), None, record.batch)
