"""The kvref command: backends, demo and spec, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

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


@rule("EVICT-405", "PFX-318")
def test_the_demo_reports_hits_for_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--json", "--capacity", "128"]) == 0
    results = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(results) == {"lru", "lru-leaf", "ref-zero", "fifo"}
    assert results["lru"]["hits"] > 0, "shared system prompts must produce hits under lru"
    assert results["ref-zero"]["hits"] == 0, "requests run one after another share nothing under ref-zero"
    assert all(r["blocks"] == results["lru"]["blocks"] for r in results.values())


@rule("CONF-904")
def test_a_bad_setting_exits_with_the_rule_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--hash", "md5"]) == 2
    assert "[CONF-904]" in capsys.readouterr().err
