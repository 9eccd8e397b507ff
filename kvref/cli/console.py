"""The console the commands print to: rich, loaded on first use; tables that never cut a number."""

from __future__ import annotations

from typing import Any

__all__ = ["console", "plain_columns", "print_table", "use_plain_tables"]

_PLAIN = [False]


def console() -> Any:
    """A rich Console on standard output (rich is loaded here, not when ``kvref`` is imported)."""
    from rich.console import Console

    return Console()


def use_plain_tables(plain: bool) -> None:
    """Print every later table as plain columns (``--format plain``)."""
    _PLAIN[0] = plain


def plain_columns(table: Any) -> str:
    """A rich table as plain text: its title, then columns of whole cells separated by two spaces.

    Lines are as long as their cells need; nothing is folded or cut, so a pipe, a file or a narrow
    terminal (which wraps long lines) still shows every number whole.
    """
    columns = [(str(c.header), [str(cell) for cell in c.cells], c.justify) for c in table.columns]
    widths = [max([len(h), *(len(x) for x in cells)]) for h, cells, _ in columns]
    rows = max((len(cells) for _, cells, _ in columns), default=0)

    def line(values: list[str]) -> str:
        parts = [
            v.ljust(w) if justify == "left" else v.rjust(w)
            for v, w, (_, _, justify) in zip(values, widths, columns, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [str(table.title)] if table.title else []
    out.append(line([h for h, _, _ in columns]))
    out.extend(line([cells[r] if r < len(cells) else "" for _, cells, _ in columns]) for r in range(rows))
    return "\n".join(out)


def print_table(table: Any) -> None:
    """Print a rich table without cutting a number.

    A pipe or a file gets the table at its full width; a terminal narrower than the table, or any
    output after ``use_plain_tables(True)``, gets :func:`plain_columns`.
    """
    from rich.console import Console

    screen = console()
    need = Console(width=100_000).measure(table).maximum
    if _PLAIN[0] or (screen.is_terminal and need > screen.width):
        print(plain_columns(table))
        return
    if not screen.is_terminal:
        screen = Console(width=max(screen.width, need))
    screen.print(table)
