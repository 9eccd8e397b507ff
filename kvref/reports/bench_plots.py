"""Plots of benchmark runs for ``kvref report --out``: cost per block by batch size, and ratios to the oracle.

For one pytest-benchmark run (``nox -s bench``), :func:`plot_benchmark_run` draws one panel per
workload with the batch size on the x axis (log 2) and the median cost per block on the y axis
(log), one line per backend, at the largest pool size measured for that workload; and a second
figure with each backend's cost divided by the oracle's at the same workload, batch and pool.
Benchmarks without a ``batch`` in their ``extra_info`` are left out. Needs matplotlib
(``pip install 'kvref[plots]'``).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from kvref.contract.errors import BackendUnavailableError

__all__ = ["cost_table", "plot_benchmark_run"]

Key = tuple[str, int, int]  # workload, batch, pool blocks


def cost_table(run: dict[str, Any]) -> dict[Key, dict[str, float]]:
    """Median microseconds per block, by (workload, batch, pool) and backend."""
    table: dict[Key, dict[str, float]] = defaultdict(dict)
    for bench in run.get("benchmarks", []):
        info = bench.get("extra_info", {})
        if "batch" not in info or "workload" not in info:
            continue
        blocks = max(int(info.get("blocks_per_round", 1)), 1)
        key = (str(info["workload"]), int(info["batch"]), int(info.get("pool_blocks", 0)))
        table[key][str(info.get("backend", "?"))] = float(bench["stats"]["median"]) * 1e6 / blocks
    return dict(table)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BackendUnavailableError(
            "CONF-902", "benchmark plots need matplotlib: pip install 'kvref[plots]'"
        ) from None
    return plt


def plot_benchmark_run(run: dict[str, Any], out_dir: Path, stem: str) -> list[Path]:
    """Write ``<stem>-cost.png`` and ``<stem>-ratio.png`` under ``out_dir``; return the paths written."""
    table = cost_table(run)
    if not table:
        return []
    plt = _pyplot()
    workloads = sorted({w for w, _, _ in table})
    largest = {w: max(p for ww, _, p in table if ww == w) for w in workloads}
    backends = sorted({b for row in table.values() for b in row}, key=lambda b: (b != "oracle", b))
    cols = min(3, len(workloads))
    rows = (len(workloads) + cols - 1) // cols
    written = []
    for kind in ("cost", "ratio"):
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
        for ax, workload in zip(axes.flat, workloads, strict=False):
            pool = largest[workload]
            batches = sorted(b for w, b, p in table if w == workload and p == pool)
            for backend in backends:
                points = []
                for batch in batches:
                    row = table[(workload, batch, pool)]
                    if backend not in row:
                        continue
                    if kind == "cost":
                        points.append((batch, row[backend]))
                    elif "oracle" in row and backend != "oracle":
                        points.append((batch, row[backend] / row["oracle"]))
                if points:
                    ax.plot([b for b, _ in points], [v for _, v in points], marker="o", label=backend)
            if kind == "ratio":
                ax.axhline(1.0, color="grey", linestyle=":")
                ax.axhline(0.1, color="grey", linestyle="--", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{workload}, {pool:,} blocks", fontsize=9)
            ax.set_xlabel("blocks per call")
            ax.set_ylabel("us per block" if kind == "cost" else "cost / oracle's")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(workloads) :]:
            ax.set_visible(False)
        fig.tight_layout()
        path = out_dir / f"{stem}-{kind}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
