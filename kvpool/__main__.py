"""``python -m kvpool``: the command line (see :mod:`kvpool.cli`)."""

import sys

from kvpool.cli import main

sys.exit(main())
