"""Speed of ``kvref events check`` (pytest-benchmark; ``nox -s bench``): PFX-322, PFX-323, PFX-327.

Streams in kvref's JSON Lines form, written by replaying through the oracle with events on, checked
with the cache's snapshot at the end, from the file as the command reads it:

* the built-in chat workload at 64 blocks (every run);
* the Mooncake traces (conversation and synthetic, 1,000 blocks) replayed in turn, each replay
  after a clear, until the stream holds 10**7 events (``nox -s bench`` only; about 450 MB in the
  test's temporary directory).

``events_per_round`` is the number of events, so events a second is it over the round's time. Every
round must check clean and count every event, so a benchmark that stopped checking fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvref.config.registry import create_pool
from kvref.simulation.event_streams import check_stream, read_snapshots, write_snapshot, write_stream
from kvref.simulation.replay import replay
from kvref.simulation.stream_files import read_stream
from kvref.simulation.traces import Trace, load_trace
from kvref.simulation.workloads import workload_trace

pytestmark = pytest.mark.benchmark_suite

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
MOONCAKE = [TRACES / "mooncake_conversation_trace.jsonl", TRACES / "mooncake_synthetic_trace.jsonl"]
CLEARED = b'{"event": "cleared"}\n'


def record(trace: Trace, capacity: int, directory: Path, name: str) -> tuple[Path, int, list[int]]:
    """Replay ``trace`` through the oracle with events on; its stream file, event count and resident hashes."""
    pool = create_pool(capacity + 1, backend="oracle", policy="lru", events=True)
    replay(trace, pool)
    path = directory / f"{name}.jsonl"
    return path, write_stream(pool.take_events(), path), sorted(pool.resident_hashes())


def bench_check(benchmark: Any, stream: Path, snapshots: Path, events: int, name: str) -> None:
    benchmark.extra_info.update(events_per_round=events, workload=f"events check[{name}, {events:,} events]")
    verdicts: list[tuple[int, object]] = []

    def run() -> None:
        verdicts.append(check_stream(read_stream(stream), snapshots=read_snapshots(snapshots)))

    benchmark.pedantic(run, rounds=1 if events > 10**6 else 3, iterations=1)
    for verdict in verdicts:
        assert verdict == (events, None), f"[PFX-322] {name}: {verdict}"


def test_check_the_chat_workloads_stream(benchmark: Any, tmp_path: Path) -> None:
    stream, events, resident = record(workload_trace("chat", seed=1), 64, tmp_path, "chat")
    write_snapshot(tmp_path / "snapshot.jsonl", events, resident)
    bench_check(benchmark, stream, tmp_path / "snapshot.jsonl", events, "chat at 64 blocks")


@pytest.mark.skipif(not all(p.exists() for p in MOONCAKE), reason=f"the Mooncake traces are not in {TRACES}")
def test_check_ten_million_events_of_the_mooncake_traces(benchmark: Any, measuring: bool, tmp_path: Path) -> None:
    if not measuring:
        pytest.skip("the 10**7-event stream is measured by `nox -s bench` only")
    replays = [record(load_trace(p), 1_000, tmp_path, p.stem) for p in MOONCAKE]
    stream, events, lines = tmp_path / "mooncake.jsonl", 0, 0
    with stream.open("wb") as out:
        while events < 10**7:
            for path, count, resident in replays:
                out.write(CLEARED)
                out.write(path.read_bytes())
                events, lines = events + count + 1, lines + count + 1
                last = resident
    write_snapshot(tmp_path / "snapshot.jsonl", lines, last)
    bench_check(benchmark, stream, tmp_path / "snapshot.jsonl", events, "the Mooncake traces at 1,000 blocks")
