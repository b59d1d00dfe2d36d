"""``kvtrace clickhouse init``: add kvtrace's materialized tables to an OTel Collector ``otel_traces`` table."""

from __future__ import annotations

import argparse

from kvtrace import settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["init"], help="init: create the tables and views, backfill them")
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
    parser.add_argument("--replace", action="store_true", help="drop existing tables (e.g. an older version) first")


def run(args: argparse.Namespace) -> int:
    """Add kvtrace's materialized tables to an otel_traces table: materialized views that shape
    every insert the Collector makes into seven tables (the session breakdown's classified spans, a
    session id -> trace ids lookup, trace id -> first start / last end, each session's window, each
    request's first start / last end, P's prefills and the d2p transfers), so session_breakdown /
    turn_breakdown read the classified rows instead of classifying raw spans, a one-session or one-day
    question (the dashboard's drill-down and pages, KV reuse and retention included) finds its bounds
    in the small tables, and recompute is priced from the prefill tables: its cost grows with its
    answer, not with the history kept.  Creates the tables and
    views (IF NOT EXISTS), backfills them from the rows already in the table a day at a time (spans
    the views already shaped are skipped) and marks them complete; kvtrace reads them only then.
    Nothing to do on current tables; run it again after an interruption.  A v3 set is completed in
    place (the requests, prefills and d2p tables added and backfilled, the others kept); other older
    tables (e.g. the v1 session lookup) are refused unless --replace.  Needs a user allowed CREATE TABLE, CREATE VIEW,
    ALTER TABLE and INSERT (without, every answer still reads the raw table); the DDL is in
    collectors/clickhouse-kvtrace-views.sql.  `kvtrace doctor --clickhouse URL` says when a table
    lacks them.  docs/clickhouse.md ("Materialized tables").
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
        f"kvtrace clickhouse: {source.describe(args)}: materialized tables {mviews.COMMENT} ready "
        f"({held['sessions']} sessions, {held['traces']} traces, {held['rows']} classified rows)"
    )
    return 0
