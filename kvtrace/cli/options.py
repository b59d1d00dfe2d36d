"""Options shared by several commands: what a reading command reads (``--traces`` or
``--clickhouse`` / ``--table``, resolved by :mod:`kvtrace.store.source`) and where a command writes
its output (``--output``)."""

from __future__ import annotations

import argparse
import sys

from kvtrace import settings
from kvtrace.store.runs import DEFAULT_TRACES_DIR


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """``--traces``, ``--clickhouse``, ``--table``."""
    parser.add_argument(
        "--traces",
        metavar="DIR",
        help=f"trace directory, one run (default: KVTRACE_TRACES_DIR or ./{DEFAULT_TRACES_DIR})",
    )
    parser.add_argument(
        "--clickhouse",
        metavar="URL",
        help="read an otel_traces table instead: http(s)://[user[:password]@]host[:port][/database] "
        "(a ClickHouse server) or chdb:PATH (chDB in process); default KVTRACE_CLICKHOUSE",
    )
    parser.add_argument(
        "--table",
        metavar="NAME",
        help="with --clickhouse: the table, name or database.name (default KVTRACE_CLICKHOUSE_TABLE "
        f"or {settings.CLICKHOUSE_TABLE.default})",
    )


def write_output(path: str | None, content: str, command: str = "report") -> None:
    """``content`` to ``path`` (a one-line CLIError when it cannot be written), else to stdout."""
    if not path:
        sys.stdout.write(content)
        return
    from kvtrace.errors import CLIError

    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
    except OSError as exc:
        raise CLIError(f"cannot write {path}: {exc.strerror}") from None
    print(f"kvtrace {command}: wrote {path}", file=sys.stderr)
