"""A researcher's mistakes, each met with one line that names its rule and a non-zero exit (CONF-912).

The cases a first reading of the commands turned up: a backend whose own constructor fails, a
results file that is no JSON, a step cost that would overflow the clock, a capacity search asked
to size two caches at once, and a replay where no request could be measured.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvref.cli.main import main

rule = pytest.mark.rule


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, f"expected one line, got:\n{text}"
    return lines[0]


@rule("CONF-902")
@pytest.mark.parametrize("command", ["replay", "serve-replay"])
def test_a_backend_whose_constructor_fails_is_refused_in_its_own_words(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--backend", "tests.dying_backends:CannotStart", "--capacity", "60"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "[CONF-902]" in line and "raised RuntimeError: this backend cannot start: no licence" in line


@rule("CONF-912")
@pytest.mark.parametrize("text", ["", "nan", "{", '{"a": 1'])
def test_report_refuses_a_file_that_is_no_json(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "results.json"
    path.write_text(text, encoding="utf-8")
    assert main(["report", str(path)]) == 2
    line = one_line(capsys.readouterr().err)
    assert "[CONF-912]" in line and "is not a results file" in line and str(path) in line


@rule("TRACE-1033")
@pytest.mark.parametrize("option", ["--step-ms", "--prefill-ms-per-token", "--decode-ms-per-token"])
def test_a_step_cost_too_large_for_the_clock_is_refused_before_work(
    option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve-replay", "--capacity", "60", option, "1e308"]) == 2
    assert "[TRACE-1033]" in one_line(capsys.readouterr().err)


@rule("TRACE-1042")
@pytest.mark.parametrize(
    "extra", [["--policy", "fifo", "--policy", "lru"], ["--block-size", "16", "--block-size", "32"]]
)
def test_a_capacity_search_refuses_to_size_two_caches_at_once(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve-replay", "--target-hit-rate", "0.5", *extra]) == 2
    assert "[TRACE-1042]" in one_line(capsys.readouterr().err)


@rule("TRACE-1037")
def test_a_replay_where_no_request_fits_exits_non_zero_with_a_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve-replay", "--capacity", "60", "--policy", "lru", "--max-model-len", "1"]) == 1
    assert "no request was measured" in one_line(capsys.readouterr().err)


@rule("CONF-902")
def test_serve_replay_out_without_matplotlib_is_refused_before_any_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    assert main(["serve-replay", "--capacity", "60", "--out", str(tmp_path / "report")]) == 2
    line = one_line(capsys.readouterr().err)
    assert "[CONF-902]" in line and "pip install 'kvref[plots]'" in line
    assert not (tmp_path / "report").exists(), "nothing is written before the refusal"
