"""``kvref backends``, ``kvref conformance`` and ``kvref spec``: what runs here, the suite, the spec's own check."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from kvref.cli.console import print_table

__all__ = ["CAPABILITIES_WIDTH", "run_backends", "run_conformance", "run_spec"]

#: The widest the backends table's capabilities column gets; its words wrap within it.
CAPABILITIES_WIDTH = 72


def run_backends(args: argparse.Namespace) -> int:
    """Every registered backend: usable here or why not, version, device, capabilities (``kvref backends``)."""
    from rich.table import Table

    from kvref.config.registry import backend_statuses

    statuses = backend_statuses()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": s.name,
                        "usable": s.usable,
                        "reason": s.reason,
                        "version": s.version,
                        "device": s.device,
                        "capabilities": sorted(s.capabilities),
                    }
                    for s in statuses
                ],
                indent=2,
            )
        )
        return 0
    table = Table(title="kvref backends")
    for column in ("backend", "usable", "version", "device"):
        table.add_column(column)
    # words, not numbers: wrapped between them, so a pipe or a file gets a table a reader can take in
    table.add_column("capabilities / reason", max_width=CAPABILITIES_WIDTH, overflow="fold")
    for s in statuses:
        detail = ", ".join(sorted(s.capabilities)) if s.usable else s.reason
        table.add_row(s.name, "yes" if s.usable else "no", s.version, s.device, detail)
    print_table(table)
    return 0


def run_conformance(args: argparse.Namespace) -> int:
    """Run the conformance suite in this process: the same mechanism as ``pytest --pyargs``."""
    from importlib.metadata import entry_points

    try:
        import pytest
    except ImportError:
        raise SystemExit("kvref conformance needs the suite's dependencies: pip install 'kvref[conformance]'") from None
    argv = ["--pyargs", "kvref_conformance", "-c", os.devnull, "--rootdir", os.getcwd(), "-p", "no:cacheprovider"]
    # kvref itself is already imported (this command is part of it): nothing in it needs rewriting.
    argv += ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if not any(ep.name == "kvref_conformance" for ep in entry_points(group="pytest11")):
        argv += ["-p", "kvref_conformance.plugin"]
    for flag, value in (
        ("--kvref-backend", args.backend),
        ("--kvref-device", args.device),
        ("--kvref-profile", args.profile),
        ("--kvref-results", args.results),
        ("--kvref-deviations", args.deviations),
        ("--kvref-verdicts", args.verdicts),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if args.no_shrink:
        argv.append("--kvref-no-shrink")
    if args.quiet:  # pytest's own progress line is the suite's progress; quiet asks it for less
        argv.append("-q")
    return int(pytest.main(argv + list(args.pytest_args)))


def installed_spec() -> Path:
    """Where the installed spec is: the checkout kvref was imported from (an editable install), else
    ``share/kvref/spec`` where the wheel puts it, under the environment's prefix or the user's base
    (``pip install --user``); the first of them that holds ``rules.json`` (the prefix's, where none does)."""
    import site

    import kvref

    checkout = Path(kvref.__file__).resolve().parents[1] / "spec"
    shared = [Path(base) / "share" / "kvref" / "spec" for base in (sys.prefix, site.getuserbase())]
    for place in (checkout, *shared):
        if (place / "rules.json").is_file():
            return place
    return shared[0]


def spec_rules(spec_dir: Path) -> dict[str, dict[str, Any]]:
    """``{rule id: rule}`` (id, chapter, level, text) from ``spec_dir/rules.json``, or from the installed
    spec (:func:`installed_spec`); in the spec's order."""
    from kvref.contract.errors import ConfigError

    index = spec_dir / "rules.json"
    if not index.exists():
        index = installed_spec() / "rules.json"
    if not index.exists():
        raise ConfigError("CONF-912", f"kvref spec: no rules.json in {spec_dir} nor in {installed_spec()}")
    return {r["id"]: r for r in json.loads(index.read_text(encoding="utf-8"))["rules"]}


def _test_roots(given: list[str]) -> list[Path]:
    """The directories whose tests cite rules: those given that exist, else the installed suite's."""
    roots = [Path(p) for p in given if Path(p).exists()]
    if roots:
        return roots
    from importlib.util import find_spec

    suite = find_spec("kvref_conformance")  # located, not imported: kvref never imports the suite
    return [Path(suite.origin).parent] if suite is not None and suite.origin else []


def show_rules(args: argparse.Namespace) -> int:
    """Print each rule's id, chapter, level and text, the tests that cite it and every verdict on it in
    ``--verdicts`` (``kvref spec show RULE ...``; ``--json`` for tools); 2 for an unknown id."""
    from difflib import get_close_matches

    from kvref.cli.speclint import collect_rule_tests
    from kvref.contract.errors import ConfigError
    from kvref.reports.verdicts import load_verdicts, verdicts_on

    rules = spec_rules(Path(args.spec))
    if not args.ids:
        raise ConfigError("CONF-912", "kvref spec show: name the rules to print, e.g. kvref spec show POOL-105")
    wanted = []
    for rule_id in args.ids:
        rule = rules.get(rule_id.strip().upper())
        if rule is None:
            near = get_close_matches(rule_id.upper(), list(rules), n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise ConfigError("CONF-912", f"kvref spec show: no rule {rule_id!r} in the spec{hint}")
        wanted.append(rule)
    tests = collect_rule_tests(_test_roots(args.tests))
    verdict_dir = Path(args.verdicts)
    docs = load_verdicts(verdict_dir) if verdict_dir.is_dir() else []
    shown = [
        {
            **{k: rule[k] for k in ("id", "chapter", "level", "text")},
            "tests": tests.get(rule["id"], []),
            "verdicts": [{"implementation": c, **v} for c, v in verdicts_on(rule["id"], docs)],
        }
        for rule in wanted
    ]
    if args.json:
        print(json.dumps(shown, indent=1))
        return 0
    for rule in shown:
        print(f"{rule['id']} ({rule['chapter']}, {rule['level']}): {rule['text']}")
        print(f"  tests citing it: {len(rule['tests'])}")
        for test in rule["tests"]:
            print(f"    {test}")
        if not docs:
            print(f"  verdicts: none here ({verdict_dir} holds no verdict files)")
            continue
        print(f"  verdicts in {verdict_dir}: {len(rule['verdicts'])} of {len(docs)} implementations judged it")
        for v in rule["verdicts"]:
            why = "; ".join(r["reason"] + (f" ({r['link']})" if r.get("link") else "") for r in v.get("reasons", []))
            failed = ", ".join(v["tests"]) if v["verdict"] == "fail" else ""
            print(f"    {v['implementation']}: {v['verdict']}" + (f": {why or failed}" if why or failed else ""))
    return 0


def run_spec(args: argparse.Namespace) -> int:
    """Lint the spec, write ``spec/rules.json``, and check rule coverage by tests (``kvref spec check``);
    print rules by id (``kvref spec show``)."""
    from kvref.contract.errors import ConfigError

    if args.action == "show":
        return show_rules(args)
    if args.ids:
        raise ConfigError("CONF-912", f"kvref spec {args.action} takes no rule ids ({' '.join(args.ids)}); show does")
    missing = [p for p in [args.spec, *args.tests, *args.code] if not Path(p).exists()]
    if missing:
        raise ConfigError("CONF-912", f"kvref spec {args.action}: {', '.join(missing)} does not exist")
    from kvref.cli.speclint import (
        build_index,
        code_rule_refs,
        collect_rule_citations,
        coverage,
        lint,
        parse_spec,
    )

    spec_dir = Path(args.spec)
    if not spec_dir.is_dir():
        raise ConfigError("CONF-912", f"kvref spec {args.action}: {spec_dir} is not a spec directory")
    index_path = spec_dir / "rules.json"
    chapters = parse_spec(spec_dir)
    problems = lint(chapters, index_path)
    rules = sum(len(c.rules) for c in chapters)
    print(f"spec: {len(chapters)} chapters, {rules} rules")
    for problem in problems:
        print(f"  lint: {problem}")
    if args.action in ("index", "check") and not problems:
        index_path.write_text(json.dumps(build_index(chapters), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {index_path}")
    failing: list[str] = []
    if args.action == "check":
        cited = collect_rule_citations([Path(p) for p in args.tests if Path(p).exists()])
        report = coverage(chapters, cited)
        for level in ("MUST", "MUST NOT", "SHOULD", "SHOULD NOT", "MAY"):
            ids = report.untested.get(level, [])
            if ids:
                print(f"  untested {level} rules ({len(ids)}): {', '.join(ids)}")
        for rid, where in sorted(report.unknown.items()):
            print(f"  tests cite unknown rule {rid}: {', '.join(where[:3])}")
        bad_code = code_rule_refs([Path(p) for p in args.code if Path(p).exists()], chapters)
        for rid, where in sorted(bad_code.items()):
            print(f"  code cites unknown rule {rid}: {', '.join(where[:3])}")
        failing = report.failing() + sorted(bad_code)
        tested = len({r.id for c in chapters for r in c.rules} & set(cited))
        print(f"coverage: {tested}/{rules} rules cited by a test")
    if problems or failing:
        print("spec check FAILED")
        return 1
    print("spec check passed")
    return 0
