"""The ``kvref`` command.

``kvref backends``       every registered backend: usable here or why not, device, capabilities
``kvref replay``         replay a trace through a backend's prefix cache: hit rates, evictions, speed
``kvref serve-replay``   replay requests overlapping in time through the request manager; cache sizing
``kvref traces``         the public traces kvref knows: list them, fetch one with its checksum checked
``kvref conformance``    run the conformance suite on a backend (``--backend NAME``)
``kvref events check``   check a recorded KV-event stream: the first event no conforming cache sends
``kvref report``         render conformance results files as one Markdown matrix
``kvref spec check``     lint the spec, write ``spec/rules.json``, report rule coverage by tests
``kvref spec show RULE``  print a rule's text, from ./spec or the copy installed with kvref

``--backend`` and the other settings follow the precedence of :mod:`kvref.config.settings` (CONF-903).
Every argument is checked before any work starts (:mod:`kvref.cli.arguments`, CONF-912); errors
print as one line naming the rule and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvref.cli import arguments as arg
from kvref.cli.commands import run_backends, run_conformance, run_spec
from kvref.cli.events import run_events
from kvref.cli.replay import run_replay
from kvref.cli.report import run_report
from kvref.cli.serving import add_serving_commands
from kvref.contract.errors import KVRefError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``kvref`` command line: every command, its options, and each option's check (CONF-912)."""
    from kvref.simulation.workloads import WORKLOADS

    parser = arg.CommandParser(prog="kvref", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="store_true", help="print kvref's version and exit")
    sub = parser.add_subparsers(dest="command", parser_class=arg.CommandParser)

    backends = sub.add_parser("backends", help="list registered backends and whether they run here")
    backends.add_argument("--json", action="store_true", help="machine-readable output")
    backends.set_defaults(func=run_backends)

    rep = sub.add_parser("replay", help="replay a trace (or the built-in workload) through a prefix cache")
    rep.add_argument(
        "trace",
        nargs="?",
        type=arg.trace_argument,
        help="a JSON Lines (Mooncake) or Azure CSV trace, or a catalog name (kvref traces list); "
        "default: the built-in workload",
    )
    rep.add_argument("--backend", type=arg.backend_name, help="backend name (default: KVREF_BACKEND, config, oracle)")
    rep.add_argument("--device", help="device for device backends")
    rep.add_argument(
        "--policy",
        action="append",
        type=arg.policy_name,
        help="eviction policy, as the tables name it (lru, lru-leaf, radix-lfu, ...); repeat for several "
        "(default: every policy of the cache)",
    )
    rep.add_argument(
        "--capacity", type=arg.capacity, action="append", help="cache capacity in blocks; repeat for several"
    )
    rep.add_argument(
        "--sweep", action="store_true", help="several capacities (x1/8 .. x2 of one given) and the offline optimum"
    )
    rep.add_argument(
        "--curve",
        action="store_true",
        help="the exact lru and lru-leaf hit rate at every capacity, in one pass (curve.json, curve.png with --out)",
    )
    rep.add_argument(
        "--block-size",
        type=arg.block_size,
        help="tokens per block (default 512 for a JSON Lines trace, 16 for Azure and built-in workloads)",
    )
    rep.add_argument(
        "--warmup", type=arg.warmup_fraction, default=0.0, help="fraction of requests that only warm the cache"
    )
    rep.add_argument("--hash", type=arg.hash_algorithm, help="hash function for token-level traces")
    rep.add_argument("--seed", type=arg.seed, default=0, help="seed of the built-in workload or of the Azure prefixes")
    rep.add_argument(
        "--azure-shared",
        type=arg.shared_fraction,
        default=0.5,
        help="Azure: fraction opening with a shared prefix",
    )
    rep.add_argument(
        "--azure-prefixes", type=arg.positive_count("TRACE-1045", "a number of shared prefixes"), default=8
    )
    rep.add_argument(
        "--workload",
        default="chat",
        choices=list(WORKLOADS),
        help="built-in workload",
    )
    rep.add_argument(
        "--stepwise",
        action="store_true",
        help="replay by protocol calls even on a backend with a one-call replay (same counts, slower)",
    )
    rep.add_argument(
        "--cache",
        default="hash",
        choices=["hash", "radix", "both"],
        help="the hash-block prefix cache (chapter 03), chapter 06's radix cache, or both side by side",
    )
    rep.add_argument("--json", action="store_true", help="machine-readable output")
    rep.add_argument(
        "--format", choices=["table", "plain"], default="table", help="plain: tables as plain columns, every cell whole"
    )
    rep.add_argument("--out", type=arg.output_directory, help="directory for replay.json, replay.md and hit-rate.png")
    rep.add_argument(
        "--events",
        type=arg.output_file,
        help="write the cache's KV events of the one replay asked for here (kvref events check reads them)",
    )
    rep.add_argument(
        "--optimum",
        action="store_true",
        help="with --curve: Belady's MIN and an upper bound on the offline optimum (the LP relaxation, "
        "solved by HiGHS; pip install 'kvref[optimum]') at each capacity shown (TRACE-1063)",
    )
    rep.add_argument(
        "--snapshot",
        type=arg.output_file,
        help="with --events: also write what the cache holds at the end (kvref events check --snapshots reads it)",
    )
    rep.add_argument(
        "--backends",
        action="store_true",
        help="also replay the largest capacity (first policy) on every usable backend: speed, and the same counts",
    )
    rep.set_defaults(func=run_replay)

    add_serving_commands(sub)

    conf = sub.add_parser("conformance", help="run the conformance suite on a backend")
    conf.add_argument("--backend", help="backend name or module:Class (default: KVREF_BACKEND, config, oracle)")
    conf.add_argument("--device", help="device for the backend")
    conf.add_argument("--profile", choices=["ci", "dev", "deep"], help="Hypothesis profile")
    conf.add_argument(
        "--results", type=arg.output_directory, help="directory for the results file (default results/conformance)"
    )
    conf.add_argument("--deviations", type=arg.toml_file, help="extra known-deviations TOML file")
    conf.add_argument(
        "--verdicts",
        type=arg.output_directory,
        help="also write the verdict on every rule the run judged here (results/verdicts is the committed set)",
    )
    conf.add_argument("--no-shrink", action="store_true", help="detection only: skip Hypothesis's shrink phase")
    conf.add_argument("pytest_args", nargs="*", help="after --: arguments passed on to pytest")
    conf.set_defaults(func=run_conformance)

    events = sub.add_parser("events", help="check a recorded KV-event stream as a router would rebuild it")
    events.add_argument("action", choices=["check"], help="check: report the first event no conforming cache sends")
    events.add_argument(
        "stream",
        type=arg.existing_file,
        help="a recorded stream: kvref's JSON Lines (kvref replay --events), or vLLM's or SGLang's "
        "KVEventBatch messages in MessagePack (kvref serve-replay --engine vllm --events)",
    )
    events.add_argument(
        "--copies",
        action="store_true",
        help="the engine reports every copy of a hash (vLLM does): count copies per hash (PFX-324) "
        "instead of requiring a store only for a hash's first copy and a removal only for its last",
    )
    events.add_argument(
        "--snapshots",
        type=arg.existing_file,
        help="what the cache held at points of the stream (kvref replay --snapshot writes one): the rebuild "
        "must hold the same hashes there (PFX-327), which finds events lost without a trace in the stream",
    )
    events.add_argument("--json", action="store_true", help="machine-readable output")
    events.set_defaults(func=run_events)

    report = sub.add_parser("report", help="render results files as a Markdown conformance matrix")
    report.add_argument(
        "paths",
        nargs="*",
        type=arg.existing_path,
        default=["results/conformance", "results"],
        help="results files or directories",
    )
    report.add_argument("--out", type=arg.output_file, help="write the Markdown here instead of printing it")
    report.add_argument(
        "--all-machines",
        action="store_true",
        help="also the results other machines recorded (committed GPU runs), each machine in tables of its own",
    )
    report.add_argument(
        "--verdicts",
        type=arg.existing_path,
        help="instead: render the verdict files in this directory as README.md and index.html there",
    )
    report.add_argument("--spec", default="spec", help="with --verdicts: the spec whose rules.json names the rules")
    report.set_defaults(func=run_report)

    spec = sub.add_parser("spec", help="lint the spec, write rules.json, check rule coverage")
    spec.add_argument("action", choices=["lint", "index", "check", "show"], nargs="?", default="check")
    spec.add_argument("ids", nargs="*", help="with show: the rule ids to print (POOL-105 ...)")
    spec.add_argument(
        "--spec", default="spec", help="spec directory (default: ./spec; show falls back to the installed copy)"
    )
    spec.add_argument("--tests", nargs="*", default=["tests", "conformance"], help="where tests live")
    spec.add_argument(
        "--verdicts", default="results/verdicts", help="with show: the verdict files to read (default results/verdicts)"
    )
    spec.add_argument("--json", action="store_true", help="with show: machine-readable output")
    spec.add_argument(
        "--code",
        nargs="*",
        default=["kvref", "backends", "conformance"],
        help="source whose cited rule ids must exist",
    )
    spec.set_defaults(func=run_spec)
    for command in (rep, conf, *(sub.choices[name] for name in ("serve-replay", "traces"))):
        command.add_argument(
            "-q", "--quiet", action="store_true", help="no progress on standard error (results and errors still print)"
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvref`` console script: the command's status; 130 after Ctrl-C, at any point."""
    try:
        return _run(argv)
    except KeyboardInterrupt:  # while the command line was read, before a command started
        print("kvref: interrupted", file=sys.stderr)
        return 130


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a refused command line (status 2, said in one line) or --help (status 0)
        return exc.code if isinstance(exc.code, int) else 2
    if args.version:
        from kvref import __version__

        print(f"kvref {__version__}")
        return 0
    if args.command is None:
        parser.print_help()
        return 0
    from kvref.cli.console import use_plain_tables, use_quiet

    use_plain_tables(getattr(args, "format", None) == "plain")
    use_quiet(getattr(args, "quiet", False))
    try:
        return int(args.func(args))
    except KVRefError as exc:
        print(f"kvref {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: stopped at once, workers ended, finished points kept (TRACE-1043)
        print(f"kvref {args.command}: interrupted; what finished is kept where it was written", file=sys.stderr)
        return 130
