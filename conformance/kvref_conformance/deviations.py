"""Known deviations: per implementation, tests expected to fail, each with a reason and a link.

A file ``deviations/<name>.toml`` inside this package (or any file given with
``--kvref-deviations``) lists entries::

    [[deviation]]
    test = "TestPrefixCache::test_removing_one_of_two_copies_emits_nothing"
    reason = "emits BlockRemoved for every evicted copy"
    link = "https://github.com/vllm-project/vllm/pull/55092"

``test`` is matched against the end of each test id (parametrization may be left out). Matching
tests become strict xfails: a deviation that stops failing fails the run, so fixed bugs are
noticed. Entries that match no test are reported.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Deviation", "load_deviations"]

_HERE = Path(__file__).parent / "deviations"


@dataclass
class Deviation:
    """One known deviation of one implementation."""

    test: str
    reason: str
    link: str
    used: bool = False

    def matches(self, nodeid: str) -> bool:
        """Whether ``nodeid`` is the test this entry names (with or without parameters)."""
        base = nodeid.split("[", 1)[0]
        pattern = self.test.split("[", 1)[0] if "[" not in self.test else self.test
        target = nodeid if "[" in self.test else base
        return target.endswith(pattern)

    def describe(self) -> str:
        """``test: reason (link)``."""
        return f"{self.test}: {self.reason} ({self.link})"


def _read(path: Path) -> list[Deviation]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    out = []
    for i, entry in enumerate(data.get("deviation", [])):
        missing = {"test", "reason", "link"} - set(entry)
        if missing:
            raise ValueError(f"{path}: deviation {i} lacks {sorted(missing)}")
        out.append(Deviation(str(entry["test"]), str(entry["reason"]), str(entry["link"])))
    return out


def load_deviations(target_name: str, extra: str | None = None) -> list[Deviation]:
    """The shipped deviations of ``target_name`` plus those in ``extra``."""
    safe = target_name.replace(":", "_").replace("/", "_")
    paths = [_HERE / f"{safe}.toml"]
    if extra:
        paths.append(Path(extra))
    out: list[Deviation] = []
    for path in paths:
        if path.is_file():
            out.extend(_read(path))
    return out
