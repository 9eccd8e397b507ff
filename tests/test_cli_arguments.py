"""Every command's options checked before any work starts, alike in every command (CONF-912).

Each checked option of ``replay``, ``serve-replay``, ``conformance``, ``report`` and ``traces`` gets
bad values, drawn by Hypothesis or hostile by hand: the command must exit with status 2, print one
line naming the option and the rule, raise no traceback, and start no work (the commands' work
functions are replaced by ones that record a call). An option two commands share is refused with
the same words by both; good values are taken as given.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvref.cli import serving as cli_serving

#: The module (the package's ``main`` is the entry function of the same name).
cli_main = importlib.import_module("kvref.cli.main")

rule = pytest.mark.rule

#: Values no whole-number option takes.
NOT_WHOLE = ["", " ", "1.5", "1e3", "nan", "inf", "-inf", "0x10", "ten", "1_0_", "--", "\u0663x", "None", "[]", "2**8"]
#: Digits Python's int reads but a command line does not take: full-width, Arabic-Indic.
NOT_WHOLE += ["\uff11\uff12", "\u0663"]
#: Values no fraction option takes.
NOT_A_NUMBER = ["", "one", "nan", "inf", "-inf", "1/2", "0,5", "None", "--", "\uff10.\uff15", "\u0660\u066b\u0665"]


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The commands' work functions, replaced by ones that record that work started."""
    started: list[str] = []

    def recorder(name: str) -> Callable[[argparse.Namespace], int]:
        def run(args: argparse.Namespace) -> int:
            started.append(name)
            return 0

        return run

    for module, name in (
        (cli_main, "run_replay"),
        (cli_main, "run_conformance"),
        (cli_main, "run_report"),
        (cli_main, "run_backends"),
        (cli_main, "run_spec"),
        (cli_serving, "run_serve_replay"),
        (cli_serving, "run_traces"),
    ):
        monkeypatch.setattr(module, name, recorder(name))
    return started


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str], started: list[str]) -> str:
    """Run ``kvref argv``; it must refuse: exit 2, one line on stderr, nothing on stdout, no work."""
    started.clear()  # Hypothesis's examples share the fixture
    status = cli_main.main(argv)
    out, err = capsys.readouterr()
    assert status == 2, f"kvref {argv} exited {status}, not 2: {err!r}"
    assert not started, f"kvref {argv} started work ({started}) before refusing"
    assert out == "", f"kvref {argv} printed {out!r} to stdout while refusing"
    lines = err.splitlines()
    assert len(lines) == 1, f"kvref {argv} refused in {len(lines)} lines, not one: {err!r}"
    return lines[0]


def accepted(argv: list[str], capsys: pytest.CaptureFixture[str], started: list[str]) -> None:
    """Run ``kvref argv``; its work must start."""
    cli_main.main(argv)
    capsys.readouterr()
    assert started, f"kvref {argv} was refused: {started}"
    started.clear()


#: (command, option, a strategy of bad values, the rule named).
WHOLE_NUMBERS = [
    ("replay", "--block-size", "TRACE-1002"),
    ("replay", "--capacity", "TRACE-1030"),
    ("replay", "--azure-prefixes", "TRACE-1045"),
    ("serve-replay", "--block-size", "TRACE-1002"),
    ("serve-replay", "--capacity", "TRACE-1030"),
    ("serve-replay", "--azure-prefixes", "TRACE-1045"),
    ("serve-replay", "--budget", "TRACE-1032"),
    ("serve-replay", "--max-seqs", "TRACE-1032"),
    ("serve-replay", "--max-model-len", "TRACE-1032"),
    ("serve-replay", "--workers", "CONF-912"),
]
FRACTIONS = [
    ("replay", "--warmup", "TRACE-1013", [-0.1, 1.0, 2.0, -1e300]),
    ("serve-replay", "--warmup", "TRACE-1013", [-0.1, 1.0, 2.0, -1e300]),
    ("replay", "--azure-shared", "TRACE-1045", [-0.01, 1.01, 7.0]),
    ("serve-replay", "--azure-shared", "TRACE-1045", [-0.01, 1.01, 7.0]),
    ("serve-replay", "--target-hit-rate", "TRACE-1042", [0.0, -0.5, 1.0001, 3.0]),
    ("serve-replay", "--target-ttft-p90", "TRACE-1042", [0.0, -1.0, -1e9]),
    ("serve-replay", "--step-ms", "TRACE-1033", [-0.001, -5.0]),
    ("serve-replay", "--prefill-ms-per-token", "TRACE-1033", [-1.0]),
    ("serve-replay", "--decode-ms-per-token", "TRACE-1033", [-1.0]),
]


@rule("CONF-912", "TRACE-1002", "TRACE-1030", "TRACE-1032", "TRACE-1045")
@pytest.mark.parametrize(("command", "option", "rule_id"), WHOLE_NUMBERS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=st.one_of(st.integers(-(10**30), 0).map(str), st.sampled_from(NOT_WHOLE)))
def test_a_whole_number_option_refuses_what_is_not_a_whole_number_at_least_1_before_any_work(
    command: str, option: str, rule_id: str, bad: str, work: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    line = refusal([command, f"{option}={bad}"], capsys, work)
    named = "CONF-912" if bad == "--" else rule_id  # '--' ends the options: no value at all
    assert f"argument {option}: [{named}]" in line, f"kvref {command} {option}={bad!r}: {line!r}"


@rule("CONF-912", "TRACE-1013", "TRACE-1030")
@pytest.mark.parametrize(
    ("option", "bad", "rule_id"),
    [
        ("--capacity", "\uff11\uff12", "TRACE-1030"),
        ("--capacity", "\u0663", "TRACE-1030"),
        ("--warmup", "\uff10.\uff15", "TRACE-1013"),
        ("--warmup", "\u0660\u066b\u0665", "TRACE-1013"),
    ],
)
def test_digits_python_reads_but_a_command_line_does_not_type_are_refused(
    option: str, bad: str, rule_id: str, work: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    line = refusal(["replay", f"{option}={bad}"], capsys, work)
    assert f"argument {option}: [{rule_id}]" in line, line


@rule("CONF-912", "TRACE-1013", "TRACE-1033", "TRACE-1042", "TRACE-1045")
@pytest.mark.parametrize(("command", "option", "rule_id", "outside"), FRACTIONS)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_number_option_refuses_what_is_no_number_or_outside_its_range_before_any_work(
    command: str,
    option: str,
    rule_id: str,
    outside: list[float],
    data: st.DataObject,
    work: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = data.draw(st.one_of(st.sampled_from(NOT_A_NUMBER), st.sampled_from(outside).map(repr)), label="bad")
    line = refusal([command, f"{option}={bad}"], capsys, work)
    named = "CONF-912" if bad == "--" else rule_id  # '--' ends the options: no value at all
    assert f"argument {option}: [{named}]" in line, f"kvref {command} {option}={bad!r}: {line!r}"


@rule("CONF-912", "TRACE-1002", "TRACE-1013", "TRACE-1030", "TRACE-1045")
@pytest.mark.parametrize(
    ("option", "bad"),
    [
        ("--block-size", "-16"),
        ("--block-size", "0"),
        ("--capacity", "0"),
        ("--warmup", "1"),
        ("--azure-shared", "2"),
        ("--azure-prefixes", "0"),
    ],
)
def test_an_option_replay_and_serve_replay_share_is_refused_by_both_in_the_same_words(
    option: str, bad: str, work: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    said = [refusal([command, option, bad], capsys, work) for command in ("replay", "serve-replay")]
    reasons = [line.split(": error: ", 1)[1].split(" (`kvref", 1)[0] for line in said]
    assert reasons[0] == reasons[1], f"{option} {bad}: replay says {said[0]!r}, serve-replay {said[1]!r}"


@rule("CONF-912", "EVICT-407")
@pytest.mark.parametrize("bad", ["lur", "LRU", "radix-", "radix-lru-leaf", "belady", ""])
def test_an_unknown_policy_is_refused_naming_the_policies_the_tables_print(
    bad: str, work: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    line = refusal(["replay", "--policy", bad], capsys, work)
    assert "[EVICT-407]" in line and "lru-leaf" in line and "radix-lfu" in line, line


@rule("CONF-912", "EVICT-407")
@pytest.mark.parametrize("name", ["lru", "lru-leaf", "ref-zero", "fifo", "lru-leaf-access", "radix-lfu", "lfu"])
def test_replay_takes_every_policy_name_its_tables_print(
    name: str, work: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    accepted(["replay", "--policy", name], capsys, work)


@rule("CONF-912", "TRACE-1042")
@pytest.mark.parametrize("bad", ["5", "5:", ":5", "a:b", "0:5", "6:5", "1:2:3", "-1:4"])
def test_a_search_range_must_be_low_colon_high_with_1_at_most_low_at_most_high(
    bad: str, work: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    line = refusal(["serve-replay", "--target-hit-rate", "0.3", f"--range={bad}"], capsys, work)
    assert "argument --range: [TRACE-1042]" in line, line


def paths(tmp_path: Path) -> dict[str, Path]:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    return {"missing": tmp_path / "missing" / "trace.jsonl", "file": a_file, "directory": tmp_path}


@rule("CONF-912")
@pytest.mark.parametrize(
    ("argv", "which"),
    [
        (["replay", "{missing}"], "missing"),
        (["replay", "{directory}"], "directory"),
        (["serve-replay", "{missing}"], "missing"),
        (["replay", "--out", "{file}"], "file"),
        (["serve-replay", "--out", "{file}/sub"], "file"),
        (["serve-replay", "--results", "{directory}"], "directory"),
        (["conformance", "--results", "{file}"], "file"),
        (["conformance", "--deviations", "{missing}"], "missing"),
        (["report", "--out", "{directory}"], "directory"),
        (["traces", "list", "--dir", "{file}"], "file"),
    ],
)
def test_a_path_to_read_must_exist_and_one_to_write_must_be_writable_before_any_work(
    argv: list[str], which: str, tmp_path: Path, work: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    given = paths(tmp_path)
    shown = [a.format(**{k: str(v) for k, v in given.items()}) for a in argv]
    line = refusal(shown, capsys, work)
    assert "[CONF-912]" in line and str(given[which]) in line, line


@rule("CONF-912")
def test_paths_to_write_are_checked_but_left_to_the_work_to_create(
    tmp_path: Path, work: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory that does not exist yet is taken when the one above can take a file; nothing is
    made before the work, so a refused command line leaves nothing behind."""
    out = tmp_path / "new" / "replay"
    accepted(["replay", "--out", str(out)], capsys, work)
    refusal(["replay", "--out", str(tmp_path / "other" / "deep"), "--capacity", "0"], capsys, work)
    assert not (tmp_path / "new").exists() and not (tmp_path / "other").exists(), "a path was made at parse time"
    accepted(["serve-replay", "--results", str(tmp_path / "sweeps" / "points.jsonl")], capsys, work)


@rule("CONF-912", "TRACE-1043")
def test_a_results_file_that_holds_something_else_is_refused_before_it_is_written(
    tmp_path: Path, work: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n' * 3)
    binary = tmp_path / "noise.jsonl"
    binary.write_bytes(bytes(range(256)) * 4)
    for path in (trace, binary):
        line = refusal(["serve-replay", "--results", str(path)], capsys, work)
        assert "argument --results: [CONF-912]" in line and str(path) in line, line
    assert trace.read_text().count("\n") == 3, "the trace named as --results was written to"


@rule("CONF-912", "CONF-902", "HASH-209", "TRACE-1041", "TRACE-1002", "TRACE-1005")
@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["serve-replay", "--backend", "junk"], "argument --backend: [CONF-902]"),
        (["replay", "--backend", "no_such_module:Nothing"], "argument --backend: [CONF-902]"),
        (["serve-replay", "--hash", "md5"], "argument --hash: [HASH-209]"),
        (["replay", "--hash", "md5"], "argument --hash: [HASH-209]"),
        (["serve-replay", "--scheduler", "junk"], "argument --scheduler: [TRACE-1041]"),
        (["replay", "--block-size", "100000"], "argument --block-size: [TRACE-1002]"),
        (["serve-replay", "--block-size", "10000000000000000000000"], "argument --block-size: [TRACE-1002]"),
        (["replay", "--seed", "1.5"], "argument --seed: [TRACE-1005]"),
        (["serve-replay", "--seed", "-1"], "argument --seed: [TRACE-1005]"),
        (["replay", ""], "argument trace: [CONF-912]"),
        (["replay", "--out", ""], "argument --out: [CONF-912]"),
        (["replay", "--out", "/proc"], "argument --out: [CONF-912]"),
        (["serve-replay", "--results", "/proc/version"], "argument --results: [CONF-912]"),
        (["report", "/nonexistent/results"], "argument paths: [CONF-912]"),
        (["conformance", "--deviations", "/"], "argument --deviations: [CONF-912]"),
    ],
)
def test_each_option_a_careless_command_line_gets_wrong_is_refused_at_parse_time(
    argv: list[str], named: str, work: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    line = refusal(argv, capsys, work)
    assert named in line, f"kvref {argv}: {line!r}"


@rule("CONF-912")
@pytest.mark.parametrize(
    "argv",
    [
        ["serve-replay", "--range", "5:10"],
        ["spec", "lint", "POOL-1"],
        ["traces", "list", "extra"],
        ["replay", "--policy", "lfu"],
    ],
)
def test_arguments_that_only_make_sense_together_are_refused_in_one_line_before_the_work(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("[CONF-912]" in err[0] or "[EVICT-407]" in err[0]), err


@rule("CONF-912", "TRACE-1002")
def test_the_block_size_that_once_printed_a_full_hit_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``kvref replay --block-size -16`` replayed the built-in workload with negative blocks and
    printed a 100% token hit rate with exit 0; now nothing runs."""
    assert cli_main.main(["replay", "--block-size", "-16", "--out", str(tmp_path / "never")]) == 2
    assert "100.00%" not in capsys.readouterr().out


@rule("CONF-912", "TRACE-1045")
def test_replay_takes_an_azure_trace_as_serve_replay_does(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The same trace forms in both commands: an Azure CSV gets its seeded synthetic prefixes."""
    trace = tmp_path / "azure.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:51.4619160,879,197\n"
    )
    assert cli_main.main(["replay", str(trace), "--capacity", "64", "--policy", "lru", "--json"]) == 0
    out: Any = capsys.readouterr().out
    assert '"policy": "lru"' in out and '"capacity": 64' in out, out


@rule("CONF-912", "TRACE-1016")
def test_a_capacity_no_trace_could_fill_is_replayed_at_the_trace_size_with_a_note(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--capacity 10**12`` once built a pool of 10**12 blocks (MemoryError); a cache holding every
    block the trace names never evicts, so the replay runs at that size, and says so."""
    import json

    assert cli_main.main(["replay", "--capacity", str(10**12), "--policy", "lru", "--json"]) == 0
    out, err = capsys.readouterr()
    [row] = json.loads(out)
    assert row["capacity"] < 10**12 and row["evictions"] == 0, row
    assert f"capacity {10**12:,} is more than the trace's {row['capacity']:,} distinct blocks" in err, err
    assert row["token_hit_rate"] == row["infinite_token_hit_rate"], "a cache that never evicts hits as an infinite one"
