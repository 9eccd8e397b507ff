"""Chapter 10, trace files: the Mooncake format and token-level lines, every line checked."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvref.simulation.traces import TraceError, load_trace, token_block_ids

rule = pytest.mark.rule
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
MOONCAKE = ["mooncake_conversation_trace.jsonl", "mooncake_synthetic_trace.jsonl"]


def write(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


@rule("TRACE-1002", "TRACE-1003")
@pytest.mark.parametrize("name", MOONCAKE)
def test_the_real_mooncake_traces_load_and_keep_their_stated_facts(name: str) -> None:
    path = TRACES / name
    if not path.is_file():
        pytest.skip(f"{path} is not here (the shared traces live beside the repository)")
    trace = load_trace(path)
    counts = {"mooncake_conversation_trace.jsonl": 12_031, "mooncake_synthetic_trace.jsonl": 3_993}
    assert len(trace.requests) == counts[name]
    positions: dict[int, int] = {}
    for r in trace.requests:
        assert len(r.block_ids) == math.ceil(r.input_length / 512)
        for i, h in enumerate(r.block_ids):
            assert positions.setdefault(h, i) == i, f"id {h} at positions {positions[h]} and {i}"
    assert all(a.timestamp <= b.timestamp for a, b in zip(trace.requests, trace.requests[1:], strict=False))
    if name == "mooncake_conversation_trace.jsonl":
        assert trace.block_references == 288_500


@rule("TRACE-1001")
@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ({"timestamp": -1, "input_length": 3, "output_length": 1, "hash_ids": [1]}, "'timestamp'"),
        ({"timestamp": 0, "input_length": 3, "output_length": 1}, "exactly one of"),
        ({"timestamp": 0, "input_length": 3, "output_length": 1.5, "hash_ids": [1]}, "'output_length'"),
        ({"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}, "'input_length'"),
        ("", "empty line"),
    ],
)
def test_a_malformed_line_stops_loading_with_file_line_and_reason(tmp_path: Path, line: object, reason: str) -> None:
    good = {"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [7]}
    path = write(tmp_path, good, line, good)
    with pytest.raises(TraceError) as info:
        load_trace(path, block_size=4)
    assert f"{path}:2" in str(info.value) and reason in str(info.value), str(info.value)


@rule("TRACE-1002")
@pytest.mark.parametrize("ids", [[1], [1, 2, 3], [1, -2], [1, 2**63], [1, "2"]])
def test_hash_ids_must_match_the_block_count_and_range(tmp_path: Path, ids: list[object]) -> None:
    path = write(tmp_path, {"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ids})
    with pytest.raises(TraceError, match="TRACE-1002"):
        load_trace(path, block_size=4)


@rule("TRACE-1003")
def test_timestamps_must_not_go_back(tmp_path: Path) -> None:
    line = {"input_length": 1, "output_length": 1, "hash_ids": [1]}
    path = write(tmp_path, {**line, "timestamp": 5}, {**line, "timestamp": 4})
    with pytest.raises(TraceError, match=r"TRACE-1003.*:2"):
        load_trace(path, block_size=4)


@rule("TRACE-1004")
def test_token_lines_get_chained_block_ids_with_the_partial_block_hashed(tmp_path: Path) -> None:
    path = write(tmp_path, {"timestamp": 0, "output_length": 2, "token_ids": [1, 2, 3, 4, 5, 6]})
    [request] = load_trace(path, block_size=4).requests
    assert request.input_length == 6 and len(request.block_ids) == 2
    assert request.block_ids == token_block_ids([1, 2, 3, 4, 5, 6], 4)
    other = token_block_ids([1, 2, 3, 4, 9, 9], 4)
    assert other[0] == request.block_ids[0] and other[1] != request.block_ids[1]
    bad = write(tmp_path, {"timestamp": 0, "output_length": 2, "input_length": 5, "token_ids": [1, 2]})
    with pytest.raises(TraceError, match="TRACE-1004"):
        load_trace(bad, block_size=4)


@rule("TRACE-1006")
@pytest.mark.parametrize(
    "second",
    [[3, 2], [5, 5], [2, 1]],
    ids=["an id after another parent", "an id twice in a request", "ids in another order"],
)
def test_block_ids_must_form_a_prefix_tree(tmp_path: Path, second: list[int]) -> None:
    line = {"timestamp": 0, "input_length": 8, "output_length": 1}
    path = write(tmp_path, {**line, "hash_ids": [1, 2]}, {**line, "hash_ids": second})
    with pytest.raises(TraceError, match=r"TRACE-1006.*:2"):
        load_trace(path, block_size=4)
