"""Recorded KV-event streams and their checker (PFX-316, PFX-322, PFX-323).

Streams recorded from the oracle under every policy check clean and rebuild the pool's resident
hashes; a fault planted at a random place that contradicts the stream itself (a store or removal
sent twice, a parent no store named, a store dropped while its hash is still removed later) is
reported with the rule, the line and the window that shows it.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.cli.main import main
from kvref.config.registry import create_pool
from kvref.contract.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, apply_events
from kvref.contract.policies import EvictionPolicy
from kvref.simulation.event_streams import StreamEvent, check_stream, write_stream
from kvref.simulation.replay import replay
from kvref.simulation.stream_files import read_stream
from kvref.simulation.traces import TraceError
from kvref.simulation.workloads import workload_trace

rule = pytest.mark.rule


def recorded(policy: str, capacity: int = 48, workload: str = "chat") -> tuple[list[StreamEvent], frozenset[int]]:
    """The events of one oracle replay, as a stream's lines, and the pool's resident hashes at its end."""
    pool = create_pool(capacity + 1, backend="oracle", policy=policy, events=True)
    replay(workload_trace(workload, seed=2), pool)
    events = pool.take_events()
    return [StreamEvent.of(i + 1, e) for i, e in enumerate(events)], pool.resident_hashes()


STREAM, _ = recorded("lru")


@rule("PFX-322", "PFX-316")
@pytest.mark.parametrize("policy", [p.value for p in EvictionPolicy])
@pytest.mark.parametrize("workload", ["chat", "agent"])
def test_a_stream_the_oracle_sends_checks_clean_and_rebuilds_its_resident_hashes(policy: str, workload: str) -> None:
    stream, resident = recorded(policy, workload=workload)
    count, finding = check_stream(stream)
    assert finding is None, finding.describe()
    assert count == len(stream) and apply_events(set(), kv_events(stream)) == resident


def renumbered(events: list[StreamEvent]) -> list[StreamEvent]:
    return [msgspec.structs.replace(e, line=i + 1) for i, e in enumerate(events)]


def kv_events(stream: list[StreamEvent]) -> list[KVEvent]:
    """kvref's own events of a stream in its one-hash-a-line form."""
    out: list[KVEvent] = []
    for e in stream:
        if e.kind == "stored":
            out.append(BlockStored(int(e.hashes[0]), None if e.parent is None else int(e.parent)))
        elif e.kind == "removed":
            out.append(BlockRemoved(int(e.hashes[0])))
        else:
            out.append(AllBlocksCleared())
    return out


@rule("PFX-322", "PFX-323")
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_fault_that_contradicts_the_stream_is_reported_at_its_line_with_its_window(data: st.DataObject) -> None:
    stream = list(STREAM)
    kind = data.draw(st.sampled_from(["store twice", "remove twice", "unknown parent", "drop a store"]), label="kind")
    if kind == "store twice" or kind == "remove twice":
        wanted = "stored" if kind == "store twice" else "removed"
        at = data.draw(st.sampled_from([i for i, e in enumerate(stream) if e.kind == wanted]), label="at")
        stream.insert(at + 1, stream[at])
        expected: int | None = at + 2
    elif kind == "unknown parent":
        at = data.draw(st.sampled_from([i for i, e in enumerate(stream) if e.kind == "stored"]), label="at")
        stream[at] = msgspec.structs.replace(stream[at], parent=2**63 + 1)  # a hash no store named
        expected = at + 1
    else:  # a store whose hash is removed later: the removal, or an earlier use as a parent, gives it away
        removed_later = {
            i
            for i, e in enumerate(stream)
            if e.kind == "stored" and any(f.kind == "removed" and f.hashes == e.hashes for f in stream[i:])
        }
        at = data.draw(st.sampled_from(sorted(removed_later)), label="at")
        del stream[at]
        expected = None
    _, finding = check_stream(renumbered(stream))
    assert finding is not None, f"{kind} at {at} went unreported"
    assert finding.rule == "PFX-322", finding.describe()
    if kind in ("store twice", "remove twice"):  # a hash the stream never named before has no window
        assert [(e.kind, e.hashes) for e in finding.window] == [(finding.event.kind, finding.event.hashes)], (
            finding.describe()
        )
    if expected is not None:
        assert finding.event.line == expected, finding.describe()
    else:
        assert finding.event.line >= at + 1, finding.describe()


@rule("PFX-323")
def test_the_window_is_the_last_event_that_made_the_hash_what_it_is() -> None:
    stream = renumbered([StreamEvent.of(0, e) for e in (BlockStored(1, None), BlockStored(2, 1), BlockRemoved(2))])
    stream.append(StreamEvent.of(4, BlockRemoved(2)))
    _, finding = check_stream(stream)
    assert finding is not None and [e.line for e in finding.window] == [3] and finding.event.line == 4
    assert finding.describe().splitlines()[1:] == ["  line 3: removed 2", "  line 4: removed 2"]


@rule("PFX-323")
@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("not json", "not JSON"),
        ("[1]", "JSON object"),
        ('{"event": "evicted", "hash": 1}', "stored, removed or cleared"),
        ('{"event": "stored", "hash": -1, "parent": null}', "'hash' must be a hash"),
        ('{"event": "stored", "hash": 1, "parent": "x"}', "'parent' must be a hash"),
        ('{"event": "removed", "hash": true}', "'hash' must be a hash"),
        ('{"event": "cleared", "batch": "7"}', "'batch' must be an int"),
    ],
)
def test_a_line_that_is_no_event_stops_the_read_naming_the_file_and_line(tmp_path: Path, line: str, says: str) -> None:
    path = tmp_path / "stream.jsonl"
    path.write_text('{"event": "stored", "hash": 1, "parent": null}\n\n' + line + "\n", encoding="utf-8")
    with pytest.raises(TraceError, match=r"\[PFX-323\]") as raised:
        list(read_stream(path))
    assert f"{path}:3" in str(raised.value) and says in str(raised.value)


@rule("PFX-323")
def test_replay_records_a_stream_and_events_check_reads_it_clean_then_names_a_planted_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stream = tmp_path / "events.jsonl"
    assert main(["replay", "--capacity", "40", "--policy", "lru", "--events", str(stream), "--json"]) == 0
    capsys.readouterr()
    assert main(["events", "check", str(stream)]) == 0
    assert "each one a conforming cache could have sent" in capsys.readouterr().out
    lines = stream.read_text(encoding="utf-8").splitlines()
    removal = next(i for i, text in enumerate(lines) if '"removed"' in text)
    lines.insert(removal + 1, lines[removal])
    stream.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["events", "check", str(stream), "--json"]) == 1
    found = json.loads(capsys.readouterr().out)["finding"]
    assert found["rule"] == "PFX-322" and found["line"] == removal + 2 and len(found["window"]) == 2


@rule("PFX-327")
def test_replay_writes_the_caches_snapshot_and_events_check_finds_a_removal_lost_without_a_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stream, snapshot = tmp_path / "events.jsonl", tmp_path / "snapshot.jsonl"
    argv = ["replay", "--capacity", "40", "--policy", "lru", "--events", str(stream), "--snapshot", str(snapshot)]
    assert main([*argv, "--json"]) == 0
    capsys.readouterr()
    assert main(["events", "check", str(stream), "--snapshots", str(snapshot)]) == 0
    assert "holds what the cache held at its 1 snapshot (PFX-327)" in capsys.readouterr().out
    lines = stream.read_text(encoding="utf-8").splitlines()
    last_removal = max(i for i, text in enumerate(lines) if '"removed"' in text)
    removed = json.loads(lines.pop(last_removal))["hash"]
    stream.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["events", "check", str(stream)]) == 0, "without the snapshot the stream is one a cache could send"
    capsys.readouterr()
    assert main(["events", "check", str(stream), "--snapshots", str(snapshot), "--json"]) == 1
    found = json.loads(capsys.readouterr().out)["finding"]
    assert found["rule"] == "PFX-327" and f"{removed}" in found["reason"] and "a removal was lost" in found["reason"]
    assert main(["events", "check", str(stream), "--snapshots", str(snapshot)]) == 1
    said = capsys.readouterr().out
    assert "the rebuild and the cache's snapshot disagree" in said
    assert f"[PFX-327] snapshot 1 (after {len(lines) + 1})" in said


@rule("PFX-327", "CONF-912")
@pytest.mark.parametrize("events", [None, "same"])
def test_replay_refuses_a_snapshot_without_its_own_events_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], events: str | None
) -> None:
    snapshot = tmp_path / "s.jsonl"
    argv = ["replay", "--capacity", "40", "--policy", "lru", "--snapshot", str(snapshot)]
    if events:
        argv += ["--events", str(snapshot)]
    assert main(argv) == 2
    assert "[PFX-327]" in capsys.readouterr().err and not snapshot.exists()


@rule("PFX-323", "CONF-912")
def test_replay_refuses_to_record_events_of_more_than_one_replay(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--capacity", "40", "--events", "x.jsonl"]) == 2
    assert "[PFX-323]" in capsys.readouterr().err


@rule("PFX-322", "PFX-323")
def test_written_streams_read_back_event_for_event(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    assert write_stream(kv_events(STREAM), path) == len(STREAM)
    assert list(read_stream(path)) == STREAM
