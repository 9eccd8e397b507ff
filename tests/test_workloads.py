"""Generated workloads: seeded, shaped as documented, and what a replay makes of them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvref.oracle import OracleBlockPool
from kvref.simulation.replay import replay
from kvref.simulation.workloads import WORKLOADS, agent_loops, few_shot, workload_trace

rule = pytest.mark.rule


@rule("TRACE-1005")
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_a_workload_is_a_pure_function_of_its_seed(name: str) -> None:
    make = WORKLOADS[name]
    assert make(seed=3, block_size=16) == make(seed=3, block_size=16)
    assert make(seed=3, block_size=16) != make(seed=4, block_size=16)
    code = (
        "import hashlib; from kvref.simulation.workloads import WORKLOADS; "
        f"print(hashlib.sha256(repr(WORKLOADS[{name!r}](seed=3, block_size=16)).encode()).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", code], env={"PYTHONHASHSEED": s}, capture_output=True, text=True, check=True
        ).stdout
        for s in ("0", "1")
    }
    assert len(digests) == 1, f"workload {name} differs between processes"


@rule("TRACE-1005")
def test_an_agent_step_extends_the_previous_step_of_the_same_agent() -> None:
    prompts = agent_loops(seed=0, agents=3, steps=4)
    for i in range(3, len(prompts)):
        previous = prompts[i - 3]
        assert prompts[i][: len(previous)] == previous, "an agent re-sends its whole transcript"


@rule("TRACE-1016")
@pytest.mark.parametrize(
    ("name", "shares"),
    [("chat", True), ("system-prompt", True), ("agent", True), ("few-shot", True), ("unique", False)],
)
def test_only_workloads_that_share_prefixes_get_hits(name: str, shares: bool) -> None:
    trace = workload_trace(name)
    result = replay(trace, OracleBlockPool(100_001))
    assert (result.infinite_block_hits > 0) == shares
    assert result.block_hits == result.infinite_block_hits, "a cache larger than the workload never evicts"


@rule("TRACE-1005")
def test_few_shot_questions_share_their_task_examples() -> None:
    prompts = few_shot(seed=0, tasks=2, questions=5, block_size=16)
    heads = {tuple(p[:16]) for p in prompts}
    assert len(heads) == 2, "every prompt starts with one of the two tasks' examples"
