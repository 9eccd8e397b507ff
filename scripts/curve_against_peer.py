"""The exact lru curve (TRACE-1023) against a peer's real cache: a replay through the peer at three
capacities of each built-in workload must count what the curve says.

Run where the peer is installed (``nox -s peer-vllm`` runs it)::

    python scripts/curve_against_peer.py --backend vllm

Exits 1, naming the workload and capacity, where the peer counts otherwise.
"""

from __future__ import annotations

import argparse
import sys

from kvref.config.registry import create_pool
from kvref.simulation.curves import lru_curve
from kvref.simulation.replay import replay
from kvref.simulation.workloads import WORKLOADS, workload_trace


def main(argv: list[str] | None = None) -> int:
    """Replay each built-in workload through ``--backend`` at its curve's first, middle and last capacity."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backend", required=True, help="a registered backend with an lru prefix cache")
    args = parser.parse_args(argv)
    disagree = 0
    for workload in sorted(WORKLOADS):
        trace = workload_trace(workload, seed=0)
        curve = lru_curve(trace)
        for capacity in (curve.smallest, (curve.smallest + curve.largest) // 2, curve.largest):
            replayed = replay(trace, create_pool(capacity + 1, backend=args.backend, policy="lru"))
            counted, expected = (replayed.block_hits, replayed.token_hits), curve.at(capacity)
            same = counted == expected
            disagree += not same
            print(
                f"{workload:>13} at {capacity:>6,} blocks: {args.backend} {counted}, curve {expected}, "
                + ("agree" if same else "DISAGREE")
            )
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
