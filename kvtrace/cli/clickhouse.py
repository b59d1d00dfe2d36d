"""``kvtrace clickhouse init``: add kvtrace's session lookup to an OTel Collector ``otel_traces`` table."""

from __future__ import annotations

import argparse

from kvtrace import settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["init"], help="init: create the lookup and backfill it")
    parser.add_argument(
        "--clickhouse",
        metavar="URL",
        help="http(s)://[user[:password]@]host[:port][/database] (a ClickHouse server) or chdb:PATH "
        "(chDB in process); default KVTRACE_CLICKHOUSE",
    )
    parser.add_argument(
        "--table",
        metavar="NAME",
        help=f"the exporter's table, name or database.name (default KVTRACE_CLICKHOUSE_TABLE or "
        f"{settings.CLICKHOUSE_TABLE.default})",
    )
    parser.add_argument("--replace", action="store_true", help="drop an existing lookup (e.g. an older version) first")


def run(args: argparse.Namespace) -> int:
    """Add kvtrace's session lookup to an otel_traces table: two small tables, session id -> trace
    ids and trace id -> first start / last end, that materialized views fill on every insert the
    Collector makes, so a one-session query (the dashboard's drill-down, `sessions.breakdown` with a
    session id) reads that session's traces and time range instead of the whole table.  Creates
    the tables and views (IF NOT EXISTS) and backfills them from the rows already in the table;
    safe to run again (the lookup ignores repeated rows).  An older version of the lookup is
    refused unless --replace.  Needs a user allowed CREATE TABLE, CREATE VIEW and INSERT; the same
    DDL is in collectors/clickhouse-kvtrace-views.sql.  `kvtrace doctor --clickhouse URL` says when
    a table lacks it.  docs/clickhouse.md ("Session lookup").
    """
    from kvtrace.errors import CLIError
    from kvtrace.store import source
    from kvtrace.store.clickhouse import mviews
    from kvtrace.store.clickhouse.backend import BackendError, open_backend

    url = source.clickhouse_url(args)
    if not url:
        raise CLIError("needs --clickhouse URL (or KVTRACE_CLICKHOUSE)")
    table = source.clickhouse_table(args)
    try:
        backend = open_backend(url)
        held = mviews.init(backend, table, replace=args.replace)
    except BackendError as exc:
        raise CLIError(str(exc)) from None
    print(
        f"kvtrace clickhouse: {source.describe(args)}: session lookup {mviews.COMMENT} ready "
        f"({held['sessions']} sessions, {held['traces']} traces)"
    )
    return 0
