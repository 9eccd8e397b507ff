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

An entry may carry ``versions``, a PEP 440 specifier (``versions = ">=0.5.10"``): it then applies
only to releases inside it, so that one file serves every release of an engine, a bug fixed in
one release and one brought in by another included. An entry without it applies to every release.

An entry may carry ``reached_by_chance = true`` where the test is a state machine that meets the
deviation on some draws only (its draws depend on the profile and on where the suite runs): a run
that does not meet it passes, and is not reported as a fixed bug. The bug must then also be
caught by a rule test that meets it every time, whose own entry stays strict.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

__all__ = ["DEVIATIONS", "Deviation", "load_deviations", "read_deviations"]

#: The directory of the shipped deviations files.
DEVIATIONS = Path(__file__).parent / "deviations"


@dataclass
class Deviation:
    """One known deviation of one implementation."""

    test: str
    reason: str
    link: str
    versions: SpecifierSet | None = None
    reached_by_chance: bool = False
    used: bool = False

    def applies_to(self, version: str) -> bool:
        """Whether this entry holds for release ``version`` (a pre-release or development build
        inside the range included): always without ``versions``, and for a version that is not
        PEP 440 (a build from a work tree), which no range can place."""
        if self.versions is None:
            return True
        try:
            return self.versions.contains(Version(version), prereleases=True)
        except InvalidVersion:
            return True

    def matches(self, nodeid: str) -> bool:
        """Whether ``nodeid`` is the test this entry names (with or without parameters)."""
        base = nodeid.split("[", 1)[0]
        pattern = self.test.split("[", 1)[0] if "[" not in self.test else self.test
        target = nodeid if "[" in self.test else base
        return target.endswith(pattern)

    def describe(self) -> str:
        """``test: reason (link)``."""
        return f"{self.test}: {self.reason} ({self.link})"


def read_deviations(path: Path) -> list[Deviation]:
    """Every entry of one deviations file, checked; a ``ValueError`` names the file and the entry."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    out = []
    for i, entry in enumerate(data.get("deviation", [])):
        missing = {"test", "reason", "link"} - set(entry)
        if missing:
            raise ValueError(f"{path}: deviation {i} lacks {sorted(missing)}")
        try:
            versions = SpecifierSet(str(entry["versions"])) if "versions" in entry else None
        except InvalidSpecifier:
            said = entry["versions"]
            raise ValueError(f"{path}: deviation {i}: versions {said!r} is not a PEP 440 specifier") from None
        chance = entry.get("reached_by_chance", False)
        if type(chance) is not bool:
            raise ValueError(f"{path}: deviation {i}: reached_by_chance {chance!r} is not true or false")
        out.append(Deviation(str(entry["test"]), str(entry["reason"]), str(entry["link"]), versions, chance))
    return out


def load_deviations(target_name: str, extra: str | None = None, version: str | None = None) -> list[Deviation]:
    """The shipped deviations of ``target_name`` plus those in ``extra``; with ``version``, only
    those that apply to that release (:meth:`Deviation.applies_to`)."""
    safe = target_name.replace(":", "_").replace("/", "_")
    paths = [DEVIATIONS / f"{safe}.toml"]
    if extra:
        paths.append(Path(extra))
    out: list[Deviation] = []
    for path in paths:
        if path.is_file():
            out.extend(read_deviations(path))
    return [d for d in out if version is None or d.applies_to(version)]
