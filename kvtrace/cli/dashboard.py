"""``kvtrace dashboard``: start the Streamlit app (``dashboards/app.py``) on 127.0.0.1."""

from __future__ import annotations

import os

from kvtrace.cli import options
from kvtrace.store import source
from kvtrace.store.runs import traces_dir


def add_arguments(parser) -> None:
    options.add_source_arguments(parser)
    parser.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--compare", help="a baseline run's trace directory for the run comparison page")


def run(args) -> int:
    """Open the kvtrace dashboard (Streamlit) over a Parquet trace directory.

    Pages: sessions overview, session drill-down, KV reuse, retention, latency by turn index, run
    comparison (--compare DIR2: the baseline; --traces is the candidate).  Each directory must
    hold one run (kvtrace demo's DIR/bidir, not DIR).  With --clickhouse URL [--table NAME] the
    pages read an OTel Collector otel_traces table instead; they open on its last day and push
    the time range and session filters down to the table (docs/clickhouse.md).  Serves on
    http://127.0.0.1:PORT (headless; open it in a browser).  Before it serves, and every
    KVTRACE_SCAN_INDEX_SECONDS (60) while it serves, it builds the scan index of each trace file
    that lacks one (docs/query.md); the pages read them after a Refresh.  Needs the dashboard
    extra: pip install 'kvtrace[dashboard]'.
    """
    from kvtrace.errors import CLIError
    from kvtrace.store.reader import StoreError, check_one_run

    directory = traces_dir(args.traces)
    url = source.clickhouse_url(args)
    checks = [("--compare", args.compare)] + ([] if url else [("--traces", directory)])
    for label, path in checks:
        if path and not os.path.isdir(path):
            raise CLIError(f"{label} {path}: no such directory")
        try:
            if path:
                check_one_run(path)
        except StoreError as exc:
            raise CLIError(str(exc)) from None
    if not 0 < args.port < 65536:
        raise CLIError(f"--port {args.port}: must be 1-65535")
    clickhouse = None
    if url:
        _check_clickhouse(args, url)
        clickhouse = (url, source.clickhouse_table(args))
    from kvtrace.store.reader import index_keeper

    # the pages' connections are read-only: they read the indexes, never write one
    keeper = index_keeper([path for path in (None if url else directory, args.compare) if path])
    keeper.run_once()  # before it serves
    keeper.start()  # then the files rolled while it serves
    from kvtrace.dashboards.launch import launch

    try:
        return launch(directory, port=args.port, compare=args.compare, host=args.host, clickhouse=clickhouse)
    finally:
        keeper.stop()


def _check_clickhouse(args, url: str) -> None:
    """A server must answer and have the table (one line if not).  chDB is left to the app: it
    opens a database directory in one process only."""
    from kvtrace.errors import CLIError
    from kvtrace.store.clickhouse import CHDB_PREFIX
    from kvtrace.store.reader import StoreError

    if url.startswith(CHDB_PREFIX):
        path = url[len(CHDB_PREFIX) :]
        if not os.path.isdir(path):
            raise CLIError(f"--clickhouse {url}: no such chDB database directory")
        return
    try:
        source.open_store(args).close()
    except StoreError as exc:
        raise CLIError(str(exc)) from None
