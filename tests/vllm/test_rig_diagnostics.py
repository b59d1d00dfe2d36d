"""The real-vLLM rig's failure paths, without vLLM: bounded waits and silent servers fail with
every process's stacks (py-spy) and log tail; scripts/e2e_stall.py dumps stacks when a run logs
vLLM's shared-memory stall warning or stops progressing."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from urllib.error import HTTPError

import pytest

from support import vllm_diag as diag
from support import vllm_pd as pd
from support.require import require_vllm

ROOT = Path(__file__).resolve().parents[2]
needs_py_spy = pytest.mark.skipif(diag.py_spy() is None, reason="py-spy not installed (dev extra)")

# a parent that starts a child; each sleeps inside a function whose name the stacks must show
TREE = textwrap.dedent("""
    import subprocess, sys, time
    CHILD = "import time\\ndef child_waits_here():\\n    time.sleep(600)\\nchild_waits_here()"
    def parent_waits_here():
        subprocess.Popen([sys.executable, "-c", CHILD])
        print("{log_line}", flush=True)
        time.sleep(600)
    parent_waits_here()
""")


def _server(tmp_path: Path, name: str, code: str) -> pd.Server:
    server = pd.Server(name, "prefill", tmp_path, tmp_path / "traces", tmp_path)
    with open(server.log_path, "wb") as log:
        server.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return server


@pytest.fixture
def tree(tmp_path):
    server = _server(tmp_path, "fake-p", TREE.format(log_line="fake server started"))
    rig = pd.Rig([server])
    rig.wait_for(
        lambda: "started" in diag.tail(server.log_path) and len(diag.process_tree(server.proc.pid)) == 2,
        deadline_s=30,
        what="the fake server and its child",
        interval=0.05,
    )
    yield rig, server
    for pid in reversed(diag.process_tree(server.proc.pid)):
        os.kill(pid, signal.SIGKILL)
    server.proc.wait()


@needs_py_spy
def test_deadline_wait_fails_with_stacks_of_every_process_and_the_log_tail(tree):
    rig, server = tree
    with pytest.raises(pd.RigError) as err:
        rig.wait_for(lambda: 0, deadline_s=0.2, what="a condition that never holds", interval=0.05)
    msg = str(err.value)
    assert msg.startswith("timed out after 0.2s waiting for a condition that never holds (last: 0)")
    assert f"----- fake-p: running; log tail ({server.log_path}):\nfake server started" in msg
    parent, child = diag.process_tree(server.proc.pid)
    assert f"=== pid {parent} " in msg and f"=== pid {child} " in msg
    assert "parent_waits_here (<string>:7)" in msg and "child_waits_here (<string>:3)" in msg
    # the kernel's view of each thread too (what py-spy cannot show for a thread stuck in the kernel)
    assert re.search(rf"--- threads \(/proc\):\n  tid {parent} 'python' state S cpu_ticks \d+ wchan \S+", msg)


@needs_py_spy
def test_a_silent_server_fails_the_request_with_stacks(tree, monkeypatch):
    rig, _ = tree
    monkeypatch.setattr(pd, "REQUEST_TIMEOUT_S", 0.3)
    with socket.socket() as listener:  # accepts, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1/completions"
        with pytest.raises(pd.RigError) as err:
            rig.call("conv-x turn 0", pd._post, url, {}, {})
    first = str(err.value).splitlines()[0]
    assert first.startswith("conv-x turn 0: ") and "timed out" in first
    assert "parent_waits_here" in str(err.value)


def test_an_http_error_is_the_callers_to_retry(tmp_path):
    class Fails(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.send_response(500)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Fails)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with pytest.raises(HTTPError) as err:
            pd.Rig([]).call("conv-x", pd._post, f"http://127.0.0.1:{httpd.server_port}/", {}, {})
        assert err.value.code == 500
    finally:
        httpd.shutdown()


def test_a_decode_leg_that_does_not_finish_is_retried_once_then_fails(tmp_path, capsys):
    """D fails a request whose KV load failed (kv_load_failure_policy=fail): the stream ends with
    an error instead of a finish chunk.  The turn is retried once, then fails naming the leg."""
    seen = []

    class Fake(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.server.server_port, self.headers["X-Request-Id"], body["stream"]))
            self.send_response(200)
            self.end_headers()
            if not body["stream"]:  # P's leg
                self.wfile.write(
                    json.dumps(
                        {
                            "choices": [{"text": "x", "finish_reason": "length"}],
                            "kv_transfer_params": {"remote_engine_id": "p-engine"},
                        }
                    ).encode()
                )
                return
            for event in (
                {"choices": [{"text": "a", "finish_reason": None}]},
                {"error": {"message": "KV load failed"}},
            ):
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args):
            pass

    fakes = [HTTPServer(("127.0.0.1", 0), Fake) for _ in range(2)]
    for httpd in fakes:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
    p, d = (
        pd.Server(name, role, tmp_path, tmp_path, tmp_path, port=httpd.server_port)
        for name, role, httpd in zip("pd", ("prefill", "decode"), fakes, strict=True)
    )
    try:
        with pytest.raises(pd.LegFailed, match=r"D's leg of conv-x-t0-r1 did not finish: last chunk \{'error'"):
            pd.run_turn(pd.Rig([p, d]), p, d, session="conv-x", turn=0, prompt=[5, 6], cached=None, max_tokens=2)
    finally:
        for httpd in fakes:
            httpd.shutdown()
    assert seen == [
        (p.port, "conv-x-t0-r0", False),
        (d.port, "conv-x-t0-r0", True),
        (p.port, "conv-x-t0-r1", False),
        (d.port, "conv-x-t0-r1", True),
    ]
    assert "conv-x turn 0 attempt 0 failed: LegFailed(" in capsys.readouterr().out


def test_a_server_that_exits_fails_readiness_with_its_log(tmp_path):
    server = _server(tmp_path, "fake-d", "print('engine failed to start', flush=True); raise SystemExit(3)")
    server.proc.wait()
    with pytest.raises(pd.RigError, match=r"(?s)fake-d exited with 3:\nengine failed to start"):
        pd.Rig([server]).wait_for(server.ready, deadline_s=5, what="fake-d ready")


# ---------------------------------------------------------------------------- scripts/e2e_stall.py
def _stall_script():
    spec = importlib.util.spec_from_file_location("e2e_stall", ROOT / "scripts" / "e2e_stall.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# a fake run: one rig step, a vLLM log with the shared-memory warning, then silence
FAKE_RUN = textwrap.dedent("""
    import pathlib, sys, time
    def engine_stalls_here():
        print("[rig +1.0s] servers ready", flush=True)
        (pathlib.Path(sys.argv[1]) / "p.log").write_text("INFO shm_broadcast.py:1 {warning} in 60 seconds.\\n")
        time.sleep(600)
    engine_stalls_here()
""").format(warning=diag.SHM_STALL)


@needs_py_spy
def test_stall_script_dumps_stacks_on_the_shm_warning_and_on_silence(tmp_path, monkeypatch):
    script = _stall_script()
    monkeypatch.setattr(
        script, "_child_command", lambda args, connector, run_dir: [sys.executable, "-c", FAKE_RUN, str(run_dir)]
    )
    monkeypatch.setattr(script, "POLL_S", 0.2)
    out = tmp_path / "out"
    rc = script.main(
        [
            "--runs",
            "1",
            "--connector",
            "plain",
            "--layout",
            "mp",
            "--out",
            str(out),
            "--stall-s",
            "1",
            "--max-dumps",
            "2",
            "--run-timeout",
            "4",
            "--sample-threads",
        ]
    )
    assert rc == 1
    [result] = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert (result["connector"], result["layout"], result["shm_warnings"]) == ("plain", "mp", 1)
    first, second, last = result["stall_reasons"]  # at most --max-dumps, then the timeout's own dump
    assert (first, second[: len("no progress for ")], last) == (
        "shared-memory stall warning #1",
        "no progress for ",
        "run timeout 4.0s",
    )
    assert result["rc"] == -signal.SIGKILL and len(result["stacks"]) == 3
    samples = (Path(result["dir"]) / "threads.log").read_text().splitlines()
    assert samples and all(line.startswith("@ +") for line in samples)  # the fake run has no vLLM process
    stacks = Path(result["stacks"][0]).read_text()
    assert stacks.startswith("# shared-memory stall warning #1 at +") and "engine_stalls_here" in stacks
    assert re.search(r"^\| 0 \| \d\d:\d\d:\d\d \| plain \| mp \| -9 \| ", (out / "summary.md").read_text(), re.M)
    assert result["monitor_late_s"] >= 0 and result["steal_s"] >= 0 and isinstance(result["kernel_events"], list)


# ---------------------------------------------------------------------------- the plain-connector arm
def test_plain_runs_load_every_vllm_plugin_but_kvtraces(monkeypatch):
    require_vllm()
    from importlib.metadata import entry_points

    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    every = {e.name for e in entry_points(group=DEFAULT_PLUGINS_GROUP)}
    assert "kvtrace" in every
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    assert set(load_plugins_by_group(DEFAULT_PLUGINS_GROUP)) == every
    monkeypatch.setenv("VLLM_PLUGINS", pd.plugins_without_kvtrace())
    assert set(load_plugins_by_group(DEFAULT_PLUGINS_GROUP)) == every - {"kvtrace"}


def test_rig_stop_terminates_every_server(tmp_path):
    servers = [_server(tmp_path, name, "import time; print('up', flush=True); time.sleep(600)") for name in ("a", "b")]
    rig = pd.Rig(servers)
    rig.wait_for(
        lambda: all("up" in diag.tail(s.log_path) for s in servers), deadline_s=30, what="both up", interval=0.05
    )
    rig.stop()
    assert [s.proc.returncode for s in servers] == [-signal.SIGTERM, -signal.SIGTERM]


def test_stall_script_summarizes_several_outputs(tmp_path, capsys):
    def result(run, connector, rc, wall, shm):
        return {
            "run": run,
            "connector": connector,
            "layout": "mp",
            "rc": rc,
            "wall_s": wall,
            "load_mean": 10.0,
            "load_max": 12.0,
            "shm_warnings": shm,
            "stacks": ["s"] * shm,
            "pytest": None,
        }

    for name, rows in {
        "a": [result(0, "plain", 0, 300.0, 0), result(1, "kvtrace", 1, 500.0, 1)],
        "b": [result(0, "plain", 0, 400.0, 2), result(1, "kvtrace", 0, 200.0, 0)],
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _stall_script().summarize([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "- kvtrace: 2 runs, 1 failed, 1 with a shared-memory stall warning; wall median 350 s, max 500 s" in out
    assert "- plain: 2 runs, 0 failed, 1 with a shared-memory stall warning; wall median 350 s, max 400 s" in out
    assert out.count("| mp |") == 4


# a thread that pins itself to the last CPU, as vLLM's NIXL worker does, then starts another
PINNED = textwrap.dedent("""
    import os, threading, time
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
    print("pinned", flush=True)
    time.sleep(600)
""")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell pinned from not")
def test_unpin_lets_every_thread_of_a_server_use_every_cpu(tmp_path):
    server = _server(tmp_path, "pinned", PINNED)
    try:
        pd.Rig([server]).wait_for(
            lambda: "pinned" in diag.tail(server.log_path), deadline_s=30, what="pinned", interval=0.05
        )
        tids = [int(t.name) for t in Path(f"/proc/{server.proc.pid}/task").glob("*")]
        assert {frozenset(os.sched_getaffinity(t)) for t in tids} == {frozenset({max(os.sched_getaffinity(0))})}
        assert server.unpin() == 2  # the main thread and the one it started
        assert {frozenset(os.sched_getaffinity(t)) for t in tids} == {frozenset(os.sched_getaffinity(0))}
        assert server.unpin() == 0
    finally:
        server.proc.kill()
        server.proc.wait()
