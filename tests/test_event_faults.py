"""Faults injected into recorded KV-event streams are all reported; clean streams report nothing
(PFX-322..PFX-327).

Streams are recorded from the oracle, torch and CuPy under every policy, each with the cache's
resident hashes at its end as a snapshot (``kvref replay --snapshot``). One fault at a random place:

* an event dropped (a store, a removal);
* an event sent twice;
* two events that say opposite things of one hash swapped, or a child stored before its parent;
* a store's parent replaced by a hash the cache never held;
* a removal of a copy too many, in a stream of a cache that reports every copy (two oracle caches
  over the same workload, merged: each hash's copies are the two caches' together);
* a store's token ids cut short, and a message lost, in vLLM's and SGLang's recorded streams.

Each is reported, at or after the event it changed, never before: a fault the stream itself
contradicts by the rule the contradiction breaks, any other by the snapshot (PFX-327). The number
of examples is ``KVREF_FAULT_EXAMPLES`` (``nox -s events-faults`` runs many).
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.config.registry import create_pool
from kvref.contract.policies import EvictionPolicy
from kvref.simulation.event_streams import (
    CLEARED,
    MESSAGE,
    REMOVED,
    STORED,
    Hash,
    Snapshot,
    StreamEvent,
    StreamFinding,
    check_stream,
    read_snapshots,
    write_snapshot,
)
from kvref.simulation.replay import replay
from kvref.simulation.stream_files import read_stream
from kvref.simulation.traces import TraceError
from kvref.simulation.workloads import workload_trace

rule = pytest.mark.rule

EXAMPLES = int(os.environ.get("KVREF_FAULT_EXAMPLES", "150"))
ENGINE_STREAMS = Path(__file__).parent / "data" / "engine-events"
Recording = tuple[tuple[StreamEvent, ...], dict[Hash, int]]


@cache
def recorded(backend: str, policy: str, workload: str = "chat", capacity: int = 48) -> Recording:
    """One replay's stream, a line per event, and the cache's resident hashes at its end."""
    pool = create_pool(capacity + 1, backend=backend, policy=policy, events=True)
    replay(workload_trace(workload, seed=3), pool)
    stream = tuple(StreamEvent.of(i + 1, e) for i, e in enumerate(pool.take_events()))
    return stream, dict.fromkeys(pool.resident_hashes(), 1)


@cache
def merged_copies(policy: str) -> Recording:
    """A stream of a cache that keeps two copies: two oracle caches of different sizes over one
    workload, their events interleaved in one stream; a hash's copies are the two caches' together."""
    (small, small_held), (large, large_held) = recorded("oracle", policy, capacity=40), recorded("oracle", policy)
    interleaved = [e for pair in zip(small, large, strict=False) for e in pair]
    interleaved += small[len(large) :] + large[len(small) :]
    held = {h: small_held.get(h, 0) + large_held.get(h, 0) for h in small_held.keys() | large_held.keys()}
    return renumbered(interleaved), held


def renumbered(events: list[StreamEvent]) -> tuple[StreamEvent, ...]:
    return tuple(msgspec.structs.replace(e, line=i + 1) for i, e in enumerate(events))


def verdict(
    stream: list[StreamEvent], held: dict[Hash, int], *, copies: bool = False
) -> tuple[int, StreamFinding | None]:
    end = stream[-1].line if stream else 0
    return check_stream(stream, copies=copies, snapshots=[Snapshot(end, held, line=1)])


def positions(stream: list[StreamEvent], *kinds: str) -> list[int]:
    return [i for i, e in enumerate(stream) if e.kind in kinds]


def inject(data: st.DataObject, stream: list[StreamEvent], fault: str) -> int:
    """Apply ``fault`` to ``stream`` in place; the index of the first event it changed."""
    if fault == "drop":
        at = data.draw(st.sampled_from(positions(stream, STORED, REMOVED)), label="at")
        del stream[at]
        return at
    if fault == "duplicate":
        at = data.draw(st.sampled_from(positions(stream, STORED, REMOVED)), label="at")
        stream.insert(at + 1, stream[at])
        return at + 1
    if fault == "swap a store and its removal":  # the removal comes first, of a hash not resident yet
        last_store: dict[object, int] = {}
        pairs = []
        for j, e in enumerate(stream):
            if e.kind == STORED:
                last_store[e.hashes] = j
            elif e.kind == REMOVED and e.hashes in last_store:
                pairs.append((last_store.pop(e.hashes), j))
        i, j = data.draw(st.sampled_from(pairs), label="store, removal")
        stream[i], stream[j] = stream[j], stream[i]
        return i
    if fault == "child before parent":  # the child comes first, under a parent not resident yet
        next_child: dict[object, int] = {}
        pairs = []
        for j in range(len(stream) - 1, -1, -1):
            e = stream[j]
            if e.kind == STORED:
                if e.hashes[0] in next_child:
                    pairs.append((j, next_child[e.hashes[0]]))
                next_child[e.parent] = j
        i, j = data.draw(st.sampled_from(sorted(pairs)), label="parent, child")
        stream[i], stream[j] = stream[j], stream[i]
        return i
    if fault == "detach a parent":
        at = data.draw(st.sampled_from(positions(stream, STORED)), label="at")
        stream[at] = msgspec.structs.replace(stream[at], parent=2**64 - 1 - at)  # a hash no cache held
        return at
    if fault == "remove a copy too many":
        at = data.draw(st.sampled_from(positions(stream, REMOVED)), label="at")
        stream.insert(at + 1, stream[at])
        return at + 1
    raise AssertionError(fault)  # pragma: no cover


def assert_reported(stream: list[StreamEvent], held: dict[Hash, int], at: int, *, copies: bool = False) -> None:
    renumbered_stream = list(renumbered(stream))
    _, finding = verdict(renumbered_stream, held, copies=copies)
    assert finding is not None, f"a fault at event {at + 1} went unreported"
    assert finding.event.line >= at + 1, f"reported before the fault at {at + 1}: {finding.describe()}"


POLICIES = [p.value for p in EvictionPolicy]
FAULTS = ["drop", "duplicate", "swap a store and its removal", "child before parent", "detach a parent"]


@rule("PFX-322", "PFX-327")
@pytest.mark.parametrize("backend", ["oracle", "torch", "cupy"])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_stream_recorded_from_any_backend_checks_clean_against_its_snapshot(backend: str, policy: str) -> None:
    if backend != "oracle":
        pytest.importorskip(backend)
    stream, held = recorded(backend, policy)
    count, finding = verdict(list(stream), held)
    assert finding is None, finding.describe()
    assert count == len(stream)
    if backend != "oracle":
        assert stream == recorded("oracle", policy)[0], f"{backend} sent other events than the oracle"


@rule("PFX-322", "PFX-327")
@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data(), policy=st.sampled_from(POLICIES), fault=st.sampled_from(FAULTS))
def test_every_fault_injected_in_a_stream_is_reported_at_or_after_it(
    data: st.DataObject, policy: str, fault: str
) -> None:
    stream, held = recorded("oracle", policy, data.draw(st.sampled_from(["chat", "agent"]), label="workload"))
    changed = list(stream)
    at = inject(data, changed, fault)
    assert_reported(changed, held, at)
    if fault != "drop":  # the stream contradicts itself at the changed event: PFX-322 names it there
        _, finding = verdict(list(renumbered(changed)), held)
        assert finding is not None and (finding.rule, finding.event.line) == ("PFX-322", at + 1), finding


@rule("PFX-324", "PFX-327")
def test_a_cache_that_reports_every_copy_checks_clean_with_copies_counted() -> None:
    stream, held = merged_copies("lru")
    assert verdict(list(stream), held, copies=True)[1] is None
    assert verdict(list(stream), held)[1] is not None  # one copy per hash is not what this cache keeps


@rule("PFX-324", "PFX-327")
@settings(max_examples=EXAMPLES // 3 or 1, deadline=None)
@given(
    data=st.data(),
    policy=st.sampled_from(POLICIES),
    fault=st.sampled_from(["remove a copy too many", "drop", "duplicate"]),
)
def test_every_fault_in_a_stream_that_counts_copies_is_reported(data: st.DataObject, policy: str, fault: str) -> None:
    stream, held = merged_copies(policy)
    changed = list(stream)
    at = inject(data, changed, fault)
    assert_reported(changed, held, at, copies=True)


@cache
def clean_engine_streams() -> dict[str, tuple[StreamEvent, ...]]:
    """The recorded engine streams that check clean as they are (the hybrid groups' do not: PFX-324)."""
    pytest.importorskip("msgpack")
    streams = {p.name: tuple(read_stream(p)) for p in sorted(ENGINE_STREAMS.glob("*.msgpack"))}
    return {name: stream for name, stream in streams.items() if check_stream(stream, copies=True)[1] is None}


@rule("PFX-325", "PFX-326")
@settings(max_examples=EXAMPLES // 3 or 1, deadline=None)
@given(data=st.data(), fault=st.sampled_from(["cut token ids", "lose a message"]))
def test_token_ids_cut_short_or_a_message_lost_in_an_engine_stream_are_reported(
    data: st.DataObject, fault: str
) -> None:
    streams = clean_engine_streams()
    assert len(streams) >= 2, f"expected vLLM's and SGLang's full-attention streams among {sorted(streams)}"
    stream = list(streams[data.draw(st.sampled_from(sorted(streams)), label="stream")])
    if fault == "cut token ids":
        stores = [i for i, e in enumerate(stream) if e.kind == STORED and e.tokens]
        at = data.draw(st.sampled_from(stores), label="at")
        stream[at] = msgspec.structs.replace(stream[at], tokens=(stream[at].tokens or 0) - 1)
        expected = "PFX-325"
    else:  # a whole message lost between two others: the next one's sequence number skips it
        messages = positions(stream, MESSAGE)
        k = data.draw(st.integers(1, len(messages) - 2), label="message")
        at = messages[k]
        del stream[at : messages[k + 1]]
        expected = "PFX-326"
    _, finding = check_stream(stream, copies=True)
    assert finding is not None and finding.rule == expected, f"{fault} at {at}: {finding}"
    assert (finding.event.line, finding.event.position) == (stream[at].line, stream[at].position), finding.describe()


@rule("PFX-327")
def test_a_snapshot_names_the_hash_that_differs_and_the_event_that_made_it_what_the_stream_says() -> None:
    stream = [StreamEvent(1, STORED, (5,)), StreamEvent(2, STORED, (6,), 5), StreamEvent(3, REMOVED, (6,))]
    _, lost_removal = check_stream(stream[:2], snapshots=[Snapshot(2, {5: 1}, line=1)])
    assert lost_removal is not None and lost_removal.rule == "PFX-327"
    assert "a removal was lost" in lost_removal.reason and [e.line for e in lost_removal.window] == [2]
    _, lost_store = check_stream(stream, snapshots=[Snapshot(3, {5: 1, 6: 1, 7: 1}, line=1)])
    assert lost_store is not None and "a store was lost" in lost_store.reason and "6" in lost_store.describe()
    _, between = check_stream(stream, snapshots=[Snapshot(1, {5: 1}), Snapshot(2, {5: 1})])
    assert between is not None and between.event.line == 2, "a snapshot is compared once its line is applied"
    assert check_stream(stream, snapshots=[Snapshot(1, {5: 1}), Snapshot(2, {5: 1, 6: 1}), Snapshot(9, {5: 1})]) == (
        3,
        None,
    )
    cleared = [*stream, StreamEvent(4, CLEARED)]
    assert check_stream(cleared, snapshots=[Snapshot(4, {})]) == (4, None)


@rule("PFX-323", "PFX-327")
def test_snapshots_read_back_as_written_and_a_line_that_is_none_names_its_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "snapshots.jsonl"
    write_snapshot(path, 7, [3, 3, 2**64 - 1, b"\x01\xff"])
    (snapshot,) = read_snapshots(path)
    assert snapshot == Snapshot(7, {3: 2, 2**64 - 1: 1, b"\x01\xff": 1}, line=1)
    for bad, says in [
        ('{"after": 1}', "resident"),
        ('{"after": -1, "resident": []}', "'after'"),
        ('{"after": 1, "resident": [2e3]}', "resident"),
        ('{"after": 1, "resident": ["0xzz"]}', "a resident hash"),
        ('{"after": 1, "resident": [18446744073709551616]}', "a resident hash"),
        ("[1]", "snapshot"),
    ]:
        path.write_text('{"after": 1, "resident": []}\n\n' + bad + "\n", encoding="utf-8")
        with pytest.raises(TraceError, match=r"\[PFX-323\]") as raised:
            read_snapshots(path)
        assert f"{path}:3" in str(raised.value) and says in str(raised.value), raised.value
