"""``python -m kvref``: the same as the ``kvref`` command."""

import sys

from kvref.cli import main

sys.exit(main())
