"""Engines' recorded KV-event streams (vLLM's and SGLang's KVEventBatch in MessagePack) and their checks.

The oracle's events, sent as an engine sends them (chained stores coalesced as SGLang's recorder
does, messages numbered as a subscriber records them), check clean under PFX-322 and PFX-324; a
fault planted at a random place (a message dropped, repeated or moved, a parent detached, token
ids cut short, a copy removed once too often, a store of a hash removed later dropped) is
reported every time, with the rule it breaks and where. The map and array encodings read alike,
and where vLLM or SGLang is installed, their own encoders write what kvref reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvref.cli.main import main
from kvref.config.registry import create_pool
from kvref.contract.events import BlockRemoved, BlockStored, KVEvent
from kvref.simulation.engine_events import EngineBatch, read_engine_stream, write_engine_stream
from kvref.simulation.event_streams import Scope, StreamChecker, check_stream, read_snapshots
from kvref.simulation.replay import replay
from kvref.simulation.stream_files import read_stream
from kvref.simulation.traces import TraceError
from kvref.simulation.workloads import workload_trace

msgpack = pytest.importorskip("msgpack")
rule = pytest.mark.rule

BLOCK = 4


def engine_events(events: list[KVEvent]) -> list[dict[str, Any]]:
    """kvref's events as an engine sends them: a store that continues the last store's chain joins it."""
    out: list[dict[str, Any]] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, BlockStored):
            if last is not None and last["type"] == "BlockStored" and last["block_hashes"][-1] == event.parent_hash:
                last["block_hashes"].append(event.block_hash)
                last["token_ids"].extend([event.block_hash % 97] * BLOCK)
                continue
            out.append(
                {
                    "type": "BlockStored",
                    "block_hashes": [event.block_hash],
                    "parent_block_hash": event.parent_hash,
                    "token_ids": [event.block_hash % 97] * BLOCK,
                    "block_size": BLOCK,
                    "lora_id": None,
                    "medium": "GPU",
                }
            )
        elif isinstance(event, BlockRemoved):
            out.append({"type": "BlockRemoved", "block_hashes": [event.block_hash], "medium": "GPU"})
        else:
            out.append({"type": "AllBlocksCleared"})
    return out


def batches_of(events: list[dict[str, Any]], per: int = 5, rank: int | None = 0) -> list[EngineBatch]:
    return [(1000.0 + i, events[i * per : (i + 1) * per], rank) for i in range((len(events) + per - 1) // per)]


def oracle_batches(policy: str = "lru", workload: str = "chat") -> list[EngineBatch]:
    pool = create_pool(49, backend="oracle", policy=policy, events=True)
    replay(workload_trace(workload, seed=2), pool)
    return batches_of(engine_events(pool.take_events()))


BATCHES = oracle_batches()


def recorded(path: Path, numbers: list[int], batches: list[EngineBatch]) -> Path:
    """``batches`` as a subscriber records them, each with the sequence number given."""
    path.write_bytes(
        b"".join(msgpack.packb([n, msgpack.packb(list(b))]) for n, b in zip(numbers, batches, strict=True))
    )
    return path


def written(tmp_path: Path, batches: list[EngineBatch], name: str = "stream.msgpack", **kw: Any) -> Path:
    path = tmp_path / name
    write_engine_stream(batches, path, **kw)
    return path


@rule("PFX-322", "PFX-324", "PFX-325", "PFX-326")
@pytest.mark.parametrize("policy", ["lru", "fifo", "lru-leaf", "ref-zero"])
@pytest.mark.parametrize("workload", ["chat", "agent"])
def test_the_oracles_events_sent_as_an_engine_sends_them_check_clean(
    tmp_path: Path, policy: str, workload: str
) -> None:
    batches = oracle_batches(policy, workload)
    for sequenced in (True, False):
        path = written(tmp_path, batches, sequenced=sequenced)
        for copies in (False, True):
            count, finding = check_stream(read_stream(path), copies=copies)
            assert finding is None, finding.describe()
            assert count == sum(len(events) for _, events, _ in batches)


@rule("PFX-323")
def test_the_array_encoding_of_older_releases_reads_as_the_map_encoding(tmp_path: Path) -> None:
    fields: dict[str, tuple[str, ...]] = {
        "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
    }
    fields["BlockRemoved"] = ("block_hashes", "medium")
    as_arrays: list[Any] = [
        (ts, [[e["type"], *(e.get(name) for name in fields.get(e["type"], ()))] for e in events], rank)
        for ts, events, rank in BATCHES
    ]
    maps = list(read_engine_stream(written(tmp_path, BATCHES, "maps")))
    arrays = list(read_engine_stream(written(tmp_path, as_arrays, "arrays")))
    assert [(e.kind, e.hashes, e.parent, e.tokens, e.block_size) for e in arrays] == [
        (e.kind, e.hashes, e.parent, e.tokens, e.block_size) for e in maps
    ]


FAULTS = ["drop a message", "repeat a message", "move a message", "detach a parent", "cut token ids"]
FAULTS += ["remove a copy too many", "drop a store removed later"]


@rule("PFX-322", "PFX-324", "PFX-325", "PFX-326", "PFX-323")
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_every_planted_fault_is_reported_with_its_rule_and_place(tmp_path_factory: Any, data: st.DataObject) -> None:
    batches = [(ts, [dict(e) for e in events], rank) for ts, events, rank in BATCHES]
    numbers = list(range(len(batches)))  # each message's sequence number, as recorded before the fault
    kind = data.draw(st.sampled_from(FAULTS), label="fault")
    copies = data.draw(st.booleans(), label="copies")
    expected_rules = {"PFX-324" if copies else "PFX-322"}
    at_least = 1
    if kind in ("drop a message", "repeat a message", "move a message"):
        m = data.draw(st.integers(1, len(batches) - 2), label="message")
        if kind == "drop a message":
            del batches[m], numbers[m]
        elif kind == "repeat a message":
            batches.insert(m + 1, batches[m])
            numbers.insert(m + 1, numbers[m])
        else:
            batches[m], batches[m + 1] = batches[m + 1], batches[m]
            numbers[m], numbers[m + 1] = numbers[m + 1], numbers[m]
        expected_rules, at_least = {"PFX-326"}, m + 1
    else:
        places = [
            (m, i)
            for m, (_, events, _) in enumerate(batches)
            for i, e in enumerate(events)
            if e["type"] == ("BlockRemoved" if kind == "remove a copy too many" else "BlockStored")
            and (kind != "detach a parent" or e["parent_block_hash"] is not None)
            and (kind != "drop a store removed later" or removed_later(batches, m, i))
        ]
        m, i = data.draw(st.sampled_from(places), label="place")
        event = batches[m][1][i]
        at_least = m + 1
        if kind == "detach a parent":
            event["parent_block_hash"] = 2**63 + 7  # a hash no store named
        elif kind == "cut token ids":
            event["token_ids"] = event["token_ids"][:-1]
            expected_rules = {"PFX-325"}
        elif kind == "remove a copy too many":
            batches[m][1].insert(i + 1, dict(event))
        else:
            del batches[m][1][i]
    path = recorded(tmp_path_factory.mktemp("fault") / "stream.msgpack", numbers, batches)
    _, finding = check_stream(read_stream(path), copies=copies)
    assert finding is not None, f"{kind} at message {at_least} went unreported"
    assert finding.rule in expected_rules, finding.describe()
    assert finding.event.line >= at_least, finding.describe()
    if kind != "drop a store removed later":  # that one shows where the hash is next named
        assert finding.event.line == at_least + (kind == "repeat a message"), finding.describe()


def removed_later(batches: list[EngineBatch], m: int, i: int) -> bool:
    """Whether a later event removes one of the hashes the store at (m, i) names."""
    named = set(batches[m][1][i]["block_hashes"])
    later = [e for events in (batches[m][1][i + 1 :], *(b[1] for b in batches[m + 1 :])) for e in events]
    return any(e["type"] == "BlockRemoved" and named & set(e["block_hashes"]) for e in later)


@rule("PFX-324", "PFX-322")
def test_an_engine_that_reports_every_copy_checks_clean_with_copies_and_not_without(tmp_path: Path) -> None:
    stored: dict[str, Any] = {"type": "BlockStored", "block_hashes": [5], "parent_block_hash": None}
    stored |= {"token_ids": [1] * BLOCK}
    stored |= {"block_size": BLOCK, "lora_id": None, "medium": "GPU"}
    removed = {"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU"}
    path = written(tmp_path, [(1.0, [stored, stored], 0), (2.0, [removed, removed], 0)])
    assert check_stream(read_stream(path), copies=True) == (4, None)
    _, finding = check_stream(read_stream(path))
    assert finding is not None and finding.rule == "PFX-322" and (finding.event.line, finding.event.position) == (1, 1)
    path = written(tmp_path, [(1.0, [stored, stored], 0), (2.0, [removed, removed, removed], 0)])
    _, finding = check_stream(read_stream(path), copies=True)
    assert finding is not None and finding.rule == "PFX-324" and finding.event.position == 2
    assert [(e.line, e.position) for e in finding.window] == [(2, 1)], finding.describe()


@rule("PFX-322")
def test_each_rank_group_and_medium_is_its_own_cache_and_a_clear_empties_its_rank_only() -> None:
    checker = StreamChecker()
    from kvref.simulation.event_streams import StreamEvent

    gpu, cpu, other = Scope(0, 0, "GPU"), Scope(0, 0, "CPU"), Scope(1, 0, "GPU")
    for scope in (gpu, cpu, other):
        assert checker.feed(StreamEvent(1, "stored", (9,), None, scope=scope, tokens=4, block_size=4)) is None
    assert checker.feed(StreamEvent(2, "removed", (9,), scope=gpu)) is None
    assert checker.resident(cpu) == {9} and checker.resident(gpu) == frozenset()
    assert checker.feed(StreamEvent(3, "cleared", scope=Scope(0))) is None
    assert checker.resident(cpu) == frozenset() and checker.resident(other) == {9}
    finding = checker.feed(StreamEvent(4, "removed", (9,), scope=cpu))
    assert finding is not None and [e.line for e in finding.window] == [3], "the window is the clear since"


@rule("PFX-323")
@pytest.mark.parametrize(
    ("value", "says"),
    [
        ([1.0, [{"type": "Evicted", "block_hashes": [1]}], 0], "it has type 'Evicted'"),
        ([1.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}], 0], "'block_hashes' must be a list of hashes"),
        ([1.0, [{"type": "BlockRemoved", "block_hashes": ["7"]}], 0], "'block_hashes' must be a list of hashes"),
        ([1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": 3, "block_size": 4}], 0], "'token_ids'"),
        ([1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [], "block_size": "4"}], 0], "'block_size'"),
        ([1.0, [{"type": "BlockRemoved", "block_hashes": [1], "group_idx": "0"}], 0], "'group_idx'"),
        (["x", [], 0], "ts must be a number"),
        ([1.0, [], "0"], "rank must be an int"),
        ({"ts": 1.0}, "a batch is [ts, events, rank]"),
        ([1.0, [7], 0], "neither a tagged map nor a tagged array"),
    ],
)
def test_a_message_that_is_no_batch_stops_the_read_naming_the_file_and_message(
    tmp_path: Path, value: Any, says: str
) -> None:
    path = tmp_path / "stream.msgpack"
    path.write_bytes(msgpack.packb([0.5, [], 0]) + msgpack.packb(value))
    with pytest.raises(TraceError, match=r"\[PFX-323\]") as raised:
        list(read_stream(path))
    assert f"{path}: message 2" in str(raised.value) and says in str(raised.value)


@rule("PFX-323")
def test_a_torn_file_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = written(tmp_path, BATCHES)
    path.write_bytes(path.read_bytes()[:-3])
    assert main(["events", "check", str(path)]) != 0
    err = capsys.readouterr().err
    assert "[PFX-323]" in err and "Traceback" not in err


@rule("PFX-323", "CONF-912")
def test_events_check_refuses_a_directory_before_reading(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["events", "check", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


@rule("PFX-323", "PFX-326")
def test_events_check_names_a_gap_in_a_recorded_engine_stream_with_the_message_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = written(tmp_path, BATCHES)
    assert main(["events", "check", str(path)]) == 0
    capsys.readouterr()
    gapped = recorded(tmp_path / "gapped.msgpack", [*range(3), *range(4, len(BATCHES))], BATCHES[:3] + BATCHES[4:])
    assert main(["events", "check", str(gapped), "--json"]) == 1
    found = json.loads(capsys.readouterr().out)["finding"]
    assert found["rule"] == "PFX-326" and found["line"] == 4 and "skips" in found["reason"]
    assert len(found["window"]) == 2


def vllm_encoder() -> Any:
    kv_events = pytest.importorskip("vllm.distributed.kv_events", reason="vLLM is not installed here")
    return kv_events


@rule("PFX-323")
def test_what_vllms_own_encoder_writes_kvref_reads_field_for_field(tmp_path: Path) -> None:
    kv = vllm_encoder()
    import msgspec

    ours = list(read_engine_stream(written(tmp_path, BATCHES, sequenced=False)))
    path = tmp_path / "vllm.msgpack"
    encoder = msgspec.msgpack.Encoder()
    with path.open("wb") as out:
        for ts, events, rank in BATCHES:
            made = []
            for e in events:
                if e["type"] == "BlockStored":
                    made.append(
                        kv.BlockStored(
                            block_hashes=e["block_hashes"],
                            parent_block_hash=e["parent_block_hash"],
                            token_ids=e["token_ids"],
                            block_size=e["block_size"],
                            lora_id=None,
                            medium="GPU",
                            lora_name=None,
                        )
                    )
                elif e["type"] == "BlockRemoved":
                    made.append(kv.BlockRemoved(block_hashes=e["block_hashes"], medium="GPU"))
                else:
                    made.append(kv.AllBlocksCleared())
            out.write(encoder.encode(kv.KVEventBatch(ts=ts, events=made, data_parallel_rank=rank)))
    theirs = list(read_engine_stream(path))
    assert [(e.kind, e.hashes, e.parent, e.tokens, e.block_size, e.scope) for e in theirs] == [
        (e.kind, e.hashes, e.parent, e.tokens, e.block_size, e.scope) for e in ours
    ]


@rule("PFX-322", "PFX-324", "PFX-325", "PFX-326", "TRACE-1050")
def test_the_stream_vllms_own_scheduler_publishes_checks_clean_on_full_attention(tmp_path: Path) -> None:
    """vLLM's scheduler replaying a workload that preempts, its KV event batches recorded as its
    publisher sends them: under full attention every hash it stores is new and every removal its last."""
    pytest.importorskip("vllm", reason="vLLM is not installed here")
    from kvref.simulation.serving import StepModel, serving_workload
    from kvref.simulation.serving.vllm_scheduler import VllmSchedulerReplay

    path, snapshot = tmp_path / "vllm.msgpack", tmp_path / "vllm-snapshot.jsonl"
    workload = serving_workload("chat", seed=0, block_size=16)
    VllmSchedulerReplay(workload, 60, StepModel(), events=path, snapshot=snapshot).run()
    messages = sum(1 for e in read_stream(path) if e.kind == "message")
    assert messages > 100, f"vLLM published {messages} batches"
    for copies in (False, True):
        count, finding = check_stream(read_stream(path), copies=copies, snapshots=read_snapshots(snapshot))
        assert finding is None, finding.describe()
        assert count > 1000


@rule("PFX-327", "TRACE-1050")
def test_vllms_stream_rebuilds_what_its_own_block_pool_holds_at_the_end_and_a_lost_store_shows(
    tmp_path: Path,
) -> None:
    """The snapshot is vLLM's own block pool, read at the end of the replay, one per KV cache group:
    its stream rebuilds exactly that; with one store of a resident hash taken out, it does not."""
    pytest.importorskip("vllm", reason="vLLM is not installed here")
    from kvref.contract.manager import FULL_ATTENTION, CacheGroup
    from kvref.simulation.serving import StepModel, serving_workload
    from kvref.simulation.serving.vllm_scheduler import VllmSchedulerReplay

    path, snapshot = tmp_path / "vllm.msgpack", tmp_path / "vllm-snapshot.jsonl"
    groups = (FULL_ATTENTION, CacheGroup.window(64))
    VllmSchedulerReplay(
        serving_workload("chat", seed=0, block_size=16), 60, StepModel(), groups=groups, events=path, snapshot=snapshot
    ).run()
    snapshots = read_snapshots(snapshot)
    assert [s.scope.group for s in snapshots] == [0, 1] and all(s.copies for s in snapshots)
    stream = list(read_stream(path))
    assert check_stream(stream, copies=True, snapshots=snapshots)[1] is None
    resident = next(iter(snapshots[0].copies))
    last_store = max(
        i for i, e in enumerate(stream) if e.kind == "stored" and e.scope.group == 0 and resident in e.hashes
    )
    kept = tuple(h for h in stream[last_store].hashes if h != resident)
    stream[last_store] = msgspec.structs.replace(stream[last_store], hashes=kept, tokens=None)
    _, finding = check_stream(stream, copies=True, snapshots=snapshots)
    assert finding is not None and finding.rule in ("PFX-324", "PFX-327"), finding


SAMPLES = Path(__file__).parent / "data" / "engine-events"


@rule("PFX-322", "PFX-324")
@pytest.mark.parametrize(
    ("sample", "as_a_set", "counting_copies"),
    [
        ("vllm-chat-full", None, None),
        ("vllm-chat-window", "PFX-322", None),
        ("vllm-chat-mamba", "PFX-322", None),
        ("sglang-unified-chat", None, None),
    ],
)
def test_the_recorded_vllm_samples_give_the_findings_recorded_for_them(
    sample: str, as_a_set: str | None, counting_copies: str | None
) -> None:
    """The first messages of streams vLLM 0.32's scheduler and SGLang 0.5.23's UnifiedRadixCache
    published (``scripts/engine_event_streams.py``): under full attention and from SGLang clean; with
    a sliding-window or mamba group, a second copy of a resident hash stored (a set-keeping router
    sees a store of what it holds)."""
    path = SAMPLES / f"{sample}.msgpack"
    for copies, expected in ((False, as_a_set), (True, counting_copies)):
        _, finding = check_stream(read_stream(path), copies=copies)
        assert (finding.rule if finding else None) == expected, finding.describe() if finding else sample


@rule("PFX-323", "TRACE-1051")
@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--events", "x.msgpack"], "--events goes with --engine vllm"),
        (["--engine", "vllm", "--no-prefix-caching", "--events", "x.msgpack"], "no KV events with prefix caching off"),
    ],
)
def test_serve_replay_refuses_to_record_events_it_cannot_record(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve-replay", "--capacity", "60", *argv]) == 2
    assert says in capsys.readouterr().err


@rule("PFX-322", "PFX-324", "PFX-325", "PFX-326", "TRACE-1021")
@pytest.mark.parametrize("backend", ["sglang-unified", "sglang"])
def test_the_stream_sglangs_radix_caches_record_checks_clean(tmp_path: Path, backend: str) -> None:
    """SGLang's radix caches replaying a workload with ``enable_kv_cache_events``, their events sent
    after each request as SGLang's own ``EventBatch``: a tree keeps one copy of a page, so a set and
    a count of copies read the stream alike, and both find nothing."""
    pytest.importorskip("sglang", reason="SGLang is not installed here")
    from kvref.config.registry import load_backend

    if "radix-cache" not in load_backend(backend).capabilities():  # loads SGLang's radix cache first
        pytest.skip(f"SGLang's radix cache does not import here ({backend})")
    import msgspec
    from sglang.srt.disaggregation import kv_events

    from kvref.simulation.radix_replay import radix_replay
    from kvref.simulation.workloads import workload_trace

    path = tmp_path / "sglang.msgpack"
    encode = msgspec.msgpack.Encoder().encode
    with path.open("wb") as out:
        sent = 0

        def publish(tree: Any) -> None:
            nonlocal sent
            events = tree.cache.take_events()
            if events:
                out.write(encode([sent, encode(kv_events.EventBatch(ts=float(sent), events=events))]))
                sent += 1

        radix_replay(workload_trace("chat", seed=2), 200, backend=backend, after_request=publish)
    assert sent > 100, f"SGLang's {backend} recorded events after {sent} requests"
    for copies in (False, True):
        count, finding = check_stream(read_stream(path), copies=copies)
        assert finding is None, finding.describe()
        assert count > 200
