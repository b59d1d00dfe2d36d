"""``kvtrace query``: ad-hoc SQL over a trace directory with the kvtrace views defined."""

from __future__ import annotations

import argparse
import sys

from kvtrace import settings

FORMATS = ("table", "csv", "json", "parquet")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sql", help="SQL to run (views: see docs/query.md)")
    parser.add_argument("--traces", metavar="DIR", help=f"trace directory (default ${settings.TRACES_DIR.env})")
    parser.add_argument("--format", choices=FORMATS, default="table")
    parser.add_argument("--output", metavar="FILE", help="write here instead of stdout (required for parquet)")


def _render_table(columns: list[str], rows: list[tuple]) -> str:
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
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

    return json.dumps([dict(zip(columns, r)) for r in rows], default=str, indent=1) + "\n"


def run(args: argparse.Namespace) -> int:
    """Run SQL over a trace directory with the kvtrace views (spans, requests, kv_decisions,
    kv_transfers, kv_retention, engine_requests, llm_calls, tool_calls, app_work, turns,
    sessions, vllm_requests, turn_gaps) defined.  Formats: table (aligned text), csv, json (array of objects), parquet
    (needs --output).  Example:

        kvtrace query "SELECT outcome, count(*) FROM kv_decisions GROUP BY 1" --traces ./traces
    """
    import duckdb

    from kvtrace.errors import CLIError
    from kvtrace.store.views import StoreError, connect

    directory = settings.TRACES_DIR.get(args.traces)
    if not directory:
        raise CLIError(f"no trace directory: pass --traces DIR or set {settings.TRACES_DIR.env}")
    if args.format == "parquet" and not args.output:
        raise CLIError("--format parquet needs --output FILE")
    try:
        con = connect(directory)
        rel = con.sql(args.sql)
        if rel is None:  # a statement without a result (e.g. CREATE)
            return 0
        if args.format == "parquet":
            rel.write_parquet(args.output)
            return 0
        text = _render(args.format, rel.columns, rel.fetchall())
    except StoreError as exc:
        raise CLIError(str(exc)) from None
    except duckdb.Error as exc:
        raise CLIError(str(exc).strip().splitlines()[0]) from None
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise CLIError(f"cannot write {args.output}: {exc.strerror}") from None
    else:
        sys.stdout.write(text)
    return 0
