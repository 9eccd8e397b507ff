"""The pytest plugin of the conformance suite (entry point ``pytest11: kvref_conformance``).

Light on purpose: it imports neither torch nor cupy; a backend is imported only when selected.
It adds ``--kvref-backend NAME`` (a registered name or ``module:Class``), ``--kvref-device``,
``--kvref-profile``, ``--kvref-results DIR`` and ``--kvref-deviations FILE``; prints the report
header (backend, version, device, capabilities, Hypothesis profile, every ``KVREF_*`` variable);
applies known deviations as strict xfails; skips dependents of a failed prerequisite rule;
reports state-machine steps per second; and writes one results file per implementation.
A backend that cannot load stops the run with the reason: nothing falls back to the oracle.

Under pytest-xdist (``-n N``) each test's rules, outcome and state-machine steps travel on its
report to the controlling process, which writes the same results file a plain run writes; only
the skipping of dependents is per worker (a worker skips what depends on a rule it saw fail).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, cast

import pytest

from kvref_conformance.deviations import Deviation, load_deviations
from kvref_conformance.profiles import (
    SHRINK_SECONDS,
    register_profiles,
    selected_profile,
    shrink_stop_said,
    shrink_within,
)
from kvref_conformance.results import ResultsRecorder, describe
from kvref_conformance.session import FAILED_RULES, PROFILE, TARGET_KEY, failed_rules
from kvref_conformance.suites.base import ConformanceSuite
from kvref_conformance.target import Target

__all__ = ["kvref_target", "selected_target"]

_SELECTED = pytest.StashKey[Target | None]()
_RECORDER = pytest.StashKey[ResultsRecorder]()
_DEVIATIONS = pytest.StashKey[dict[str, list[Deviation]]]()
_RESULT_PROPERTY = "kvref_conformance"
_STEPS_SEEN = pytest.StashKey[dict[str, tuple[int, float]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvref", "kvref conformance suite")
    group.addoption("--kvref-backend", default=None, help="implementation to test: a registered name or module:Class")
    group.addoption("--kvref-device", default=None, help="device for the backend (cpu, cuda:0, host)")
    group.addoption("--kvref-profile", default=None, help="Hypothesis profile: ci, dev or deep")
    group.addoption("--kvref-results", default=None, help="directory for results files (default results/conformance)")
    group.addoption("--kvref-deviations", default=None, help="extra known-deviations TOML file")
    group.addoption(
        "--kvref-verdicts",
        default=None,
        help="also write each implementation's verdict per rule to this directory (<name>-<device>@<version>.json)",
    )
    group.addoption(
        "--kvref-without",
        default=None,
        help="comma-separated capabilities to withdraw from the target, to run the rest past a known deviation",
    )
    group.addoption(
        "--kvref-no-shrink",
        action="store_true",
        help="skip Hypothesis's shrink phase: detection only, no minimal replay (the meta-tests use it)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "rule(*ids): the spec rule ids a test checks")
    config.addinivalue_line("markers", "kvref_requires(*capabilities): skip unless the target declares them")
    config.addinivalue_line("markers", "kvref_corner: a corner of its rules; its failure skips no dependent")
    register_profiles()
    from hypothesis import settings

    try:
        profile = selected_profile(config.getoption("kvref_profile"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    settings.load_profile(profile)
    shrink_within(profile)
    if config.getoption("kvref_no_shrink"):
        from hypothesis import Phase

        settings.register_profile(
            f"{profile}-no-shrink", settings.get_profile(profile), phases=[p for p in Phase if p is not Phase.shrink]
        )
        settings.load_profile(f"{profile}-no-shrink")
        profile = f"{profile}-no-shrink"
    config.stash[FAILED_RULES] = {}
    config.stash[PROFILE] = profile
    config.stash[_SELECTED] = None
    if config.getoption("kvref_backend") is not None or any("kvref_conformance" in str(a) for a in config.args):
        selected_target(config)
    results_dir = Path(config.getoption("kvref_results") or "results/conformance")
    config.stash[_RECORDER] = ResultsRecorder(results_dir, profile)
    config.stash[_DEVIATIONS] = {}
    config.pluginmanager.register(_ReportCollector(config), "kvref_conformance_reports")


def _resolve(name: str, device: str | None) -> Target:
    from kvref.contract.errors import KVRefError

    try:
        return Target.from_backend(name, device=device)
    except KVRefError as exc:
        raise pytest.UsageError(f"kvref conformance: cannot load backend {name!r}: {exc}") from None


def selected_target(config: pytest.Config) -> Target:
    """The implementation selected by ``--kvref-backend``, else by the kvref settings (CONF-903)."""
    selected = config.stash.get(_SELECTED, None)
    if selected is None:
        from kvref.config.settings import load_settings
        from kvref.contract.errors import KVRefError

        try:
            settings = load_settings({"backend": config.getoption("kvref_backend")})
        except KVRefError as exc:
            raise pytest.UsageError(f"kvref conformance: {exc}") from None
        selected = _resolve(settings.backend, config.getoption("kvref_device") or settings.device)
        withdrawn = config.getoption("kvref_without")
        if withdrawn:
            try:
                selected = selected.without(c.strip() for c in withdrawn.split(",") if c.strip())
            except ValueError as exc:
                raise pytest.UsageError(f"kvref conformance: --kvref-without: {exc}") from None
        config.stash[_SELECTED] = selected
    return selected


@pytest.fixture(scope="session")
def kvref_target(request: pytest.FixtureRequest) -> Target:
    """The implementation under test for suite classes that do not name their own target."""
    return selected_target(request.config)


def pytest_report_header(config: pytest.Config) -> list[str]:
    selected = config.stash.get(_SELECTED, None)
    lines = []
    if selected is not None:
        caps = ", ".join(sorted(selected.capabilities)) or "none"
        lines.append(
            f"kvref conformance: backend {selected.name} {selected.version}, device {selected.device}, "
            f"profile {selected.profile}"
        )
        lines.append(f"kvref capabilities: {caps}")
    lines.append(f"kvref Hypothesis profile: {config.stash.get(PROFILE, 'not loaded')}")
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("KVREF_")}
    lines.append("kvref environment: " + (", ".join(f"{k}={v}" for k, v in env.items()) or "no KVREF_* variables"))
    return lines


def _item_target(item: pytest.Item) -> Target | None:
    cls = getattr(item, "cls", None)
    own = getattr(cls, "target", None) if cls is not None else None
    if isinstance(own, Target):
        return own
    if cls is not None and issubclass(cls, ConformanceSuite):
        return selected_target(item.config)
    return None


def _deviations_for(config: pytest.Config, target: Target) -> list[Deviation]:
    known = config.stash[_DEVIATIONS]
    if target.name not in known:
        known[target.name] = load_deviations(target.name, config.getoption("kvref_deviations"), target.version)
    return known[target.name]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        target = _item_target(item)
        if target is None:
            continue
        for deviation in _deviations_for(config, target):
            if deviation.matches(item.nodeid):
                deviation.used = True
                strict = not deviation.reached_by_chance
                item.add_marker(pytest.mark.xfail(reason=f"known deviation: {deviation.describe()}", strict=strict))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    target = item.stash.get(TARGET_KEY, None)
    if target is None:
        return
    rules = [r for m in item.iter_markers("rule") for r in m.args]
    if report.failed:  # a failing setup or call: the rule cannot be relied on by its dependents
        if item.get_closest_marker("kvref_corner") is None:  # unless only a corner no dependent reaches broke
            failed_rules(item.config, target.name).update(rules)
        profile = item.config.stash[PROFILE]
        report.sections = [(title, shrink_stop_said(text, profile)) for title, text in report.sections]
    # On the report, so that it travels from a pytest-xdist worker to the process that writes the results.
    result = {"implementation": describe(target), "rules": rules, "steps": _new_steps(item.config)}
    report.user_properties.append((_RESULT_PROPERTY, result))


def _new_steps(config: pytest.Config) -> dict[str, list[float]]:
    """State-machine steps and seconds run in this process since the last report: ``{machine: [steps, s]}``."""
    from kvref_conformance.machines import STEP_COUNTS, STEP_SECONDS

    seen = config.stash.setdefault(_STEPS_SEEN, {})
    new = {}
    for name, steps in STEP_COUNTS.items():
        before = seen.get(name, (0, 0.0))
        if steps != before[0]:
            new[name] = [steps - before[0], STEP_SECONDS.get(name, 0.0) - before[1]]
            seen[name] = (steps, STEP_SECONDS.get(name, 0.0))
    return new


class _ReportCollector:
    """Records each conformance test's reports: in a plain run, and in the controlling process under pytest-xdist."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for key, found in report.user_properties:
            if key != _RESULT_PROPERTY:
                continue
            value = cast(dict[str, Any], found)  # what pytest_runtest_makereport attached
            recorder = self.config.stash[_RECORDER]
            recorder.record(value["implementation"], report.nodeid, value["rules"], report)
            for name, (steps, seconds) in value["steps"].items():
                recorder.add_steps(name, int(steps), seconds)
            for deviation in self.config.stash[_DEVIATIONS].get(value["implementation"]["name"], []):
                deviation.used = deviation.used or deviation.matches(report.nodeid)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    recorder = config.stash.get(_RECORDER, None)
    if recorder is None or not recorder.targets or hasattr(config, "workerinput"):
        return  # a pytest-xdist worker: the controlling process writes the results
    tr = terminalreporter
    tr.section("kvref conformance")
    for name, machine in sorted(recorder.steps.items()):
        steps, seconds, rate = machine["steps"], machine["seconds"], machine["steps_per_second"]
        tr.write_line(f"state machine {name}: {steps} steps in {seconds:.1f} s, {rate:,.0f} steps/s")
    for target_name, deviations in config.stash[_DEVIATIONS].items():
        for deviation in deviations:
            if not deviation.used:
                tr.write_line(f"known deviation of {target_name} matches no test: {deviation.describe()}")
                recorder.unmatched.setdefault(target_name, []).append(deviation.describe())
    for path in recorder.write(time.time()):
        tr.write_line(f"results written to {path}")
    verdicts = config.getoption("kvref_verdicts")
    if verdicts:
        from kvref_conformance.verdicts import verdict_document, write_verdicts

        found = recorder.targets.values()
        documents = [verdict_document(t.implementation, t.tests, recorder.hypothesis_profile) for t in found]
        for path in write_verdicts(Path(verdicts), documents):
            tr.write_line(f"verdicts written to {path}")
    profile = config.stash[PROFILE]
    if exitstatus and not profile.endswith("-no-shrink"):
        tr.write_line(
            f"each failure's replay was shrunk for at most {SHRINK_SECONDS[profile]} s (profile {profile}); "
            "Hypothesis says so where it stopped early, and --profile deep shrinks for up to five minutes"
        )
