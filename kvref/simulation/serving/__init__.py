"""Serving replay (spec chapter 10, TRACE-1030..TRACE-1045): requests overlapping in time through one
request manager, the step model they run under, what they measure, cache sizing and sweeps.
"""

from kvref.simulation.serving.model import PREEMPTION_MODES, StepModel
from kvref.simulation.serving.results import Percentiles, ServingResult
from kvref.simulation.serving.scheduler import ServingReplay
from kvref.simulation.serving.workload import (
    SERVING_WORKLOADS,
    ServedRequest,
    ServingWorkload,
    serving_workload,
    workload_from_trace,
)

__all__ = [
    "PREEMPTION_MODES",
    "SERVING_WORKLOADS",
    "Percentiles",
    "ServedRequest",
    "ServingReplay",
    "ServingResult",
    "ServingWorkload",
    "StepModel",
    "serving_workload",
    "workload_from_trace",
]
