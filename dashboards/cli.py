"""``kvtrace dashboard``: start the Streamlit app (``dashboards/app.py``) on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kvtrace.store import source
from kvtrace.store.runs import traces_dir

APP = Path(__file__).resolve().parent / "app.py"  # this package's Streamlit app (kvtrace.dashboards)
# the launcher, run by path: ``python -m kvtrace.dashboards.serve`` would resolve ``kvtrace`` from the
# working directory first, and a source checkout's ``kvtrace/`` has no ``dashboards`` (it is mapped
# in at install time), so the README's command failed when run from the repository root
SERVE = APP.with_name("serve.py")
GRACE_S = 10.0  # after a forwarded SIGINT/SIGTERM, how long Streamlit gets to stop before it is killed


def add_arguments(parser) -> None:
    source.add_arguments(parser)
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
    http://127.0.0.1:PORT (headless; open it in a browser).  Needs the dashboard extra:
    pip install 'kvtrace[dashboard]'.
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
    return launch(directory, port=args.port, compare=args.compare, host=args.host, clickhouse=clickhouse)


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


def command(
    directory: str,
    *,
    port: int = 8501,
    compare: str | None = None,
    host: str = "127.0.0.1",
    clickhouse: tuple[str, str] | None = None,
) -> list[str]:
    """The ``streamlit run`` command line for the dashboard (``clickhouse``: (URL, table)); through
    :mod:`.serve`, which imports what the pages need before the server starts."""
    cmd = [
        sys.executable,
        str(SERVE),
        "run",
        str(APP),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--",
        "--traces",
        directory,
    ]
    if clickhouse:
        cmd += ["--clickhouse", clickhouse[0], "--table", clickhouse[1]]
    return cmd + (["--compare", compare] if compare else [])


def launch(
    directory: str,
    *,
    port: int = 8501,
    compare: str | None = None,
    host: str = "127.0.0.1",
    clickhouse: tuple[str, str] | None = None,
) -> int:
    """Run the dashboard in the foreground until Ctrl-C; returns its exit status."""
    import importlib.util

    from kvtrace.errors import CLIError

    if importlib.util.find_spec("streamlit") is None:
        raise CLIError("the dashboard needs Streamlit: pip install 'kvtrace[dashboard]'")
    if not APP.is_file():
        raise CLIError(f"dashboard app not found at {APP} (install kvtrace from a source checkout)")
    what = f"ClickHouse table {clickhouse[1]}" if clickhouse else f"traces: {directory}"
    print(
        f"kvtrace dashboard: http://{host}:{port}  ({what}" + (f", baseline: {compare}" if compare else "") + ")",
        flush=True,
    )
    return foreground(command(directory, port=port, compare=compare, host=host, clickhouse=clickhouse))


def foreground(cmd: list[str], grace_s: float = GRACE_S) -> int:
    """Run ``cmd`` until it exits and return its exit status.  It runs in its own process group,
    so a terminal's Ctrl-C reaches only this process, which passes SIGINT and SIGTERM on to it
    exactly once (Streamlit shuts down cleanly on one signal; on two it prints a traceback); once
    it has had ``grace_s`` to stop it is killed, and 0 is returned: stopping the dashboard is its
    normal end.  So no Streamlit server outlives the command, whichever way it is stopped."""
    proc = subprocess.Popen(cmd, process_group=0)
    signalled: list[float] = []

    def forward(signum, frame) -> None:
        if not signalled and proc.poll() is None:
            proc.send_signal(signum)
        signalled.append(time.monotonic())

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                status = proc.wait(timeout=0.5)
                return 0 if signalled else status
            except subprocess.TimeoutExpired:
                if signalled and time.monotonic() - signalled[0] > grace_s:
                    proc.kill()
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        if proc.poll() is None:  # an exception of our own: never leave the server behind
            proc.kill()
            proc.wait()
        if signalled:
            print("kvtrace dashboard: stopped", file=sys.stderr, flush=True)
