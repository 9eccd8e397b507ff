"""The capacity search as a researcher runs it: only what it needs, resumable, and honest about failure
(TRACE-1042, TRACE-1048, TRACE-1049).

``kvref serve-replay --target-hit-rate`` replays the capacities its bisection probes and nothing
else (no default grid beside it); every probe goes to ``--results`` as it finishes, so a rerun
replays nothing it has; a target no capacity in the range meets exits with status 1 and says so.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from kvref.simulation.serving import runner

rule = pytest.mark.rule
cli_main = importlib.import_module("kvref.cli.main")


@pytest.fixture
def replays(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The capacities replayed in this process, as they run."""
    done: list[int] = []
    run_point = runner.run_point

    def counted(point: Any, **kwargs: Any) -> Any:
        done.append(point.capacity)
        return run_point(point, **kwargs)

    monkeypatch.setattr(runner, "run_point", counted)
    monkeypatch.setattr("kvref.simulation.serving.sweep.run_point", counted)
    return done


SEARCH = ["serve-replay", "--workers", "1", "--policy", "lru", "--target-hit-rate", "0.5", "--json"]


@rule("TRACE-1042", "TRACE-1049")
def test_the_search_replays_only_its_probes_and_a_rerun_replays_none(
    tmp_path: Path, replays: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "probes.jsonl"
    assert cli_main.main([*SEARCH, "--results", str(results)]) == 0
    out, err = capsys.readouterr()
    first = json.loads(out)
    probed = sorted(replays)
    assert err.count("sizing: ") == len(probed), f"each probe is said on stderr, in a log too:\n{err}"
    assert probed == sorted(r["capacity"] for r in first["results"]), "the search replayed more than its probes"
    assert len(results.read_text().splitlines()) == len(probed), "not every probe was written to --results"
    replays.clear()
    assert cli_main.main([*SEARCH, "--results", str(results)]) == 0
    out, err = capsys.readouterr()
    again = json.loads(out)
    assert replays == [], f"the rerun replayed {replays} though --results holds every probe"
    assert f"{len(probed)} of {len(probed)} probes read back from" in err, err
    assert again["sizing"] == first["sizing"], "the resumed search found another capacity"


@rule("TRACE-1048")
def test_a_target_out_of_reach_exits_1_saying_the_best_the_range_gives(
    replays: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    status = cli_main.main(["serve-replay", "--workers", "1", "--policy", "lru", "--target-hit-rate", "0.999"])
    err = capsys.readouterr().err
    assert status == 1, f"a search that found nothing exited {status}"
    assert "no capacity in [" in err and "meets token hit rate >= 0.999" in err and "at " in err, err
    assert len(replays) == 1, f"a search whose top misses replayed {replays}: the top alone decides"


@rule("TRACE-1042", "CONF-912")
def test_a_range_above_what_the_workload_fills_is_searched_up_to_that_size(
    replays: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--range 1:10**20`` once built a pool of 10**20 blocks in a worker (OverflowError)."""
    status = cli_main.main([*SEARCH, "--range", f"1:{10**20}"])
    err = capsys.readouterr().err
    assert status == 0 and "more than the workload can fill" in err, err
    assert max(replays) < 10**6, f"the search replayed {max(replays):,} blocks"
