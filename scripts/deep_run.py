"""Time-boxed deep runs of the conformance suite on one implementation: new bugs, not known ones.

``python scripts/deep_run.py --backend vllm --minutes 30`` runs the suite under the ``deep``
Hypothesis profile (5,000 examples of up to 60 steps per machine): first every test that is not a
state machine, in one ``kvref conformance`` process (a quarter of the time at least), then each
state-machine test (with all its policies) in a process of its own, each for an equal share of the
time left. A run that ends early (the backend lacks the capability, or its examples are quick)
hands its unused time to the runs after it; one still running at the end of its share is stopped
as Ctrl-C stops it, and what it judged so far is kept. When a round is over and time is left, the
state-machine tests that met anything run again in a new round, as often as the time allows.
Failures on a recorded deviation (``deviations/*.toml``) count as known; any other failure is a new
finding, printed with its replay.

Each run writes ``results/deep/<backend>@<version>.json``; ``--render`` rewrites
``results/deep-runs.md`` from every such file (``nox -s deep`` does both for the newest release of
each engine that installs here).
"""

from __future__ import annotations

import argparse
import ast
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "results" / "deep"
REPORT = ROOT / "results" / "deep-runs.md"
#: Seconds a run stopped at the end of its share gets to write its results.
GRACE_SECONDS = 60
#: No run starts with less time than this: loading an engine alone takes seconds.
SHORTEST_SHARE = 30
#: The label of the run of every test that is not a state machine: once, first.
OTHER_TESTS = "every other test"


def kvref_conformance(backend: str, *arguments: str) -> list[str]:
    """The ``kvref conformance`` command line for ``backend`` under the ``deep`` profile."""
    return [sys.executable, "-m", "kvref.cli", "conformance", "--backend", backend, "--profile", "deep", *arguments]


def machine_tests() -> list[str]:
    """The names of the suite's test functions that run a Hypothesis state machine, directly or
    through one helper: the tests the ``deep`` profile exists for."""
    calls: dict[str, set[str]] = {}
    for path in sorted((ROOT / "conformance" / "kvref_conformance" / "suites").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                called = calls.setdefault(node.name, set())
                for call in ast.walk(node):
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
                        called.add(call.func.id)
                    elif isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
                        called.add(call.func.attr)
    runners = {name for name, called in calls.items() if "run_state_machine_as_test" in called}
    runners |= {name for name, called in calls.items() if called & runners}
    return sorted(name for name in runners if name.startswith("test_"))


def run_units() -> list[tuple[str, str]]:
    """What one deep run runs, in order, as (label, pytest ``-k`` expression): every test that is
    not a state machine in one process, then each state-machine test in its own."""
    machines = machine_tests()
    return [(OTHER_TESTS, "not (" + " or ".join(machines) + ")"), *((name, name) for name in machines)]


def run_unit(backend: str, name: str, selection: str, seconds: float, results: Path) -> dict[str, Any]:
    """Run the tests ``selection`` picks for at most ``seconds`` and return what they judged."""
    command = kvref_conformance(backend, "-q", "--results", str(results), "--", "-k", selection, "-rfE")
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # a process started in the background inherits SIGINT ignored; the share ends with SIGINT
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    stopped = False
    try:
        output, _ = process.communicate(timeout=max(seconds, 1.0))
    except subprocess.TimeoutExpired:
        stopped = True
        process.send_signal(signal.SIGINT)
        try:
            output, _ = process.communicate(timeout=GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
    record: dict[str, Any] = {
        "tests": name,
        "seconds": round(time.monotonic() - started, 1),
        "stopped_at_share": stopped,
        "summary": {},
        "steps": 0,
        "failures": [],
        "known": 0,
    }
    written = sorted(results.glob("*.json"))
    if written:
        result = json.loads(written[-1].read_text())
        record["implementation"] = result["implementation"]
        record["summary"] = result["summary"]
        record["steps"] = sum(machine["steps"] for machine in result.get("state_machines", {}).values())
        record["failures"] = result["failures"]
        record["known"] = len(result["known_failures"])
        for path in written:
            path.unlink()
    elif stopped:
        record["summary"] = {"stopped before its first test ended": 1}
    else:
        record["failures"] = [{"test": name, "reason": "no results written", "output": output[-4000:]}]
    return record


def deep_run(backend: str, minutes: float) -> dict[str, Any]:
    """The suite on ``backend`` in runs of an equal share of ``minutes``, in rounds until the time is
    up: after each round the state-machine tests that explored anything run again (the ``deep``
    profile draws new examples each time); see the module docstring."""
    deadline = time.monotonic() + minutes * 60
    units = run_units()
    records: list[dict[str, Any]] = []
    round_number = 1
    with tempfile.TemporaryDirectory() as scratch:
        while units and deadline - time.monotonic() > SHORTEST_SHARE:
            again = []
            for index, (name, selection) in enumerate(units):
                left = deadline - time.monotonic()
                if left < SHORTEST_SHARE:
                    break
                share = max(left / (len(units) - index), SHORTEST_SHARE)
                if round_number == 1 and index == 0:  # hundreds of tests, some with thousands of examples
                    share = max(share, minutes * 60 / 4)
                record = run_unit(backend, name, selection, share, Path(scratch))
                record["round"] = round_number
                records.append(record)
                failures = record["failures"]
                print(
                    f"{backend} round {round_number} {name}: {record['seconds']} s of {share:.0f}, "
                    f"{record['summary']}, {record['steps']} steps, {len(failures)} new failures"
                    + (" (stopped at its share)" if record["stopped_at_share"] else ""),
                    flush=True,
                )
                for failure in failures:
                    print(json.dumps(failure, indent=1), flush=True)
                if name != OTHER_TESTS and explored(record):
                    again.append((name, selection))
            units, round_number = again, round_number + 1
    implementation = next((r["implementation"] for r in records if "implementation" in r), {"name": backend})
    return {"backend": backend, "implementation": implementation, "minutes": minutes, "runs": records}


def explored(record: dict[str, Any]) -> bool:
    """Whether a run met tests the backend offers: it judged one, or was stopped while exploring."""
    summary = record["summary"]
    return bool(record["stopped_at_share"] or any(summary.get(k) for k in ("passed", "failed", "xfailed")))


def failure_said(failure: dict[str, Any]) -> str:
    """A failure in a line: its reason where it has one, else the first assertion of its replay and its rules."""
    if failure.get("reason"):
        return str(failure["reason"])
    said = next((line.strip()[1:].strip() for line in failure.get("replay", "").splitlines() if "Error:" in line), "")
    return f"{said[:300]} (rules {', '.join(failure.get('rules', []))})"


def render() -> str:
    """``results/deep-runs.md`` from every record under ``results/deep/``."""
    lines = [
        "# Deep runs on the newest engine releases",
        "",
        "Written by `python scripts/deep_run.py --render` from `results/deep/*.json`; each record by",
        "`python scripts/deep_run.py --backend <name> --minutes <m>` (`nox -s deep`). The tests that are not state",
        "machines ran in one process, then each state-machine test in its own, under the `deep` profile",
        "(5,000 examples of up to 60 steps per machine), each for an equal share of the time left;",
        "*stopped* means it was still exploring at the end of its share. While time was left, the",
        "state-machine tests that met anything ran again in further rounds, on new examples. *Known*",
        "counts failures on a recorded deviation; *new* is anything else; *steps* are those of the",
        "machines that finished. A failure listed as new was new when the run met it; once reduced it is",
        "recorded in its deviations file, and `bug-corpus.md` lists it under what kvref found.",
        "",
    ]
    for path in sorted(RECORDS.glob("*.json")):
        record = json.loads(path.read_text())
        implementation = record["implementation"]
        seconds = sum(c["seconds"] for c in record["runs"])
        steps = sum(c["steps"] for c in record["runs"])
        new = [f for c in record["runs"] for f in c["failures"]]
        lines += [
            f"## {implementation['name']} {implementation.get('version', '')}",
            "",
            f"{seconds / 60:.1f} minutes, {steps:,} state-machine steps, {len(new)} new failures.",
            "",
            "| round | tests | seconds | passed | known | new | steps | stopped |",
            "|---:|---|---:|---:|---:|---:|---:|---|",
        ]
        for c in record["runs"]:
            summary = c["summary"]
            if not summary and not c["failures"]:
                continue
            lines.append(
                f"| {c.get('round', 1)} | {c['tests']} | {c['seconds']} | {summary.get('passed', 0)} | {c['known']} | "
                f"{len(c['failures'])} | {c['steps']:,} | {'yes' if c['stopped_at_share'] else ''} |"
            )
        for failure in new:
            lines += ["", f"- `{failure['test']}`: {failure_said(failure)}"]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", default=[], help="registered backend name (repeatable)")
    parser.add_argument("--minutes", type=float, default=30.0, help="wall-clock minutes per backend (default 30)")
    parser.add_argument("--render", action="store_true", help="rewrite results/deep-runs.md from results/deep/")
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error("--minutes must be positive")
    if not args.backend and not args.render:
        parser.error("give --backend NAME, --render, or both")
    RECORDS.mkdir(parents=True, exist_ok=True)
    found = 0
    for backend in args.backend:
        record = deep_run(backend, args.minutes)
        implementation = record["implementation"]
        name = f"{backend}@{implementation.get('version', 'unknown')}.json"
        (RECORDS / name).write_text(json.dumps(record, indent=1) + "\n")
        found += sum(len(c["failures"]) for c in record["runs"])
    if args.render:
        REPORT.write_text(render())
        print(f"wrote {REPORT.relative_to(ROOT)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
