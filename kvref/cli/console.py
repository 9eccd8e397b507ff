"""The console the commands print to: rich, loaded on first use; tables that never cut a number;
progress bars on standard error, on a terminal only and never with ``--quiet``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "console",
    "plain_columns",
    "print_table",
    "progress_bar",
    "showing_progress",
    "use_plain_tables",
    "use_quiet",
]

_PLAIN = [False]
_QUIET = [False]


def use_quiet(quiet: bool) -> None:
    """Show no progress from now on (``--quiet``): results and errors still print."""
    _QUIET[0] = quiet


def quiet() -> bool:
    """Whether ``--quiet`` was given: no progress and no running commentary on standard error."""
    return _QUIET[0]


def showing_progress() -> bool:
    """Whether progress is shown: standard error is a terminal and ``--quiet`` was not given."""
    import sys

    return not _QUIET[0] and sys.stderr.isatty()


@contextmanager
def progress_bar(label: str, total: int | None = None, *, enabled: bool = True) -> Iterator[Callable[..., None]]:
    """A rich progress bar on standard error, shown when ``enabled`` and :func:`showing_progress`.

    Yields ``advance(amount=1, *, label=None, total=None)``, which moves the bar (and may rename it or
    set its total); when the bar is not shown it does nothing. The bar is removed when the work ends.
    """
    if not (enabled and showing_progress()):
        yield lambda amount=1, *, label=None, total=None: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)

        def advance(amount: int = 1, *, label: str | None = None, total: int | None = None) -> None:
            changes: dict[str, Any] = {"advance": amount}
            if label is not None:
                changes["description"] = label
            if total is not None:
                changes["total"] = total
            bar.update(task, **changes)

        yield advance


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
