"""How big must the cache be: the smallest capacity that meets a target, by bisection (TRACE-1042, TRACE-1048).

The measure is the token hit rate (a target is met at or above it) or the p90 time to first
token (met at or below it). Bisection assumes the measure is monotone in capacity, which holds
for a sequential LRU replay and nearly always for a serving one; every capacity replayed is kept,
so the report prints the curve the answer came from, and the answer's neighbour below is always
among them (it fails the target, or is below the range).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvref.contract.errors import InvalidValueError
from kvref.simulation.serving.results import ServingResult

__all__ = ["MEASURES", "SizingAnswer", "size_cache"]

#: What a target may be set on: the name, how to read it off a result, whether higher is better.
MEASURES: dict[str, tuple[Callable[[ServingResult], float], bool]] = {
    "token hit rate": (lambda r: r.token_hit_rate, True),
    "p90 TTFT (ms)": (lambda r: r.ttft_ms.p90, False),
}


@dataclass(frozen=True)
class SizingAnswer:
    """The smallest capacity meeting ``target`` on ``measure`` in ``[low, high]``, or None (TRACE-1048).

    ``tried`` holds every replay made, by capacity.
    """

    measure: str
    target: float
    low: int
    high: int
    capacity: int | None
    tried: tuple[ServingResult, ...]

    def value(self, result: ServingResult) -> float:
        """The measure of one replay."""
        return MEASURES[self.measure][0](result)

    def shown(self, result: ServingResult) -> str:
        """The measure of one replay, whole: a percentage or milliseconds."""
        value = self.value(result)
        return f"{value:.2%}" if MEASURES[self.measure][1] else f"{value:,.1f} ms"

    def meets(self, result: ServingResult) -> bool:
        """Whether one replay meets the target."""
        higher_better = MEASURES[self.measure][1]
        value = self.value(result)
        return value >= self.target if higher_better else value <= self.target

    def sentence(self) -> str:
        """The answer in words."""
        if self.capacity is None:
            top = max(self.tried, key=lambda r: r.capacity)
            return (
                f"no capacity in [{self.low:,}, {self.high:,}] blocks meets {self.measure} "
                f"{'>=' if MEASURES[self.measure][1] else '<='} {self.target:g}: at {self.high:,} blocks it is "
                f"{self.shown(top)}"
            )
        return (
            f"the smallest capacity meeting {self.measure} {'>=' if MEASURES[self.measure][1] else '<='} "
            f"{self.target:g} is {self.capacity:,} blocks (bisection over [{self.low:,}, {self.high:,}], "
            f"{len(self.tried)} replays)"
        )


def size_cache(
    replay_at: Callable[[int], ServingResult], *, measure: str, target: float, low: int, high: int
) -> SizingAnswer:
    """Bisect ``[low, high]`` for the smallest capacity whose replay meets ``target`` (TRACE-1042).

    ``replay_at(capacity)`` replays at one capacity. The top is replayed first; if it fails, the
    answer is None (TRACE-1048). Otherwise the loop keeps a failing capacity below a meeting one
    until they are neighbours, so the answer's neighbour below was replayed too.
    """
    if measure not in MEASURES:
        raise InvalidValueError("TRACE-1042", f"measure must be one of {list(MEASURES)}, got {measure!r}")
    if type(low) is not int or type(high) is not int or not 1 <= low <= high:
        raise InvalidValueError("TRACE-1042", f"the range must be integers 1 <= low <= high, got [{low}, {high}]")
    tried: dict[int, ServingResult] = {}

    def at(capacity: int) -> ServingResult:
        if capacity not in tried:
            tried[capacity] = replay_at(capacity)
        return tried[capacity]

    def answer(capacity: int | None) -> SizingAnswer:
        return SizingAnswer(measure, target, low, high, capacity, tuple(tried[c] for c in sorted(tried)))

    probe = SizingAnswer(measure, target, low, high, None, ())
    if not probe.meets(at(high)):
        return answer(None)
    if probe.meets(at(low)):
        return answer(low)
    failing, meeting = low, high
    while meeting - failing > 1:
        middle = (failing + meeting) // 2
        if probe.meets(at(middle)):
            meeting = middle
        else:
            failing = middle
    return answer(meeting)
