"""Mutation testing of the oracle and the array core with mutmut: ``nox -s mutation``.

For each target of ``scripts/mutation.toml`` (``--target NAME``, repeatable; all by default) it

1. builds a workspace under ``build/mutation/NAME`` laid out as the packages import
   (``kvref/``, ``kvref_arraypool/``, ``kvref_torch/``, ``kvref_cupy/``, ``kvref_conformance/``
   and ``tests/`` side by side, so that a module's path is its import name, as mutmut needs);
2. runs ``mutmut run`` there: the test of a mutant is the conformance suite under the ``ci``
   profile on the target's backend plus the target's unit tests, selected by coverage;
3. runs the mutants that survived an earlier run again, since mutmut keeps a verdict while its
   function is unchanged, and a survivor may have been killed by a test added since;
4. writes the reports of :mod:`mutation_report` under ``results/mutation/``.

A workspace is kept between runs; ``--fresh`` starts again. Usage:
``python scripts/mutation.py [--target NAME] [--max-children N] [--fresh] [--report-only]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from mutation_report import equivalent_lines, verdicts, write_report, write_summary

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "scripts" / "mutation.toml"
PACKAGES = {
    "kvref": ROOT / "kvref",
    "kvref_arraypool": ROOT / "backends" / "kvref_arraypool",
    "kvref_torch": ROOT / "backends" / "kvref_torch",
    "kvref_cupy": ROOT / "backends" / "kvref_cupy",
    "kvref_conformance": ROOT / "conformance" / "kvref_conformance",
    "tests": ROOT / "tests",
    "spec": ROOT / "spec",
}


@dataclass(frozen=True)
class Target:
    """One mutation target: the source mutated, the backend the suite runs on, the unit tests added."""

    name: str
    mutate: str
    backend: str
    tests: tuple[str, ...]
    only: tuple[str, ...] = ()  # files under ``mutate`` to mutate, all of them when empty

    @property
    def module_prefix(self) -> str:
        """The import name of the mutated package (``kvref.oracle.blockpool``)."""
        return self.mutate.strip("/").replace("/", ".")


@dataclass(frozen=True)
class Equivalent:
    """Source lines left unmutated: a pattern over the line, and why its mutants cannot be told apart."""

    pattern: str
    reason: str


@dataclass(frozen=True)
class EquivalentMutant:
    """One surviving mutant shown equivalent: its function, its mutated line, and why nothing can tell."""

    function: str
    line: str
    reason: str


@dataclass(frozen=True)
class Config:
    """``scripts/mutation.toml``: the targets, the unmutated line patterns, the equivalent mutants."""

    targets: dict[str, Target]
    equivalents: list[Equivalent]
    mutants: list[EquivalentMutant]

    def explain(self, name: str, diff: str) -> str | None:
        """Why the surviving mutant ``name`` (with ``diff``) is equivalent, or None if it is not listed."""
        function = function_of(name)
        added = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
        for m in self.mutants:
            if m.function == function and m.line in added:
                return m.reason
        return None


def function_of(mutant: str) -> str:
    """A mutant's function as ``Class.method`` or ``function``.

    ``kvref...references.xǁReferenceCountingǁ_check_generations__mutmut_3`` names
    ``ReferenceCounting._check_generations``.
    """
    local = mutant.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0]
    return ".".join(part for part in local.split("ǁ")[1:] if part) if "ǁ" in local else local.removeprefix("x_")


def load_config(path: Path = CONFIG) -> Config:
    """The targets, the equivalent-line patterns and the equivalent mutants of ``scripts/mutation.toml``."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    targets = {
        name: Target(name, t["mutate"], t["backend"], tuple(t.get("tests", ())), tuple(t.get("only", ())))
        for name, t in data["target"].items()
    }
    equivalents = [Equivalent(e["pattern"], e["reason"]) for e in data.get("equivalent", [])]
    listed = data.get("equivalent_mutant", [])
    mutants = [EquivalentMutant(m["function"], m["line"].strip(), m["reason"]) for m in listed]
    return Config(targets, equivalents, mutants)


def workspace_pyproject(target: Target, equivalents: list[Equivalent], results_dir: Path) -> str:
    """The workspace's pyproject.toml: mutmut's settings and the repository's pytest settings."""
    suite = ["kvref_conformance/test_conformance.py", *target.tests]
    pytest_args = [
        "--kvref-backend",
        target.backend,
        "--kvref-profile",
        "ci",
        "--kvref-no-shrink",
        "--kvref-results",
        str(results_dir),
        "-p",
        "no:cacheprovider",
    ]
    mutmut = {
        "source_paths": [target.mutate.split("/")[0] + "/"],
        "only_mutate": [f"{target.mutate.rstrip('/')}/{only}" for only in target.only or ("*",)],
        "also_copy": [p for p in PACKAGES if p != target.mutate.split("/")[0]],
        "pytest_add_cli_args_test_selection": suite,
        "pytest_add_cli_args": pytest_args,
        "do_not_mutate_patterns": [e.pattern for e in equivalents],
        "timeout_multiplier": 10.0,
        "timeout_constant": 5.0,
    }
    lines = ["[tool.mutmut]"] + [f"{key} = {json.dumps(value)}" for key, value in mutmut.items()]
    lines += [
        "",
        "[tool.pytest.ini_options]",
        'addopts = ["--strict-markers", "-W", "ignore::pytest.PytestAssertRewriteWarning"]',
        'markers = ["rule(*ids): spec rule ids", "benchmark_suite: a benchmark"]',
        'filterwarnings = ["error", "ignore::DeprecationWarning:mutmut"]',
    ]
    return "\n".join(lines) + "\n"


def build_workspace(target: Target, equivalents: list[Equivalent], workspace: Path, *, fresh: bool) -> None:
    """Copy the packages side by side into ``workspace`` (kept between runs unless ``fresh``)."""
    if fresh and workspace.exists():
        shutil.rmtree(workspace)
    workspace.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "bench", "meta")
    for name, source in PACKAGES.items():
        destination = workspace / name
        if destination.exists():
            shutil.rmtree(destination)
        shutil.copytree(source, destination, ignore=ignore)
    results_dir = workspace / "suite-results"
    (workspace / "pyproject.toml").write_text(workspace_pyproject(target, equivalents, results_dir), encoding="utf-8")


def run_mutmut(workspace: Path, max_children: int, mutants: list[str] | None = None) -> float:
    """Run ``mutmut run`` in ``workspace`` (on ``mutants`` only, when given); its wall time in
    seconds. Stops the script when mutmut fails."""
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": "", "CI": "1"}
    argv = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *(mutants or [])]
    done = subprocess.run(argv, cwd=workspace, env=env, check=False)
    if done.returncode:
        raise SystemExit(f"mutmut run failed in {workspace} with status {done.returncode}")
    return time.perf_counter() - start


def survivors(workspace: Path, target: Target) -> list[str]:
    """The mutants of ``target`` whose last verdict in ``workspace`` was: survived."""
    by_module = verdicts(workspace, target.mutate)
    return sorted(n for codes in by_module.values() for n, c in codes.items() if c == 0)


def earlier_wall_time(report: Path) -> float | None:
    """The wall time a target's last report recorded, or None when there is none."""
    try:
        wall = json.loads(report.read_text(encoding="utf-8")).get("wall_s")
    except (OSError, ValueError):
        return None
    return float(wall) if isinstance(wall, (int, float)) else None


def main(argv: list[str] | None = None) -> int:
    """Build, run and report the targets named on the command line (all by default)."""
    config = load_config()
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--target", action="append", choices=sorted(config.targets), help="a target (repeatable)")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2, help="mutants run at once")
    parser.add_argument("--fresh", action="store_true", help="start from a new workspace, forgetting verdicts")
    parser.add_argument("--report-only", action="store_true", help="report the workspace's verdicts, run nothing")
    parser.add_argument("--workspace", type=Path, default=ROOT / "build" / "mutation")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "mutation")
    args = parser.parse_args(argv)
    rows = {}
    patterns = {e.pattern: e.reason for e in config.equivalents}
    for name in args.target or sorted(config.targets):
        target, workspace = config.targets[name], args.workspace / name
        wall_s = rerun_s = None
        earlier_s = earlier_wall_time(args.out / f"{name}.json")
        if not args.report_only:
            build_workspace(target, config.equivalents, workspace, fresh=args.fresh)
            earlier = survivors(workspace, target)
            wall_s = run_mutmut(workspace, args.max_children)
            again = sorted(set(earlier) & set(survivors(workspace, target)))
            if again:
                print(f"{len(again)} mutants that survived an earlier run, again against today's tests", flush=True)
                wall_s += run_mutmut(workspace, args.max_children, again)
            if not args.fresh and earlier_s is not None:  # a rerun in a kept workspace: the full run's time stays
                wall_s, rerun_s = earlier_s, wall_s
        if wall_s is None:  # a report of an earlier run keeps that run's wall time
            wall_s = earlier_s
        source = PACKAGES[target.mutate.split("/")[0]].joinpath(*Path(target.mutate).parts[1:])
        info = {
            "name": name,
            "mutated": target.mutate,
            "backend": target.backend,
            "unit_tests": list(target.tests),
            "wall_s": wall_s,
            "rerun_s": rerun_s,
        }
        rows[name] = write_report(info, workspace, args.out, config.explain, equivalent_lines(source, patterns))
        print(rows[name], flush=True)
    write_summary(args.out, rows, config.targets)
    print(f"wrote {args.out}/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
