"""One argument model for every ``kvref`` command: each option is parsed and checked here, once (CONF-912).

An option two commands share (capacities, block sizes, policies, fractions, targets, worker
counts, ranges, the paths read and written) is one of the parsers below, so it is refused with the
same rule and the same words in every command, and before any work starts: argparse calls these
while it reads the command line, and prints a refusal as one line, ``kvref replay: error: argument
--block-size: [TRACE-1002] ...``, with exit status 2. Paths to write are created and checked
writable then too, so a run never does its work only to fail at the end.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "MAX_BLOCK_SIZE",
    "snapshot_clash",
    "CommandParser",
    "backend_name",
    "block_size",
    "capacity",
    "capacity_range",
    "existing_path",
    "hash_algorithm",
    "hash_policy_name",
    "hit_rate_target",
    "milliseconds",
    "nonnegative_milliseconds",
    "output_directory",
    "output_file",
    "policy_name",
    "positive_count",
    "results_file",
    "scheduler_address",
    "seed",
    "shared_fraction",
    "toml_file",
    "trace_argument",
    "warmup_fraction",
    "worker_count",
]


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, refusing a command line in one line: ``kvref replay: error: argument
    --block-size: [TRACE-1002] ...`` and where the options are listed, with exit status 2."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's parse, refusing ``--option=--`` first: argparse reads that value as none at all,
        so the option would silently keep its default."""
        for token in sys.argv[1:] if args is None else args:
            if token == "--":  # what follows is another program's (pytest's) to read
                break
            name, equals, value = token.partition("=")
            if token.startswith("--") and equals and value == "--":
                self.error(f"argument {name}: [CONF-912] '--' is not a value (it ends the options)")
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        """Print ``message`` as one line, saying where the options are listed, and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def _refuse(rule: str, message: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"[{rule}] {message}")


def _whole(text: str, rule: str, what: str) -> int:
    try:
        if not text.isascii():  # Python's int reads full-width and other scripts' digits: ASCII only
            raise ValueError(text)
        return int(text.strip(), 10)
    except ValueError:
        raise _refuse(rule, f"{what} must be a whole number, got {text!r}") from None


def positive_count(rule: str, what: str) -> Callable[[str], int]:
    """A parser of whole numbers >= 1 that refuses anything else under ``rule``, naming ``what``."""

    def parse(text: str) -> int:
        value = _whole(text, rule, what)
        if value < 1:
            raise _refuse(rule, f"{what} must be at least 1, got {value}")
        return value

    parse.__name__ = what
    return parse


_block_count = positive_count("TRACE-1002", "a block size (tokens per block)")
#: The most tokens a block may hold on the command line: more than any engine's block or page, and
#: what keeps a built-in workload (prompts of 4-12 blocks) within memory.
MAX_BLOCK_SIZE = 65_536


def block_size(text: str) -> int:
    """Tokens per block, 1 to :data:`MAX_BLOCK_SIZE` (TRACE-1002): ``replay`` and ``serve-replay`` alike."""
    value = _block_count(text)
    if value > MAX_BLOCK_SIZE:
        raise _refuse(
            "TRACE-1002", f"a block size (tokens per block) must be at most {MAX_BLOCK_SIZE:,}, got {value:,}"
        )
    return value


#: A cache capacity in blocks (TRACE-1030): ``replay`` and ``serve-replay`` alike.
capacity = positive_count("TRACE-1030", "a capacity (blocks)")
#: Processes of a sweep.
worker_count = positive_count("CONF-912", "a worker count")


#: One token's K and V in bytes, for the loads of the tiers below the device (TIER-1128).
kv_bytes_per_token = positive_count("TIER-1130", "KV bytes per token")


def tier_spec(text: str) -> Any:
    """A tier below the device pool, ``NAME:BLOCKS:GBPS[:LATENCY_MS]``, with BLOCKS a comma list for
    a sweep over the tier's size (TIER-1130): one TierSpec per size."""
    from kvref.contract.errors import InvalidValueError
    from kvref.simulation.serving.tiers import TierSpec

    try:
        return TierSpec.parse_sweep(text)
    except InvalidValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def seed(text: str) -> int:
    """A workload's seed: a whole number >= 0 (TRACE-1005)."""
    value = _whole(text, "TRACE-1005", "a seed")
    if value < 0:
        raise _refuse("TRACE-1005", f"a seed must be at least 0, got {value}")
    return value


def _number(text: str, rule: str, what: str) -> float:
    try:
        if not text.isascii():  # as for whole numbers: ASCII digits only
            raise ValueError(text)
        value = float(text.strip())
    except ValueError:
        raise _refuse(rule, f"{what} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise _refuse(rule, f"{what} must be a finite number, got {text!r}")
    return value


def warmup_fraction(text: str) -> float:
    """The share of requests that only warm the cache: a fraction in [0, 1) (TRACE-1013)."""
    value = _number(text, "TRACE-1013", "the warm-up fraction")
    if not 0.0 <= value < 1.0:
        raise _refuse("TRACE-1013", f"the warm-up fraction must be in [0, 1), got {text!r}")
    return value


def shared_fraction(text: str) -> float:
    """The share of Azure requests opening with a shared prefix: a fraction in [0, 1] (TRACE-1045)."""
    value = _number(text, "TRACE-1045", "the shared fraction")
    if not 0.0 <= value <= 1.0:
        raise _refuse("TRACE-1045", f"the shared fraction must be in [0, 1], got {text!r}")
    return value


def hit_rate_target(text: str) -> float:
    """A token hit rate to reach: a fraction in (0, 1] (TRACE-1042)."""
    value = _number(text, "TRACE-1042", "the target hit rate")
    if not 0.0 < value <= 1.0:
        raise _refuse("TRACE-1042", f"the target hit rate must be a fraction in (0, 1], got {text!r}")
    return value


def milliseconds(text: str) -> float:
    """A time to reach, in milliseconds: a finite number > 0 (TRACE-1042)."""
    value = _number(text, "TRACE-1042", "the target time (ms)")
    if value <= 0:
        raise _refuse("TRACE-1042", f"the target time (ms) must be above 0, got {text!r}")
    return value


def nonnegative_milliseconds(text: str) -> float:
    """A cost of the step model, in milliseconds: a number in [0, 1e9] (TRACE-1033)."""
    from kvref.simulation.serving.model import MAX_COST_MS

    value = _number(text, "TRACE-1033", "a step cost (ms)")
    if not 0 <= value <= MAX_COST_MS:
        raise _refuse("TRACE-1033", f"a step cost (ms) must be in [0, {MAX_COST_MS:.0e}], got {text!r}")
    return value


def capacity_range(text: str) -> tuple[int, int]:
    """``LOW:HIGH``, the capacities a search covers: whole numbers with 1 <= LOW <= HIGH (TRACE-1042)."""
    low_text, colon, high_text = text.partition(":")
    if not colon:
        raise _refuse("TRACE-1042", f"a range must be LOW:HIGH in blocks, got {text!r}")
    low = _whole(low_text, "TRACE-1042", "a range's LOW")
    high = _whole(high_text, "TRACE-1042", "a range's HIGH")
    if not 1 <= low <= high:
        raise _refuse("TRACE-1042", f"a range must have 1 <= LOW <= HIGH, got {text!r}")
    return low, high


def existing_path(text: str) -> Path:
    """A file or directory to read: it must exist (CONF-912)."""
    if not text.strip():
        raise _refuse("CONF-912", "an empty path names nothing")
    path = Path(text).expanduser()
    if not path.exists():
        raise _refuse("CONF-912", f"{text} does not exist")
    return path


def existing_file(text: str) -> Path:
    """A file to read: it must exist and not be a directory (CONF-912)."""
    path = existing_path(text)
    if path.is_dir():
        raise _refuse("CONF-912", f"{text} is a directory; a file is wanted")
    return path


def toml_file(text: str) -> Path:
    """A TOML file to read (a deviations file): it must exist, be a file and parse (CONF-912)."""
    import tomllib

    path = existing_path(text)
    if not path.is_file():
        raise _refuse("CONF-912", f"{text} is not a file")
    try:
        tomllib.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _refuse("CONF-912", f"{text} is not a TOML file: {exc}") from None
    return path


def output_directory(text: str) -> Path:
    """A directory to write into: an existing writable directory, or one that can be created under
    the nearest directory above it that exists and is writable; created by the command that writes
    (a refused command line leaves nothing behind) (CONF-912)."""
    if not text.strip():
        raise _refuse("CONF-912", "an empty path names no directory")
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise _refuse("CONF-912", f"{text} is a file, not a directory")
    _writable(_nearest_existing(path), text)
    return path


def output_file(text: str) -> Path:
    """A file to write: not a directory; it, or the nearest directory above it that exists, must take
    a write (CONF-912)."""
    if not text.strip():
        raise _refuse("CONF-912", "an empty path names no file")
    path = Path(text).expanduser()
    if path.is_dir():
        raise _refuse("CONF-912", f"{text} is a directory; name a file")
    if path.exists():
        try:
            with path.open("a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise _refuse("CONF-912", f"{text} cannot be written: {exc.strerror or exc}") from None
    else:
        _writable(_nearest_existing(path.parent), text)
    return path


def results_file(text: str) -> Path:
    """A sweep's results file (TRACE-1043): writable as :func:`output_file`, and, where it exists, a
    results file already: JSON lines of finished points (a torn last line aside), never a trace or
    anything else a careless path names."""
    import json

    path = output_file(text)
    if path.exists() and path.stat().st_size:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise _refuse("CONF-912", f"{text} is not a results file (not text); name a new file") from None
        for number, line in enumerate(lines[:-1] if lines else [], 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if line.strip() and not (isinstance(record, dict) and "key" in record and "result" in record):
                raise _refuse("CONF-912", f"{text}:{number} is not a line of finished points; name a new file")
    return path


def _nearest_existing(path: Path) -> Path:
    here = path
    while not here.exists() and here != here.parent:
        here = here.parent
    return here


def _writable(directory: Path, shown: str) -> None:
    """Refuse unless a file can really be made in ``directory`` (root passes every permission test,
    and /proc or /sys take no file whatever the bits say)."""
    import tempfile

    if not directory.is_dir():
        raise _refuse("CONF-912", f"{shown}: {directory} is not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".kvref-probe-"):
            pass
    except OSError as exc:
        raise _refuse("CONF-912", f"{shown}: {directory} cannot be written: {exc.strerror or exc}") from None


def scheduler_address(text: str) -> str:
    """A Dask scheduler's address, ``[tcp://]host:port`` (TRACE-1041)."""
    rest = text.strip().partition("://")[2] or text.strip()
    host, colon, port = rest.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise _refuse("TRACE-1041", f"a scheduler address must be host:port (tcp://host:8786), got {text!r}")
    return text.strip()


def hash_algorithm(text: str) -> str:
    """A block hash function kvref knows (HASH-209)."""
    from kvref.contract.hashing import ALGORITHMS

    if text not in ALGORITHMS:
        raise _refuse("HASH-209", f"unknown hash function {text!r}; known: {', '.join(sorted(ALGORITHMS))}")
    return text


def backend_name(text: str) -> str:
    """A backend registered or at ``module:Class``, usable here (CONF-902): loaded now, so a sweep's
    workers never meet a backend that cannot load."""
    from kvref.config.registry import load_backend
    from kvref.contract.errors import KVRefError

    try:
        backend = load_backend(text)
    except KVRefError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    reason = backend.availability()
    if reason is not None:
        raise _refuse("CONF-902", f"backend {text!r} is not usable here: {reason}")
    return text


def policy_name(text: str) -> str:
    """An eviction policy as the tables print it: a hash cache's (``lru``, ``lru-leaf``, ...; EVICT-407)
    or a radix cache's, with or without its ``radix-`` prefix (``radix-lfu``, or ``lfu`` with
    ``--cache radix``; RADIX-628). ``replay`` and ``serve-replay`` take the same names."""
    from kvref.contract.policies import EvictionPolicy
    from kvref.oracle.radix.nodes import RADIX_POLICIES

    name = text.strip()
    hash_names = [p.value for p in EvictionPolicy]
    if name in hash_names or name in RADIX_POLICIES or name.removeprefix("radix-") in RADIX_POLICIES:
        return name
    radix_names = [f"radix-{p}" for p in RADIX_POLICIES]
    raise _refuse("EVICT-407", f"unknown eviction policy {text!r}; known: {', '.join(hash_names + radix_names)}")


def hash_policy_name(text: str) -> str:
    """A hash-block cache's eviction policy (EVICT-407): what ``serve-replay``'s request manager runs."""
    from kvref.contract.policies import EvictionPolicy

    name = text.strip()
    names = [p.value for p in EvictionPolicy]
    if name not in names:
        hint = " (the serving replay runs the hash-block cache)" if name.startswith("radix-") else ""
        raise _refuse("EVICT-407", f"unknown eviction policy {text!r}; known: {', '.join(names)}{hint}")
    return name


def trace_argument(text: str) -> str:
    """A trace to read: a file that exists, or a catalog name whose copy is fetched and checks out
    (TRACE-1044); the text as given, for the command to load (CONF-912)."""
    from kvref.contract.errors import KVRefError
    from kvref.simulation.catalog import catalog_trace, resolve_trace

    if not text.strip():
        raise _refuse("CONF-912", "an empty name is no trace")
    if catalog_trace(text) is not None:
        try:
            resolve_trace(text)
        except KVRefError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text
    existing_path(text)
    if Path(text).expanduser().is_dir():
        raise _refuse("CONF-912", f"{text} is a directory; name a trace file")
    return text


def snapshot_clash(snapshot: str | None, events: str | None) -> str | None:
    """Why ``--snapshot`` cannot be written with these options (PFX-327), or None: a snapshot is what
    the cache holds at the end of the event stream ``--events`` records, in a file of its own."""
    if snapshot is None:
        return None
    if events is None:
        return "give --events too"
    if Path(snapshot).resolve() == Path(events).resolve():
        return "give it a file of its own, not the --events file"
    return None
