"""``kvtrace query``: ad-hoc SQL over one run of a trace directory (or an ``otel_traces`` table on
ClickHouse) with every kvtrace view defined."""

from __future__ import annotations

import argparse
import sys

from kvtrace.cli import options
from kvtrace.store import source

FORMATS = ("table", "csv", "json", "parquet")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sql", help="SQL to run (views: see docs/query.md)")
    options.add_source_arguments(parser)
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table (aligned text, default), csv, json (array of objects) or parquet (needs --output)",
    )
    parser.add_argument("--output", metavar="FILE", help="write here instead of stdout (required for parquet)")


def _render_table(columns: list[str], rows: list[tuple]) -> str:
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(lines) + "\n"


def _render(fmt: str, columns: list[str], rows: list[tuple]) -> str:
    if fmt == "table":
        return _render_table(columns, rows)
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        w.writerows(rows)
        return buf.getvalue()
    import json

    return json.dumps([dict(zip(columns, r, strict=True)) for r in rows], default=str, indent=1) + "\n"


def _empty(sql: str) -> bool:
    """No statement at all: blank, only ``;`` or only comments (a syntax error is not empty: the
    query reports it)."""
    import duckdb

    try:
        return not duckdb.extract_statements(sql)
    except duckdb.Error:
        return False


def run(args: argparse.Namespace) -> int:
    """Run SQL over one run of a trace directory with the kvtrace views (spans, requests,
    kv_decisions, kv_transfers, kv_retention, engine_requests, llm_calls, tool_calls, app_work,
    turns, sessions, vllm_requests, session_breakdown, turn_breakdown, turn_gaps; docs/query.md)
    defined.  A directory holding several runs (kvtrace demo's DIR/bidir and DIR/baseline) is
    refused with their names.  With --clickhouse URL the same views read an OTel Collector
    otel_traces table (--table) on a ClickHouse server (http(s)://...) or in chDB (chdb:PATH); the
    SQL is kvtrace's dialect (DuckDB's), transpiled to ClickHouse (docs/clickhouse.md).  Formats:
    table (aligned text), csv, json (array of objects), parquet (needs --output).  Example:

        kvtrace query "SELECT outcome, count(*) FROM kv_decisions GROUP BY 1" --traces kvtrace-traces/bidir
    """
    import duckdb

    from kvtrace.errors import CLIError
    from kvtrace.store.clickhouse import ClickHouseError
    from kvtrace.store.reader import StoreError, query

    if args.format == "parquet" and not args.output:
        raise CLIError("--format parquet needs --output FILE")
    if _empty(args.sql):
        raise CLIError('no SQL statement given (e.g. kvtrace query "SELECT * FROM sessions")')
    try:
        result = query(source.open_store(args), args.sql)
    except StoreError as exc:
        raise CLIError(str(exc)) from None
    except duckdb.Error as exc:
        raise CLIError(str(exc).strip().splitlines()[0]) from None
    except ClickHouseError as exc:
        raise CLIError(str(exc)) from None
    if result is None:  # a statement without a result (e.g. CREATE)
        return 0
    if args.format == "parquet":
        import pyarrow.parquet as pq

        try:
            pq.write_table(result, args.output)
        except OSError as exc:
            raise CLIError(f"cannot write {args.output}: {exc}") from None
        return 0
    rows = list(zip(*(c.to_pylist() for c in result.columns), strict=True)) if result.num_columns else []
    text = _render(args.format, result.column_names, rows)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise CLIError(f"cannot write {args.output}: {exc.strerror}") from None
    else:
        sys.stdout.write(text)
    return 0
