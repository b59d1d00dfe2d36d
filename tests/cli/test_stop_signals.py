"""Stopping ``kvtrace demo`` and ``kvtrace dashboard`` with a signal leaves no process behind:
each runs as a real subprocess in its own session; SIGTERM goes to the
command's process only (what ``kill PID`` or a service manager does), SIGINT to its whole process
group (what a terminal's Ctrl-C does).  Every descendant seen while it ran must be gone within a
deadline; the demo also says it was interrupted, with its exit status and without tracebacks.
While it serves, the dashboard builds the scan indexes of the trace files written since it started."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from kvtrace.dashboards.launch import SERVE
from kvtrace.store import scan_index
from kvtrace.store.reader import trace_files
from kvtrace.testing.synth import sample_store
from kvtrace.testing.wait import free_port, wait_for

psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.timeout(240)


def _start(tmp_path, *argv: str, **env_vars: str) -> subprocess.Popen:
    env = {**os.environ, "KVTRACE_BATCH_DELAY_MS": "100", "PYTHONUNBUFFERED": "1", **env_vars}
    env.pop("KVTRACE_TRACES_DIR", None)
    return subprocess.Popen(
        [sys.executable, "-m", "kvtrace.cli", *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _descendants(proc: subprocess.Popen) -> list:
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(procs: list) -> list:
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _stop(proc: subprocess.Popen, how: str, children: list) -> tuple[int, str, str]:
    """Send the signal, wait for the command to exit (deadline), then for every descendant."""
    if how == "SIGTERM":
        proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"still running 60 s after {how}") from None
    try:
        wait_for(lambda: not _alive(children), 20, f"no descendant left after {how}")
    finally:
        for p in _alive(children):
            p.kill()
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT"])
def test_dashboard_stops_with_its_streamlit_server(tmp_path, how):
    sample_store(tmp_path / "run")
    port = free_port()
    proc = _start(tmp_path, "dashboard", "--traces", str(tmp_path / "run"), "--port", str(port))
    try:
        # up and serving (a signal during Streamlit's own start-up makes it print a traceback)
        children = wait_for(lambda: _descendants(proc) if _healthy(port) else None, 90, "the Streamlit server")
        assert any(str(SERVE) in c.cmdline() for c in children), [c.cmdline() for c in children]
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    rc, out, err = _stop(proc, how, children)
    assert rc == 0, (out, err)
    assert "kvtrace dashboard: stopped" in err and "Traceback" not in err, err
    assert not _listening(port)


def test_dashboard_indexes_the_files_written_while_it_serves(tmp_path):
    sample_store(tmp_path / "run")
    [first] = trace_files(tmp_path / "run")
    port = free_port()
    env = {"KVTRACE_SCAN_INDEX_MIN_BYTES": "0", "KVTRACE_SCAN_INDEX_SECONDS": "0.2"}
    proc = _start(tmp_path, "dashboard", "--traces", str(tmp_path / "run"), "--port", str(port), **env)
    try:
        children = wait_for(lambda: _descendants(proc) if _healthy(port) else None, 90, "the Streamlit server")
        assert os.path.isfile(scan_index.index_path(first))  # built before it served
        second = first.replace("-b00000001.", "-b00000002.")
        shutil.copyfile(first, second + ".tmp")  # published whole, as the writers do
        os.replace(second + ".tmp", second)
        wait_for(lambda: os.path.isfile(scan_index.index_path(second)), 60, "the index of the file written since")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    rc, out, err = _stop(proc, "SIGTERM", children)
    assert rc == 0 and "Traceback" not in err, (out, err)


def _healthy(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("how, status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_demo_stops_both_runs_and_says_so(tmp_path, how, status):
    traces = tmp_path / "t"
    proc = _start(tmp_path, "demo", "--traces", str(traces), "--sessions", "1")
    try:
        # both run processes are up and the workload is under way: spans reach both directories
        wait_for(
            lambda: all(list((traces / run).rglob("*.parquet")) for run in ("bidir", "baseline")),
            120,
            "both runs to write traces",
        )
        children = _descendants(proc)
        assert len([c for c in children if "multiprocessing" in " ".join(c.cmdline())]) >= 2, children
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    rc, out, err = _stop(proc, how, children)
    assert rc == status, (out, err)
    assert err.splitlines()[-1].startswith(f"kvtrace demo: interrupted ({how}); both runs stopped"), err
    assert "Traceback" not in err + out and "Error" not in err, err
    assert "both runs done" not in out
