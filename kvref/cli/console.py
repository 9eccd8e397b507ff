"""The console the commands print to: rich, loaded on first use."""

from __future__ import annotations

from typing import Any

__all__ = ["console"]


def console() -> Any:
    """A rich Console on standard output (rich is loaded here, not when ``kvref`` is imported)."""
    from rich.console import Console

    return Console()
