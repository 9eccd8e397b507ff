"""What every report's plots share: matplotlib loaded on first use (the ``plots`` extra), one way to finish a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvref.contract.errors import BackendUnavailableError

__all__ = ["finish_figure", "pyplot"]


def pyplot(what: str) -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or BackendUnavailableError saying ``what`` needs it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BackendUnavailableError("CONF-902", f"{what} need matplotlib: pip install 'kvref[plots]'") from None
    return plt


def finish_figure(plt: Any, fig: Any, ax: Any, title: str, path: Path) -> None:
    """Title, grid, legend, tight layout; save ``fig`` to ``path`` at 120 dpi and close it."""
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
