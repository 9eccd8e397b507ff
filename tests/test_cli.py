"""The kvref command: backends, replay and errors, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvref.cli import main

rule = pytest.mark.rule


@rule("CONF-906")
def test_kvref_backends_lists_the_oracle_as_usable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["oracle"]["usable"] is True and rows["oracle"]["device"] == "host"
    assert "prefix-cache" in rows["oracle"]["capabilities"]


@rule("CONF-906")
def test_the_console_script_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "kvref.cli", "backends"], capture_output=True, text=True, check=True)
    assert "oracle" in out.stdout and "yes" in out.stdout


@rule("CONF-906")
def test_the_backends_table_piped_to_a_file_wraps_its_capabilities_and_names_every_one() -> None:
    from kvref.cli.commands import CAPABILITIES_WIDTH
    from kvref.config.registry import backend_statuses

    out = subprocess.run([sys.executable, "-m", "kvref.cli", "backends"], capture_output=True, text=True, check=True)
    widest = max(len(line) for line in out.stdout.splitlines())
    assert widest <= CAPABILITIES_WIDTH + 80, f"a line of {widest} characters: the capability list was not wrapped"
    words = set(out.stdout.replace(",", " ").replace("│", " ").split())
    [oracle] = [status for status in backend_statuses() if status.name == "oracle"]
    missing = set(oracle.capabilities) - words
    assert not missing, f"capabilities cut from the table: {sorted(missing)}"


@rule("EVICT-405", "TRACE-1011")
def test_replay_of_the_built_in_workload_reports_hits_for_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--json", "--capacity", "128"]) == 0
    results = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(results) == {"lru", "lru-leaf", "ref-zero", "fifo", "lru-leaf-access"}
    assert results["lru"]["block_hits"] > 0, "shared system prompts must produce hits under lru"
    assert results["ref-zero"]["block_hits"] == 0, "requests run one after another share nothing under ref-zero"
    assert all(r["blocks"] == results["lru"]["blocks"] for r in results.values())
    assert all(r["block_hit_rate"] <= r["infinite_block_hit_rate"] for r in results.values())


@rule("CONF-912")
def test_replay_of_a_missing_trace_exits_with_the_reason(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    assert main(["replay", "/nonexistent/trace.jsonl"]) == 2
    assert "[CONF-912] /nonexistent/trace.jsonl does not exist" in capsys.readouterr().err


@rule("CONF-904")
def test_a_bad_setting_exits_with_the_rule_and_status_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVREF_HASH", "md5")  # a setting from the environment (CONF-903)
    assert main(["replay"]) == 2
    assert "[CONF-904]" in capsys.readouterr().err


@rule("TRACE-1017")
def test_a_sweep_adds_belady_at_every_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--json", "--sweep", "--capacity", "64", "--policy", "lru"]) == 0
    rows = json.loads(capsys.readouterr().out)
    capacities = sorted({r["capacity"] for r in rows})
    assert capacities == [8, 16, 32, 64, 128]
    for capacity in capacities:
        policies = {r["policy"] for r in rows if r["capacity"] == capacity}
        assert policies == {"lru", "belady"}, f"capacity {capacity}: {policies}"


@rule("TRACE-1017")
def test_a_sweep_writes_json_markdown_and_a_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert main(["replay", "--sweep", "--capacity", "64", "--policy", "lru", "--out", str(out)]) == 0
    assert json.loads((out / "replay.json").read_text())[0]["policy"] == "lru"
    summary = (out / "replay.md").read_text()
    assert "| capacity | lru | belady |" in summary and "hit-rate.png" in summary
    assert (out / "hit-rate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@rule("TRACE-1018", "CONF-906")
def test_replay_with_backends_runs_every_usable_backend_and_they_count_the_same(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kvref.config.registry import backend_statuses

    assert main(["replay", "--json", "--capacity", "64", "--policy", "lru-leaf", "--backends"]) == 0
    runs = json.loads(capsys.readouterr().out)[1:]
    usable = sorted(s.name for s in backend_statuses() if s.usable)
    ran = sorted({r["backend"].split()[0] for r in runs})
    assert ran == usable, f"--backends ran {ran}, usable: {usable}"
    counts = {(r["block_hits"], r["token_hits"], r["evictions"], r["peak_occupancy"]) for r in runs}
    assert len(counts) == 1, f"backends counted differently (TRACE-1018): {counts}"
    assert runs[0]["backend"].startswith("oracle"), "the oracle is the reference the others are compared with"
    oracle_modes = [r["mode"] for r in runs if r["backend"].startswith("oracle")]
    assert oracle_modes == ["fused", "stepwise"], (
        f"the oracle replays in one call and step by step (TRACE-1019); --backends ran it as {oracle_modes}"
    )


def test_replay_tables_piped_to_a_file_cut_no_number() -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run(
        [sys.executable, "-m", "kvref", "replay", "--capacity", "256", "--sweep", "--backends"],  # README command 1
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    assert "…" not in out, f"a piped replay table cut a value with an ellipsis:\n{out}"
    rows = [line for line in out.splitlines() if "│" in line and "lru" in line]
    assert rows and all(line.rstrip().endswith("│") for line in rows), f"table rows were cut:\n{out}"


@pytest.mark.rule("TRACE-1030")
@pytest.mark.parametrize("capacity", ["-5", "0"])
def test_a_bad_capacity_is_refused_in_the_users_own_numbers(capacity: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--capacity", capacity]) == 2
    said = capsys.readouterr().err
    assert f"got {capacity}" in said and "TRACE-1030" in said, f"replay --capacity {capacity} said {said!r}"


def test_plain_tables_keep_every_number_whole_at_any_width(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.table import Table

    from kvref.cli.console import plain_columns, use_plain_tables

    table = Table(title="t")
    for name in ("blocks", "policy", "token hits"):
        table.add_column(name, justify="left" if name == "policy" else "right", overflow="fold")
    table.add_row("1,234,567", "lru-leaf", "12.34%")
    table.add_row("8", "fifo", "100.00%")
    text = plain_columns(table)
    assert text.splitlines() == [
        "t",
        "   blocks  policy    token hits",
        "1,234,567  lru-leaf      12.34%",
        "        8  fifo         100.00%",
    ]
    try:
        assert main(["replay", "--capacity", "64", "--policy", "lru", "--format", "plain"]) == 0
    finally:
        use_plain_tables(False)
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["blocks", "policy", "block", "hits", "token", "hits", "no-evict", "evictions", "blocks/s"]
    assert out[2].split()[:5] == ["64", "lru", "11.93%", "12.17%", "73.33%"], out[2]


@rule("CONF-912")
def test_spec_show_prints_a_rule_by_id_from_the_checkout_or_the_installed_copy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from kvref.cli import commands

    spec = Path(__file__).resolve().parents[1] / "spec"
    assert main(["spec", "show", "POOL-105", "--spec", str(spec)]) == 0
    assert capsys.readouterr().out.startswith("POOL-105 (01-pool, MUST): `allocate(n)` MUST be all-or-nothing")
    assert main(["spec", "show", "POOL-999", "--spec", str(spec)]) == 2
    assert "did you mean" in capsys.readouterr().err
    installed = tmp_path / "share" / "kvref" / "spec"
    installed.mkdir(parents=True)
    shutil.copy(spec / "rules.json", installed / "rules.json")
    monkeypatch.setattr(commands, "installed_spec", lambda: installed)
    assert main(["spec", "show", "radix-624", "--spec", str(tmp_path / "no-checkout")]) == 0
    assert capsys.readouterr().out.startswith("RADIX-624 (06-radix, MUST)")


@pytest.mark.rule("CONF-912")
def test_spec_show_works_outside_the_checkout_from_the_spec_kvref_was_installed_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run from another directory, ``kvref spec show`` finds the spec of the installed kvref (here the
    checkout an editable install points at; in a wheel, share/kvref/spec)."""
    monkeypatch.chdir(tmp_path)
    assert main(["spec", "show", "POOL-105"]) == 0
    assert capsys.readouterr().out.startswith("POOL-105 (01-pool, MUST)")
