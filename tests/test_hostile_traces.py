"""Chapter 10, hostile inputs: whatever bytes a trace file holds, a loader answers with TraceError naming
the file and the line (TRACE-1001), never a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvref.simulation.serving.azure import load_azure_trace
from kvref.simulation.traces import TraceError, load_trace

rule = pytest.mark.rule

GOOD_JSONL = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}'
GOOD_CSV = "2023-11-16 18:17:03.9799600,4808,10"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)

FIELDS = ("timestamp", "input_length", "output_length", "hash_ids", "token_ids")


@st.composite
def jsonl_lines(draw: st.DrawFn) -> str:
    """A line that is almost a trace line, or not at all."""
    kind = draw(st.sampled_from(["fields", "text", "deep", "truncated"]))
    if kind == "fields":
        obj: dict[str, object] = {
            "timestamp": 0,
            "input_length": 600,
            "output_length": 5,
            "hash_ids": [0, 1],
        }
        for name in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
            if draw(st.booleans()):
                obj.pop(name, None)
            else:
                obj[name] = draw(json_values)
        return json.dumps(obj)
    if kind == "deep":
        depth = draw(st.integers(1, 200_000))
        return "[" * depth + "]" * draw(st.integers(0, depth))
    if kind == "truncated":
        return GOOD_JSONL[: draw(st.integers(0, len(GOOD_JSONL) - 1))]
    return draw(st.text(max_size=40).filter(lambda t: "\n" not in t and "\r" not in t))


@st.composite
def csv_lines(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["cells", "text", "truncated", "quotes"]))
    if kind == "cells":
        cells = GOOD_CSV.split(",")
        i = draw(st.integers(0, 2))
        cells[i] = draw(
            st.sampled_from(["", "-1", "1e9", "9" * 40, "NaN", "٣", "12 ", "0x10", "1_000", "2023-13-45 99:99:99"])
            | st.text(max_size=12).filter(lambda t: not any(c in t for c in ',"\n\r'))
        )
        return ",".join(cells)
    if kind == "truncated":
        return GOOD_CSV[: draw(st.integers(0, len(GOOD_CSV) - 1))]
    if kind == "quotes":
        return '"' + GOOD_CSV
    return draw(st.text(max_size=40).filter(lambda t: "\n" not in t and "\r" not in t))


def refusal(load: object, path: Path) -> TraceError | None:
    """The loader's TraceError, or None when the file loads (any other exception fails the test)."""
    try:
        load(path)  # type: ignore[operator]
    except TraceError as exc:
        return exc
    return None


def check_refusal_or_load(load: object, path: Path, bad_line_number: int) -> None:
    error = refusal(load, path)
    if error is None:
        return
    where = re.search(rf"{re.escape(str(path))}(:(\d+))?", str(error))
    assert where, f"the error must name the file: {error}"
    assert where.group(2) is not None, f"the error must name the line: {error}"
    assert int(where.group(2)) in (1, bad_line_number), f"line {where.group(2)}, the bad one is {bad_line_number}"


@rule("TRACE-1001")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=jsonl_lines(), position=st.integers(0, 2))
def test_a_hostile_json_lines_trace_gets_a_trace_error_with_file_and_line(
    tmp_path: Path, line: str, position: int
) -> None:
    lines = [GOOD_JSONL, GOOD_JSONL]
    lines.insert(position, line)
    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    check_refusal_or_load(load_trace, path, position + 1)


@rule("TRACE-1001", "TRACE-1045")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=csv_lines(), position=st.integers(0, 2))
def test_a_hostile_azure_trace_gets_a_trace_error_with_file_and_line(tmp_path: Path, line: str, position: int) -> None:
    lines = [GOOD_CSV, GOOD_CSV]
    lines.insert(position, line)
    path = tmp_path / "hostile.csv"
    path.write_text("\n".join(["TIMESTAMP,ContextTokens,GeneratedTokens", *lines]) + "\n", encoding="utf-8")
    check_refusal_or_load(load_azure_trace, path, position + 2)


@rule("TRACE-1001")
@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_bytes_that_are_not_utf8_are_named_by_line(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"latin1{suffix}"
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n" if suffix == ".csv" else ""
    good = GOOD_CSV if suffix == ".csv" else GOOD_JSONL
    path.write_bytes((head + good + "\n").encode() + b"caf\xe9\n")
    load = load_azure_trace if suffix == ".csv" else load_trace
    with pytest.raises(TraceError, match="not UTF-8") as caught:
        load(path)
    line = 3 if suffix == ".csv" else 2
    assert f"{path}:{line}" in str(caught.value)
