"""Starting the Streamlit app (``app.py`` beside this file) on 127.0.0.1 and stopping it cleanly:
what ``kvtrace dashboard`` runs once its options are checked (:mod:`kvtrace.cli.dashboard`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"  # this package's Streamlit app (kvtrace.dashboards)
# the launcher, run by path: ``python -m kvtrace.dashboards.serve`` would resolve ``kvtrace`` from the
# working directory first (a source checkout's root), not from where kvtrace is installed
SERVE = APP.with_name("serve.py")
GRACE_S = 10.0  # after a forwarded SIGINT/SIGTERM, how long Streamlit gets to stop before it is killed


def command(
    directory: str,
    *,
    port: int = 8501,
    compare: str | None = None,
    host: str = "127.0.0.1",
    clickhouse: tuple[str, str] | None = None,
    app: str | Path = APP,
) -> list[str]:
    """The ``streamlit run`` command line for the dashboard (``clickhouse``: (URL, table); ``app``:
    another checkout's app.py); through :mod:`.serve`, which imports what the pages need before the
    server starts."""
    cmd = [
        sys.executable,
        str(SERVE),
        "run",
        str(app),
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
