"""``python -m kvtrace.store.views > docs/query.md``: the views' documentation, from the registry."""

import sys

from kvtrace.store.views.docs import render

sys.stdout.write(render())
