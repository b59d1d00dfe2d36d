"""``python -m kvtrace.cli``: the ``kvtrace`` command (how kvtrace starts its own child commands)."""

import sys

from kvtrace.cli import main

sys.exit(main())
