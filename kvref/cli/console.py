"""The console the commands print to: rich, loaded on first use."""

from __future__ import annotations

from typing import Any

__all__ = ["console", "print_table"]


def console() -> Any:
    """A rich Console on standard output (rich is loaded here, not when ``kvref`` is imported)."""
    from rich.console import Console

    return Console()


def print_table(table: Any) -> None:
    """Print a rich table without cutting a number (a pipe or a file gets the table's full width).

    On a terminal narrower than the table, cells fold onto more lines (the columns are made with
    ``overflow="fold"``) rather than end in an ellipsis.
    """
    from rich.console import Console

    screen = console()
    if not screen.is_terminal:
        need = Console(width=100_000).measure(table).maximum
        screen = Console(width=max(screen.width, need))
    screen.print(table)
