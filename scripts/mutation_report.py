"""The reports of ``scripts/mutation.py``: verdicts from mutmut's files, tables, survivors' diffs.

Per target, ``results/mutation/NAME.json`` holds every count and every survivor's diff, and
``results/mutation/NAME.md`` the same for people: killed, timed out, survived and untested per
module, the score, each survivor that is shown equivalent (``[[equivalent_mutant]]`` in
``scripts/mutation.toml``) with its reason, and each survivor left to kill with its diff.
``results/mutation/README.md`` keeps one row per target, rows of earlier runs included.

The score is killed (a timeout counts as killed: the mutant made the code loop) over killed +
survived + untested, a mutant no test runs counting against it; the adjusted score leaves the
mutants shown equivalent out of that denominator.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

#: mutmut's exit codes as verdicts; anything else is reported under its code.
VERDICTS = {
    1: "killed",
    3: "killed",
    37: "killed",
    0: "survived",
    5: "untested",
    33: "untested",
    34: "skipped",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
}
COLUMNS = ("killed", "timeout", "survived", "equivalent", "untested")


def verdicts(workspace: Path, mutated: str) -> dict[str, dict[str, int | None]]:
    """Module path -> (mutant name -> mutmut's exit code), from the ``.meta`` files of ``mutated``."""
    out: dict[str, dict[str, int | None]] = {}
    root = workspace / "mutants"
    for meta in sorted((root / mutated).rglob("*.py.meta")):
        codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
        if codes:
            out[meta.relative_to(root).as_posix().removesuffix(".meta")] = codes
    return out


def verdict(code: int | None) -> str:
    """The verdict of one exit code."""
    return "not run" if code is None else VERDICTS.get(code, f"exit {code}")


def survivor_diffs(workspace: Path, survivors: list[tuple[str, str]]) -> dict[str, str]:
    """The changed lines of each (mutant, module path), through mutmut's own code, run in ``workspace``."""
    if not survivors:
        return {}
    here = Path.cwd()
    os.chdir(workspace)
    try:
        diff_apply: Any = importlib.import_module("mutmut.mutation.diff_apply")
        diffs = {}
        for name, path in survivors:
            text = diff_apply.get_diff_for_mutant(name, path=path)
            changed = [line for line in text.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]
            diffs[name] = "\n".join(changed).strip()  # a def at column 0 has no space after its sign
        return diffs
    finally:
        os.chdir(here)


def equivalent_lines(source: Path, patterns: dict[str, str]) -> Counter[str]:
    """How many source lines under ``source`` each reason (pattern -> reason) keeps unmutated."""
    counts: Counter[str] = Counter()
    for path in sorted(source.rglob("*.py")):
        for line in path.read_text(encoding="utf-8").splitlines():
            for pattern, reason in patterns.items():
                if re.search(pattern, line):
                    counts[reason] += 1
    return counts


def score(counts: Counter[str], *, adjusted: bool = False) -> float:
    """killed (timeouts included) / (killed + survived + untested), the equivalent ones counted as
    survivors, or left out when ``adjusted``; 1.0 when nothing was mutated."""
    killed = counts["killed"] + counts["timeout"]
    total = killed + counts["survived"] + counts["untested"] + (0 if adjusted else counts["equivalent"])
    return killed / total if total else 1.0


def indented(diff: str) -> str:
    """A diff's lines after the first indented by two spaces, to sit inside a list item."""
    return diff.replace("\n", "\n  ")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table whose numbers are never cut."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def table_row(label: str, counts: Counter[str]) -> list[str]:
    """One row of a target's table: the counts of each verdict, the score and the adjusted score."""
    return [label, *(str(counts[c]) for c in COLUMNS), f"{score(counts):.1%}", f"{score(counts, adjusted=True):.1%}"]


def write_report(
    info: dict[str, Any],
    workspace: Path,
    out_dir: Path,
    explain: Callable[[str, str], str | None],
    kept: Counter[str],
) -> str:
    """Write ``NAME.json`` and ``NAME.md`` for the target described by ``info`` (name, mutated,
    backend, unit_tests, wall_s); return its row of the summary table."""
    by_module = verdicts(workspace, info["mutated"])
    survivors = [(n, module) for module, codes in by_module.items() for n, c in codes.items() if c == 0]
    diffs = survivor_diffs(workspace, survivors)
    reasons = {n: r for n, _ in survivors if (r := explain(n, diffs.get(n, ""))) is not None}
    total: Counter[str] = Counter()
    rows, modules = [], {}
    for module, codes in by_module.items():
        counts = Counter("equivalent" if n in reasons else verdict(c) for n, c in codes.items())
        total.update(counts)
        modules[module] = dict(counts)
        rows.append(table_row(module, counts))
    rows.append(table_row("all", total))
    wall = f"{info['wall_s'] / 60:.1f} min" if info.get("wall_s") is not None else "not run here"
    if info.get("rerun_s") is not None:  # the full run's time, and the rerun's after it
        wall += f" (then {info['rerun_s'] / 60:.1f} min to rerun what changed or survived)"
    left = [n for n, _ in survivors if n not in reasons]
    untested = sorted(n for codes in by_module.values() for n, c in codes.items() if verdict(c) == "untested")
    record = {
        **info,
        "cores": os.cpu_count(),
        "totals": dict(total),
        "score": score(total),
        "adjusted_score": score(total, adjusted=True),
        "modules": modules,
        "equivalent": {n: {"reason": r, "diff": diffs.get(n, "")} for n, r in reasons.items()},
        "survivors": {n: diffs.get(n, "") for n in left},
        "equivalent_lines": dict(kept),
        "untested": untested,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{info['name']}.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    tests = ", ".join(f"`{t}`" for t in info["unit_tests"])
    md = [
        f"# Mutation testing: {info['name']}",
        "",
        f"Mutated: `{info['mutated']}`. The test: the conformance suite (`ci` profile) on `{info['backend']}`"
        + (f", plus {tests}" if tests else "")
        + f". Wall time {wall} on {os.cpu_count()} cores. Score: killed / (killed + survived + equivalent +"
        " untested), a timeout counted as killed; the adjusted score leaves the equivalent mutants out.",
        "",
        markdown_table(["module", *COLUMNS, "score", "adjusted"], rows),
        "",
        "## Lines left unmutated as equivalent",
        "",
        *(f"- {n} line(s): {reason}" for reason, n in kept.items()),
        "",
        f"## Survivors shown equivalent ({len(reasons)})",
        "",
        *(f"- `{n}`: {r}\n\n  ```diff\n  {indented(diffs.get(n, ''))}\n  ```" for n, r in reasons.items()),
        "",
        f"## Survivors left to kill ({len(left)})",
        "",
    ]
    for n in left:
        md += [f"`{n}`", "", "```diff", diffs.get(n, ""), "```", ""]
    (out_dir / f"{info['name']}.md").write_text("\n".join(md), encoding="utf-8")
    cells = " | ".join(str(total[c]) for c in COLUMNS)
    return f"| {info['name']} | {cells} | {score(total):.1%} | {score(total, adjusted=True):.1%} | {wall} |"


def write_summary(out_dir: Path, rows: dict[str, str], targets: Iterable[str]) -> None:
    """``results/mutation/README.md``: one row per target, rows of earlier runs kept while their
    target is still one of ``targets`` (the targets of ``scripts/mutation.toml``)."""
    path = out_dir / "README.md"
    known = set(targets)
    kept: dict[str, str] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("| ") and not line.startswith("| target"):
                name = line.split("|")[1].strip()
                if name in known:
                    kept[name] = line
    kept.update(rows)
    header = ["target", *COLUMNS, "score", "adjusted", "wall time"]
    text = (
        "# Mutation testing (`nox -s mutation`)\n\n"
        "One row per target of `scripts/mutation.toml`; each target's survivors, with their diffs, are in"
        " its `.md`.\n\n"
        + "| "
        + " | ".join(header)
        + " |\n|"
        + "---|" * len(header)
        + "\n"
        + "\n".join(kept[k] for k in sorted(kept))
        + "\n"
    )
    path.write_text(text, encoding="utf-8")
