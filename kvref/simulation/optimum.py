"""The true offline optimum of a prefix cache, as an integer program solved by HiGHS (TRACE-1060..TRACE-1063).

Belady's MIN (:mod:`kvref.simulation.belady`) evicts the block used farthest ahead; for a cache whose
hits must be prefixes it is a good policy but not known to be optimal. This module states the
offline problem exactly, under the rules of :func:`kvref.simulation.replay.replay`, and solves it:

* requests run one after another from an empty cache of ``capacity`` blocks; request ``r`` holds
  its first ``held_r = min(len(ids), capacity)`` blocks while it runs (the hit prefix and the blocks
  allocated after it), and every other block the cache keeps through ``r`` counts against what is
  left, ``capacity - held_r`` (TRACE-1061);
* a block is cached only by a request that holds it, so what can be decided is, for each block and
  each two consecutive requests holding it, whether the cache keeps it from the first to the
  second (a keep variable: keeping it part of the way gains nothing over dropping it at once);
* a request hits its ``j``-th block only if it hits the one before and the block was kept since
  its last holder (TRACE-1062); the objective is the counted requests' hits, in blocks or in tokens
  (the weights of TRACE-1012), after the warm-up's cut (TRACE-1013). The prefix rows never bind at
  the optimum (a block's ancestors are held by every request that holds it, so keeping the first
  missing ancestor instead costs no more capacity and weighs no less), but they keep each hit
  variable what it says.

Each keep variable appears in two rows of the capacity bookkeeping (what the cache keeps through
request ``r`` is what it kept through ``r - 1``, plus the keeps that start at ``r - 1``, less those
that end at ``r``), so the program has O(block references) variables and non-zeros. With the keep
variables binary its optimum is the best hit count any eviction policy reaches (TRACE-1060); with
them in [0, 1] it is the LP relaxation, an upper bound that larger windows can afford (TRACE-1063).

SciPy's ``milp`` runs HiGHS: ``pip install 'kvref[optimum]'``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kvref.contract.errors import ConfigError, InvalidValueError
from kvref.contract.validate import prefix_tree_violation
from kvref.simulation.replay import check_warmup, hit_tokens, warmup_cut
from kvref.simulation.traces import Trace, TraceError

__all__ = ["OfflineOptimum", "offline_optimum"]


@dataclass(frozen=True)
class OfflineOptimum:
    """The best hits any eviction policy reaches on a trace at ``capacity`` blocks (``exact``), or an
    upper bound on them (the LP relaxation) (TRACE-1060, TRACE-1063).

    ``hits`` are in ``unit`` (``"blocks"`` or ``"tokens"``) over the counted requests, of ``total``
    (their blocks or tokens); ``gap`` is the relative gap between the best schedule found (none for
    the relaxation: 0 hits) and ``hits`` (0 when solved to optimality).
    """

    source: str
    capacity: int
    unit: str
    exact: bool
    hits: float
    total: int
    gap: float
    variables: int
    seconds: float

    @property
    def hit_rate(self) -> float:
        """``hits / total`` (0 for an empty count)."""
        return self.hits / self.total if self.total else 0.0


def _scipy() -> Any:
    try:
        import numpy as np
        from scipy import sparse
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:
        raise ConfigError(
            "TRACE-1060", "the offline optimum needs SciPy's HiGHS: pip install 'kvref[optimum]'"
        ) from None
    return np, sparse, Bounds, LinearConstraint, milp


def offline_optimum(
    trace: Trace,
    capacity: int,
    *,
    unit: str = "blocks",
    warmup: float = 0.0,
    exact: bool = True,
    time_limit: float | None = None,
) -> OfflineOptimum:
    """The offline optimum of ``trace`` at ``capacity`` blocks under the replay's rules (see the module).

    ``unit``: maximise block hits or token hits (TRACE-1012). ``exact``: solve the integer program to
    optimality (TRACE-1060, no relative gap allowed), else its LP relaxation, an upper bound
    (TRACE-1063). ``time_limit`` (seconds, the integer program only) stops HiGHS early; the result
    then says ``exact=False`` and carries HiGHS's dual bound as ``hits`` (the relaxation's value where
    HiGHS stopped before it had one), so it is still an upper bound. Refused before any work
    (InvalidValueError): a capacity that is not a positive int, a unit other than blocks or tokens, a
    warm-up outside [0, 1), a time limit that is not positive or given for the relaxation; and
    (TraceError, TRACE-1006) a trace that is not a prefix tree.
    """
    if type(capacity) is not int or capacity < 1:
        raise InvalidValueError("TRACE-1060", f"offline_optimum: capacity must be a positive integer, got {capacity!r}")
    if unit not in ("blocks", "tokens"):
        raise InvalidValueError("TRACE-1060", f"offline_optimum: unit must be 'blocks' or 'tokens', got {unit!r}")
    first = warmup_cut(check_warmup(warmup, "offline_optimum"), len(trace.requests))
    if time_limit is not None and not exact:
        raise InvalidValueError(
            "TRACE-1063", "offline_optimum: time_limit stops the integer program; the relaxation runs to its end"
        )
    if time_limit is not None and (isinstance(time_limit, bool) or not time_limit > 0):
        raise InvalidValueError(
            "TRACE-1060", f"offline_optimum: time_limit must be positive seconds, got {time_limit!r}"
        )
    np, sparse, Bounds, LinearConstraint, milp = _scipy()
    started = time.perf_counter()

    requests = trace.requests
    count = len(requests)
    # Keep variables: one per two consecutive requests holding a block (TRACE-1061).
    keeps = 0
    starting: list[list[int]] = [[] for _ in range(count)]  # per request, the keeps whose first holder it is
    last_holder: dict[int, int] = {}  # block -> the last request that held it
    keep_into: list[list[int]] = []  # per request, per held position: the keep variable ending there, or -1
    parent_of: dict[int, int | None] = {}
    for r, request in enumerate(requests):
        violation = prefix_tree_violation(request.block_ids, parent_of)
        if violation is not None:
            raise TraceError("TRACE-1006", f"offline_optimum: request {r}: {violation[1]}")
        held = request.block_ids[:capacity]
        into = []
        for h in held:
            before = last_holder.get(h)
            if before is None:
                into.append(-1)
            else:
                into.append(keeps)
                starting[before].append(keeps)
                keeps += 1
            last_holder[h] = r
        keep_into.append(into)

    # Hit variables: one per held position of a counted request, in prefix order (TRACE-1062).
    hit_keep: list[int] = []
    hit_weight: list[float] = []
    hit_prev: list[int] = []  # the hit variable of the position before in the same request, or -1
    total = 0
    for r in range(first, count):
        request = requests[r]
        blocks = len(request.block_ids)
        total += blocks if unit == "blocks" else request.input_length
        previous = -1
        for j, k in enumerate(keep_into[r]):
            if k < 0:
                break  # no earlier holder: this block and every later one miss
            weight = (
                1
                if unit == "blocks"
                else hit_tokens(request.input_length, blocks, j + 1, trace.block_size)
                - (hit_tokens(request.input_length, blocks, j, trace.block_size))
            )
            hit_prev.append(previous)
            previous = len(hit_keep)
            hit_keep.append(k)
            hit_weight.append(weight)
    hits = len(hit_keep)

    if not hits:  # no counted request holds a block held before it: nothing can hit
        return OfflineOptimum(trace.source, capacity, unit, True, 0.0, total, 0.0, 0, time.perf_counter() - started)

    # Variables: keeps, hits, then what the cache keeps through each request (its occupancy beyond the held blocks).
    occ0 = keeps + hits
    n = occ0 + count
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    row = 0
    # occupancy_r - occupancy_{r-1} - (keeps starting at r - 1) + (keeps ending at r) = 0
    for r in range(count):
        rows.append(row)
        cols.append(occ0 + r)
        vals.append(1.0)
        if r:
            rows.append(row)
            cols.append(occ0 + r - 1)
            vals.append(-1.0)
            for k in starting[r - 1]:
                rows.append(row)
                cols.append(k)
                vals.append(-1.0)
        for k in (k for k in keep_into[r] if k >= 0):  # the keeps whose second holder is r
            rows.append(row)
            cols.append(k)
            vals.append(1.0)
        row += 1
    balance_rows = row
    # hit <= its keep, hit <= the hit before it
    for i, (k, p) in enumerate(zip(hit_keep, hit_prev, strict=True)):
        rows += [row, row]
        cols += [keeps + i, k]
        vals += [1.0, -1.0]
        row += 1
        if p >= 0:
            rows += [row, row]
            cols += [keeps + i, keeps + p]
            vals += [1.0, -1.0]
            row += 1
    matrix = sparse.csr_array((vals, (rows, cols)), shape=(row, n))
    lower = np.zeros(row)  # the balance rows are equalities, the hit rows at most 0
    lower[balance_rows:] = -np.inf
    upper = np.zeros(row)
    room = [capacity - min(len(r.block_ids), capacity) for r in requests]
    variable_upper = np.concatenate([np.ones(keeps + hits), np.asarray(room, dtype=float)])
    objective = np.concatenate([np.zeros(keeps), -np.asarray(hit_weight, dtype=float), np.zeros(count)])
    integrality = np.concatenate([np.full(keeps, 1 if exact else 0), np.zeros(hits + count)])
    constraints = LinearConstraint(matrix, lower, upper)
    bounds = Bounds(np.zeros(n), variable_upper)
    options: dict[str, Any] = {"disp": False}
    if exact:
        options["mip_rel_gap"] = 0.0  # HiGHS stops at a relative gap of 1e-4 unless told otherwise
        if time_limit is not None:
            options["time_limit"] = float(time_limit)
    result = milp(objective, constraints=constraints, integrality=integrality, bounds=bounds, options=options)
    dual = getattr(result, "mip_dual_bound", None)
    if exact and result.status == 0:  # the integer program solved to optimality (TRACE-1060)
        solved, best, bound = True, -result.fun + 0.0, -result.fun + 0.0
    elif exact and result.x is not None and dual is not None and np.isfinite(dual):  # stopped: HiGHS's bound
        solved, best, bound = False, -result.fun + 0.0, -dual + 0.0
    else:  # the relaxation, asked for or in place of a program stopped with no bound (TRACE-1063)
        if exact:
            result = milp(objective, constraints=constraints, integrality=np.zeros(n), bounds=bounds)
        if result.x is None:
            raise ConfigError("TRACE-1060", f"offline_optimum: HiGHS solved nothing: {result.message}")
        solved, best, bound = False, 0.0, -result.fun + 0.0
    gap = (bound - best) / bound if bound > 0 else 0.0
    return OfflineOptimum(
        source=trace.source,
        capacity=capacity,
        unit=unit,
        exact=solved,
        hits=bound,
        total=total,
        gap=gap,
        variables=n,
        seconds=time.perf_counter() - started,
    )
