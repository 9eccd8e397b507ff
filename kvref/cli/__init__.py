"""The ``kvref`` command line (the top floor): every command, and the spec linter behind ``kvref spec``.

:func:`main` is the entry point (``kvref = "kvref.cli:main"``); ``python -m kvref.cli`` and
``python -m kvref`` run it too.
"""

from kvref.cli.main import main

__all__ = ["main"]
