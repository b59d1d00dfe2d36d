"""kvtrace collect's OTLP protocol behaviour: malformed payloads, partial success, back-pressure
("retry later" when the queue is full), write failures, graceful shutdown, the command line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from kvtrace import semconv as sc
from kvtrace.collect.queue import SpanQueue
from kvtrace.collect.server import Collector

from support.otlp_client import PROTOBUF, BlockingSink, export_request, grpc_export
from support.sim_workload import read_rows, tmp_files


def _post(port: int, body: bytes, ctype: str = PROTOBUF, path: str = "/v1/traces"):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=body, method="POST", headers={"Content-Type": ctype}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


@pytest.fixture
def collector(tmp_path):
    with Collector(tmp_path / "t", grpc_address="127.0.0.1:0", http_address="127.0.0.1:0") as c:
        yield c


def test_http_malformed_protobuf_is_400_with_status(collector):
    status, headers, body = _post(collector.http_port, b"\xff\xff\xff not protobuf")
    assert status == 400 and headers["Content-Type"] == PROTOBUF
    assert status_pb2.Status.FromString(body).code == code_pb2.INVALID_ARGUMENT
    status, headers, body = _post(collector.http_port, b"{not json", "application/json")
    assert status == 400 and headers["Content-Type"].startswith("application/json")
    assert b"invalid JSON" in body
    status, _, _ = _post(collector.http_port, b'{"resourceSpans": 5}', "application/json")
    assert status == 400
    assert _post(collector.http_port, b"x", "text/plain")[0] == 415
    assert _post(collector.http_port, b"", PROTOBUF, path="/v1/logs")[0] == 404
    assert collector.queue.stats.accepted_spans == 0


def test_grpc_malformed_is_invalid_argument(collector):
    response, err = grpc_export(collector.grpc_port, b"\xff\xff\xff not protobuf")
    assert response is None and err.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_partial_success_rejects_bad_ids_keeps_the_rest(collector, transport):
    body = export_request(3, bad_ids=2).SerializeToString()
    if transport == "http":
        status, _, raw = _post(collector.http_port, body)
        assert status == 200
        response = ExportTraceServiceResponse.FromString(raw)
    else:
        response, err = grpc_export(collector.grpc_port, body)
        assert err is None
    assert response.partial_success.rejected_spans == 2
    assert "span_id must be 8" in response.partial_success.error_message
    assert collector.flush(30)
    rows = read_rows(collector.traces_dir)
    assert [r["SpanName"] for r in rows] == ["op-0", "op-1", "op-2"]
    assert rows[0]["SpanKind"] == "SPAN_KIND_SERVER" and rows[0]["StatusCode"] == "STATUS_CODE_ERROR"
    assert rows[0]["StatusMessage"] == "bad" and rows[0]["ServiceName"] == "sender"
    assert rows[2]["SpanAttributesInt"] == {sc.TURN_INDEX: 2}
    assert rows[0]["Duration"] == 1000


def test_full_queue_answers_retry_later_then_recovers(tmp_path):
    sink = BlockingSink(tmp_path / "t")
    with Collector(
        tmp_path / "t",
        grpc_address="127.0.0.1:0",
        http_address="127.0.0.1:0",
        max_queue_spans=10,
        batch_delay_s=0,
        sink=sink,
    ) as c:
        assert _post(c.http_port, export_request(10, name="first").SerializeToString())[0] == 200
        assert sink.entered.wait(30)  # the writer holds the 10 spans: the queue is full
        status, headers, body = _post(c.http_port, export_request(1, name="second").SerializeToString())
        assert status == 503 and headers["Retry-After"] == "1"
        detail = status_pb2.Status.FromString(body)
        assert detail.code == code_pb2.UNAVAILABLE
        info = error_details_pb2.RetryInfo()
        assert detail.details[0].Unpack(info) and info.retry_delay.seconds == 1
        response, err = grpc_export(c.grpc_port, export_request(1, name="second").SerializeToString())
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        trailers = dict(err.trailing_metadata())
        grpc_detail = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
        assert grpc_detail.details[0].Unpack(info) and info.retry_delay.seconds == 1
        sink.release.set()
        assert c.flush(30)
        assert _post(c.http_port, export_request(1, name="third").SerializeToString())[0] == 200
        assert c.flush(30)
        assert c.queue.stats.refused_requests == 2
    names = sorted(r["SpanName"] for r in read_rows(tmp_path / "t"))
    assert names == sorted([f"first-{i}" for i in range(10)] + ["third-0"])


def test_failed_write_is_retried_not_lost(tmp_path):
    sink = BlockingSink(tmp_path / "t", fail_first=1)
    sink.release.set()
    queue = SpanQueue(sink, max_spans=100, batch_delay_s=0, retry_delay_s=0.01)
    from kvtrace.collect.otlp_convert import request_to_table

    assert queue.offer(request_to_table(export_request(4))[0])
    assert queue.flush(30)
    assert queue.close(30)
    sink.shutdown()
    assert (queue.stats.write_failures, queue.stats.written_spans, queue.stats.lost_spans) == (1, 4, 0)
    assert len(read_rows(tmp_path / "t")) == 4


def test_stop_drains_the_queue_and_refuses_new_work(tmp_path):
    sink = BlockingSink(tmp_path / "t")
    c = Collector(tmp_path / "t", http_address="127.0.0.1:0", batch_delay_s=0, sink=sink).start()
    for i in range(5):
        assert _post(c.http_port, export_request(3, name=f"r{i}").SerializeToString())[0] == 200
    assert sink.entered.wait(30)
    stopper = threading.Thread(target=c.stop)
    stopper.start()
    sink.release.set()
    stopper.join(60)
    assert not stopper.is_alive()
    assert len(read_rows(tmp_path / "t")) == 15
    assert tmp_files(tmp_path / "t") == []
    with pytest.raises(urllib.error.URLError):
        _post(c.http_port, export_request(1).SerializeToString())
    assert not c.queue.offer(__import__("pyarrow").table({"x": [1]}))


def test_bad_address_is_an_error(tmp_path):
    with pytest.raises(ValueError):
        Collector(tmp_path, http_address="nonsense").start()
    with Collector(tmp_path, http_address="127.0.0.1:0") as c:
        with pytest.raises(OSError):
            Collector(tmp_path, http_address=f"127.0.0.1:{c.http_port}").start()


def _cli(*args, env=None):
    main = "import sys; from kvtrace.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", main, "collect", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_cli_receives_until_sigterm_and_flushes(tmp_path):
    proc = _cli("--otlp-grpc", "off", "--otlp-http", "127.0.0.1:0", "--traces", str(tmp_path / "t"))
    try:
        line = proc.stdout.readline()
        assert "OTLP/HTTP on http://127.0.0.1:" in line, line + proc.stderr.read()
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        assert _post(port, export_request(7).SerializeToString())[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "7 spans written, 0 lost" in out
    assert len(read_rows(tmp_path / "t")) == 7


@pytest.mark.parametrize(
    "args, message",
    [
        (["--otlp-http", "127.0.0.1:0"], "no trace directory"),
        (["--otlp-http", "localhost", "--traces", "X"], "is not host:port"),
        (["--otlp-http", "off", "--otlp-grpc", "off", "--traces", "X"], "nothing to listen on"),
        (["--otlp-http", "127.0.0.1:0", "--traces", "X", "--max-queue-spans", "0"], "--max-queue-spans"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, args, message):
    proc = _cli(*[str(tmp_path / a) if a == "X" else a for a in args], env={"KVTRACE_TRACES_DIR": ""})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


@pytest.mark.parametrize("kind", ["existing-sysfs-dir", "under-a-file", "a-file", "read-only-dir"])
def test_cli_unwritable_traces_dir_is_one_line_before_listening(tmp_path, kind):
    """`kvtrace collect --traces RO_DIR` exits at once with one line naming the directory
    (before: an existing directory it could not write was accepted; it listened, acknowledged
    spans and failed every write).  /sys/kernel refuses new files even to root; a read-only
    mode is tried too when not root (root ignores permission bits)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    target = {
        "under-a-file": blocker / "traces",
        "a-file": blocker,
        "existing-sysfs-dir": "/sys/kernel",
        "read-only-dir": tmp_path / "ro",
    }[kind]
    if kind == "existing-sysfs-dir" and (not os.path.isdir(target) or os.access(target, os.W_OK) and os.geteuid() != 0):
        pytest.skip("no read-only sysfs here")
    if kind == "read-only-dir":
        if os.geteuid() == 0:
            pytest.skip("root ignores permission bits (the sysfs case covers a refusal root gets)")
        target.mkdir()
        target.chmod(0o555)
    proc = _cli("--otlp-grpc", "127.0.0.1:0", "--otlp-http", "127.0.0.1:0", "--traces", str(target))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out == ""  # never got as far as listening
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("kvtrace") and f"cannot write traces to {target}:" in err
