"""``python -m kvref.cli``: the same as the ``kvref`` command."""

import sys

from kvref.cli.main import main

sys.exit(main())
