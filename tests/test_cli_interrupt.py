"""Ctrl-C stops a long command at once: exit 130, one line, no traceback, no worker left (CONF-912, TRACE-1043).

``kvref serve-replay`` runs its sweep on a process pool; a SIGINT to the command (what Ctrl-C
sends) must end the parent and every worker, keep the points already written to ``--results``
and say so in one line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

rule = pytest.mark.rule


def processes_naming(marker: str) -> list[int]:
    """Live processes whose command line names ``marker`` (the pool's workers share their parent's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


@rule("CONF-912", "TRACE-1043")
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to find the workers")
def test_ctrl_c_ends_serve_replay_and_its_workers_at_once_with_status_130(tmp_path: Path) -> None:
    results = tmp_path / "interrupted-sweep.jsonl"
    sizes = [arg for size in (2, 4, 8, 16, 32, 64) for arg in ("--block-size", str(size))]
    command = [sys.executable, "-m", "kvref", "serve-replay", "--workers", "2", "--results", str(results), *sizes]
    run = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ,
        # Ctrl-C as a terminal sends it: a test run started in the background has SIGINT ignored, and
        # the command would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while len(processes_naming(str(results))) < 3 and time.monotonic() < deadline:  # the parent and 2 workers
        time.sleep(0.1)
    time.sleep(1.0)  # a few points under way
    run.send_signal(signal.SIGINT)
    try:
        _, err = run.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        run.kill()
        run.communicate()  # its pipes closed here, not by a later test's garbage collection
        pytest.fail("kvref serve-replay was still running 20 s after Ctrl-C")
    assert run.returncode == 130, f"exit {run.returncode} after Ctrl-C; stderr: {err!r}"
    assert "Traceback" not in err, f"a traceback after Ctrl-C: {err}"
    assert err.strip().splitlines()[-1].startswith("kvref serve-replay: interrupted"), err
    time.sleep(0.5)
    left = processes_naming(str(results))
    assert not left, f"processes {left} of the sweep are still running after Ctrl-C"
