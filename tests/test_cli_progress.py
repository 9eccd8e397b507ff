"""Long commands show progress on standard error, on a terminal only, and never with ``--quiet`` (CONF-912).

The bar goes to standard error so that a command's results (tables, ``--json``) on standard output
stay clean when piped; a command run under a pseudo-terminal shows it, the same command with
``--quiet`` or with standard error redirected to a file does not.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest

from kvref.cli import console
from kvref.cli.main import build_parser, main

rule = pytest.mark.rule

REPLAY = ["replay", "--capacity", "40", "--capacity", "80", "--policy", "lru", "--policy", "fifo", "--json"]


def run_with_terminal_stderr(args: list[str]) -> tuple[str, str]:
    """Run ``kvref ARGS`` with standard error on a pseudo-terminal; its standard output and what the terminal showed."""
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    process = subprocess.Popen(
        [sys.executable, "-m", "kvref", *args], stdout=subprocess.PIPE, stderr=follower, env=env, text=True
    )
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # the command ended and closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    out, _ = process.communicate(timeout=300)
    os.close(leader)
    assert process.returncode == 0, shown.decode(errors="replace")
    return out, shown.decode(errors="replace")


@rule("CONF-912")
@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_replay_shows_its_progress_on_a_terminal_and_none_with_quiet() -> None:
    out, shown = run_with_terminal_stderr(REPLAY)
    assert "replaying" in shown or "at 80 blocks" in shown or "at 40 blocks" in shown, shown
    assert out.lstrip().startswith("["), "the JSON on standard output carries no progress"
    _, quiet = run_with_terminal_stderr([*REPLAY, "--quiet"])
    assert "blocks" not in quiet and "replaying" not in quiet, quiet


@rule("CONF-912")
def test_no_progress_reaches_a_file(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(REPLAY) == 0
    captured = capfd.readouterr()
    assert captured.err == "", "standard error is not a terminal here: no bar, no note"


@rule("CONF-912")
@pytest.mark.parametrize("command", [["replay"], ["serve-replay"], ["conformance"], ["traces", "list"]])
def test_every_long_command_takes_quiet(command: list[str]) -> None:
    args = build_parser().parse_args([*command, "--quiet"])
    assert args.quiet is True


@rule("CONF-912")
def test_a_hidden_bar_accepts_every_call_a_shown_one_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console, "_QUIET", [True])
    assert not console.showing_progress()
    with console.progress_bar("work", 3) as advance:
        advance()
        advance(0, label="next")
        advance(2, total=4)
