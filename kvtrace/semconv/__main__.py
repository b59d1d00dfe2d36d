"""``python -m kvtrace.semconv [metrics]``: docs/semconv.md (or docs/metrics.md) on standard output."""

import sys

from kvtrace.semconv.render import render_markdown, render_metrics_markdown

print(render_metrics_markdown() if sys.argv[1:] == ["metrics"] else render_markdown(), end="")
