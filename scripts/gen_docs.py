"""Regenerate the docs that describe code (``make docs``), or check they are current (``--check``).

Each generated page is rendered from the code that defines it: the span contract
(``kvtrace.semconv``), the metrics, the view registry (``kvtrace.store.views``) and the settings
table (``kvtrace.settings``).  The tests compare the same pages; this is the pre-commit hook.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pages() -> dict[str, str]:
    from kvtrace import semconv, settings
    from kvtrace.store.views.docs import render as views_markdown

    return {
        "docs/semconv.md": semconv.render_markdown(),
        "docs/metrics.md": semconv.render_metrics_markdown(),
        "docs/query.md": views_markdown(),
        "docs/settings.md": settings.render_markdown(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page is out of date")
    args = parser.parse_args(argv)
    stale = []
    for rel, text in pages().items():
        path = ROOT / rel
        if path.exists() and path.read_text() == text:
            continue
        stale.append(rel)
        if not args.check:
            path.write_text(text)
    for rel in stale:
        print(f"{rel}: {'out of date (make docs)' if args.check else 'regenerated'}", file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
