"""Settings: which backend, and its options, from argument, environment, file or default (CONF-9xx).

Each option is resolved on its own, first source wins (CONF-903):

1. an explicit argument (``--backend`` on the command line, a keyword in code);
2. the environment: ``KVREF_BACKEND``, ``KVREF_DEVICE``, ``KVREF_POLICY``, ``KVREF_HASH``,
   ``KVREF_BLOCK_SIZE``, ``KVREF_EVENTS``;
3. ``kvref.toml`` in the working directory (top-level keys);
4. ``[tool.kvref]`` in ``pyproject.toml`` in the working directory;
5. the default (backend ``oracle``).

Every value is validated where it is read; a bad one raises :class:`~kvref.contract.errors.ConfigError`
naming the key, the value and the source (CONF-904). Unknown keys in a file are errors too
(CONF-905), so a typo never silently does nothing.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvref.contract.errors import ConfigError, KVRefError

__all__ = ["OPTIONS", "Option", "Settings", "load_settings"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*(:[A-Za-z_][A-Za-z0-9_.]*)?$")


def _backend(value: object) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError("a backend name such as 'oracle', 'torch' or 'package.module:Class'")
    return value


def _device(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not re.match(r"^(host|cpu|cuda(:\d+)?)$", value):
        raise ValueError("'host', 'cpu', 'cuda' or 'cuda:N'")
    return value


def _policy(value: object) -> str:
    from kvref.contract.policies import as_policy

    try:
        return as_policy(value).value
    except KVRefError:
        raise ValueError("one of lru, lru-leaf, ref-zero, fifo, lru-leaf-access") from None


def _hash(value: object) -> str:
    from kvref.contract.hashing import ALGORITHMS

    if not isinstance(value, str) or value not in ALGORITHMS:
        raise ValueError(f"one of {', '.join(sorted(ALGORITHMS))}")
    return str(value)


def _block_size(value: object) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("a positive integer")
    return value


def _flag(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value.lower() in ("1", "true", "yes", "on")
    raise ValueError("true or false")


@dataclass(frozen=True)
class Option:
    """One setting: its key in files, its environment variable, default and validator."""

    key: str
    env: str
    default: Any
    parse: Callable[[object], Any]
    help: str


OPTIONS: dict[str, Option] = {
    o.key: o
    for o in (
        Option("backend", "KVREF_BACKEND", "oracle", _backend, "implementation to run"),
        Option("device", "KVREF_DEVICE", None, _device, "device for device backends"),
        Option("policy", "KVREF_POLICY", "lru", _policy, "eviction policy"),
        Option("hash", "KVREF_HASH", "sha256", _hash, "block hash function"),
        Option("block-size", "KVREF_BLOCK_SIZE", 16, _block_size, "tokens per block"),
        Option("events", "KVREF_EVENTS", False, _flag, "report KV events"),
    )
}


@dataclass(frozen=True)
class Settings:
    """Resolved settings, with the source each value came from (for reports and errors)."""

    backend: str = "oracle"
    device: str | None = None
    policy: str = "lru"
    hash: str = "sha256"
    block_size: int = 16
    events: bool = False
    sources: Mapping[str, str] = field(default_factory=dict)

    def get(self, key: str) -> Any:
        """The value of option ``key`` (file spelling, e.g. ``block-size``)."""
        return getattr(self, key.replace("-", "_"))


def _parse(option: Option, value: object, source: str) -> Any:
    try:
        return option.parse(value)
    except (ValueError, TypeError) as exc:
        raise ConfigError("CONF-904", f"{source}: {option.key} = {value!r} is invalid; expected {exc}") from None


def _read_table(path: Path, table: str | None) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("CONF-904", f"{path}: not valid TOML: {exc}") from None
    if table is not None:
        tool = data.get("tool", {})
        data = tool.get(table, {}) if isinstance(tool, dict) else {}
    if not isinstance(data, dict):
        raise ConfigError("CONF-905", f"{path}: [tool.kvref] must be a table")
    unknown = sorted(set(data) - set(OPTIONS))
    if unknown:
        raise ConfigError("CONF-905", f"{path}: unknown key(s) {unknown}; known: {sorted(OPTIONS)}")
    return data


def load_settings(
    explicit: Mapping[str, object] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Settings:
    """Resolve every option by the precedence in the module docstring (CONF-903)."""
    explicit = {k.replace("_", "-"): v for k, v in (explicit or {}).items() if v is not None}
    unknown = sorted(set(explicit) - set(OPTIONS))
    if unknown:
        raise ConfigError("CONF-905", f"unknown setting(s) {unknown}; known: {sorted(OPTIONS)}")
    env = os.environ if environ is None else environ
    where = Path.cwd() if cwd is None else cwd
    layers: list[tuple[str, Mapping[str, object]]] = [("argument", explicit)]
    layers.append(("environment", {k: env[o.env] for k, o in OPTIONS.items() if o.env in env}))
    for path, table in ((where / "kvref.toml", None), (where / "pyproject.toml", "kvref")):
        if path.is_file():
            label = str(path) if table is None else f"{path} [tool.kvref]"
            layers.append((label, _read_table(path, table)))
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, option in OPTIONS.items():
        for label, layer in layers:
            if key in layer:
                source = f"{option.env}" if label == "environment" else label
                values[key.replace("-", "_")] = _parse(option, layer[key], source)
                sources[key] = source
                break
        else:
            values[key.replace("-", "_")] = option.default
            sources[key] = "default"
    return Settings(**values, sources=sources)
