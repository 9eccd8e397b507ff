"""Sweeps: a grid of serving replays as independent tasks, locally or on a Dask cluster (TRACE-1041, TRACE-1043).

Each point of the grid (workload x policy x capacity x block size) is a :class:`ServingPoint`
run by :func:`run_point` in a worker: on a ``concurrent.futures`` process pool by default (every
core), in this process with ``workers=1``, or on a Dask cluster given its scheduler's address
(``dask[distributed]``, the ``sweep`` extra). A point's counts do not depend on where it ran.
Every finished point is appended to the results file at once, one JSON line keyed by its
parameters, so an interrupted or failed sweep keeps what it finished and a rerun replays only
the rest (TRACE-1049).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from kvref.contract.errors import BackendUnavailableError, KVRefError
from kvref.simulation.serving.results import ServingResult
from kvref.simulation.serving.runner import ServingPoint, run_point

__all__ = ["SweepError", "WorkerDied", "describe_error", "grid", "read_results", "run_sweep"]


class SweepError(KVRefError, RuntimeError):
    """Some points of a sweep failed; the others were written (TRACE-1043)."""


def grid(
    workloads: Sequence[Any], policies: Sequence[str], capacities: Sequence[int], **common: Any
) -> list[ServingPoint]:
    """Every (workload, policy, capacity) point with the same ``common`` settings, in that order.

    Sweep block sizes by passing one :class:`~kvref.simulation.serving.runner.WorkloadSpec` per
    block size (on token-level workloads; a trace's block size is its own).
    """
    return [ServingPoint(w, c, p, **common) for w in workloads for p in policies for c in capacities]


def read_results(path: Path) -> dict[str, ServingResult]:
    """The points a results file holds, by key; a torn last line (an interrupted write) is ignored."""
    found: dict[str, ServingResult] = {}
    if not path.exists():
        return found
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            try:
                record = json.loads(line)
                found[record["key"]] = ServingResult.from_json(record["result"])
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return found


def _end_torn_line(path: Path) -> None:
    """End an interrupted write's torn last line, so the next record starts a line of its own (TRACE-1043)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb") as fh:
        fh.seek(-1, os.SEEK_END)
        torn = fh.read(1) != b"\n"
    if torn:
        with path.open("a", encoding="utf-8") as fh:
            fh.write("\n")


def _append(path: Path, point: ServingPoint, result: ServingResult) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"key": point.key(), "result": result.to_json()}) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


Outcome = tuple[ServingPoint, ServingResult | BaseException]


def _sequential(points: Sequence[ServingPoint], requests: Callable[[int, int], None] | None) -> Iterator[Outcome]:
    for point in points:
        try:
            yield point, run_point(point, progress=requests)
        except Exception as exc:  # a failed point is reported, the others go on
            yield point, exc


def _leave_interrupts_to_the_parent() -> None:
    """A worker ignores Ctrl-C: the parent stops the sweep and ends its workers itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class WorkerDied(RuntimeError):
    """The process that ran a point ended without an answer (killed, out of memory, or exited)."""


def _pooled(points: Sequence[ServingPoint], workers: int) -> Iterator[Outcome]:
    """The points over a pool of ``workers`` processes. A worker that dies breaks the whole pool, so
    the points it left without an answer run again, each alone in a process of its own: the one
    that killed its worker is reported with how it ended, and the others finish."""
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_leave_interrupts_to_the_parent)
    unanswered: list[ServingPoint] = []
    try:
        futures = {pool.submit(run_point, p): p for p in points}
        for future in as_completed(futures):
            outcome = _outcome(future)
            if isinstance(outcome, BrokenProcessPool):
                unanswered.append(futures[future])
            else:
                yield futures[future], outcome
        pool.shutdown(wait=True)
        for point in unanswered:
            yield point, _alone(point)
    except BaseException:  # Ctrl-C, or the caller stopped: no point waits, no worker is left running
        for child in multiprocessing.active_children():
            child.terminate()
        for child in multiprocessing.active_children():
            child.join(timeout=5)
        # The pool's own thread sees its workers gone and ends; waiting for it here leaves nothing for
        # the interpreter's exit to wake (waking a thread that is closing its pipe raises at exit).
        pool.shutdown(wait=True, cancel_futures=True)
        raise


def _run_and_send(point: ServingPoint, sender: Any) -> None:
    _leave_interrupts_to_the_parent()
    try:
        outcome: ServingResult | BaseException = run_point(point)
    except Exception as exc:
        outcome = exc
    sender.send(outcome)
    sender.close()


def _alone(point: ServingPoint) -> ServingResult | BaseException:
    """Run ``point`` in a process of its own: its result, the error it raised, or how its process ended."""
    context = multiprocessing.get_context()
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_run_and_send, args=(point, sender), daemon=True)
    process.start()
    sender.close()
    try:
        outcome: ServingResult | BaseException | None = receiver.recv()
    except EOFError:  # the process ended without sending
        outcome = None
    process.join()
    if outcome is None:
        code = process.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"
        outcome = WorkerDied(f"the worker process running it {how} before it answered")
    return outcome


def describe_error(error: BaseException) -> str:
    """An error as one phrase: its message, or what it means where it carries none (a MemoryError)."""
    if isinstance(error, MemoryError):
        return f"ran out of memory{f' ({error})' if str(error) else ''}"
    if isinstance(error, WorkerDied):
        return str(error)
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _dask(points: Sequence[ServingPoint], address: str) -> Iterator[Outcome]:
    try:
        from distributed import Client
        from distributed import as_completed as dask_completed
    except ImportError:
        raise BackendUnavailableError(
            "TRACE-1041", "a sweep on a Dask cluster needs dask[distributed]: pip install 'kvref[sweep]'"
        ) from None
    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError) as exc:
        raise BackendUnavailableError(
            "TRACE-1041", f"no Dask scheduler answers at {address} ({type(exc).__name__}: {exc})"
        ) from None
    with client:
        futures = {client.submit(run_point, p, pure=False): p for p in points}
        for future in dask_completed(list(futures)):
            try:
                outcome: ServingResult | BaseException = future.result()
            except Exception as exc:  # reported with the point
                outcome = exc
            yield futures[future], outcome


def _outcome(future: Future[ServingResult]) -> ServingResult | BaseException:
    try:
        return future.result()
    except Exception as exc:  # reported with the point
        return exc


def run_sweep(
    points: Sequence[ServingPoint],
    *,
    results_file: Path | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    progress: Callable[[ServingPoint], None] | None = None,
    request_progress: Callable[[int, int], None] | None = None,
) -> list[ServingResult]:
    """Run ``points`` and return their results in the points' order (TRACE-1041, TRACE-1043, TRACE-1049).

    Points already in ``results_file`` (same parameters) are read, not replayed; each new one is
    appended as it finishes. ``workers``: processes of the local pool (default: every core; 1
    runs in this process); ``scheduler``: a Dask scheduler's address instead. ``progress(point)``
    is called as points finish; ``request_progress(done, total)`` as requests finish, where the
    points run in this process. Raises
    :class:`SweepError` naming the failed points after writing every other.
    """
    done = read_results(results_file) if results_file else {}
    todo = [p for p in points if p.key() not in done]
    if results_file:
        results_file.parent.mkdir(parents=True, exist_ok=True)
        _end_torn_line(results_file)
    if scheduler:
        outcomes = _dask(todo, scheduler)
    else:
        count = min(workers or os.cpu_count() or 1, len(todo))
        outcomes = _sequential(todo, request_progress) if count <= 1 else _pooled(todo, count)
    failed: list[tuple[str, str]] = []
    for point, outcome in outcomes:
        if isinstance(outcome, BaseException):
            failed.append((point.describe(), describe_error(outcome)))
        else:
            done[point.key()] = outcome
            if results_file:
                _append(results_file, point, outcome)
        if progress:
            progress(point)
    if failed:
        raise SweepError("TRACE-1043", _failures(failed, len(todo)))
    return [done[p.key()] for p in points]


def _failures(failed: list[tuple[str, str]], tried: int) -> str:
    """Each distinct error once, with the points it stopped (the first few named)."""
    by_error = Counter(error for _, error in failed)
    parts = []
    for error, times in by_error.most_common():
        points = [point for point, e in failed if e == error]
        named = ", ".join(points[:3]) + (f" and {times - 3} more" if times > 3 else "")
        parts.append(f"{error} ({named})")
    return f"{len(failed)} of {tried} points failed: " + "; ".join(parts)
