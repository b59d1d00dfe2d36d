"""``kvtrace collect`` when a write fails: no failed write is acknowledged, nothing acknowledged is lost.

Writes fail although requests are admitted against the free space when the disk fills between
two readings of it (another process; test_full_disk_admission.py covers the refusals before
that).  Two layers.  A real full disk: a 3 MiB tmpfs mounted inside the test (root only; skipped
with the reason when mounting is refused), filled by a ballast file while the collector trusts an
old reading, and freed again by deleting the ballast; the collector runs as the ``kvtrace collect``
command and is stopped with SIGTERM.  A fault-injecting layer that always runs: the store's
``write_atomic`` raises ``OSError(ENOSPC)`` while a switch is on (in-process collector, HTTP and
gRPC).  Every case checks the exact answers (200 / 503 + Retry-After / UNAVAILABLE), the
counters on ``GET /health``, the rows on disk (exactly the acknowledged spans, each once) and the
one log line per episode.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from kvtrace.collect.queue import SpanQueue
from kvtrace.collect.server import Collector
from kvtrace.collect.sink import TableSink
from kvtrace.store import writer
from kvtrace.testing.wait import wait_for

from support.disk import (
    MAIN,
    assert_retry_later,
    fill,
    health,
    names_of,
    post,
    request,
    sigterm,
    start_cli,
    stored_names,
)

# the disk filled by someone else after the collector's last reading of its free space: it
# admitted the request on that reading, so the write itself fails (test_full_disk_admission.py:
# the reading is fresh and the request refused before it is acknowledged)
STALE = {"KVTRACE_DISK_REFRESH_MS": "3600000"}


def test_default_mode_on_a_full_tmpfs_answers_503_keeps_what_it_acknowledged_and_resumes(small_disk):
    traces = small_disk / "t"
    proc, port = start_cli(traces, "--batch-delay-ms", "50", "--min-free-mib", "0", env=STALE)
    try:
        ballast = fill(small_disk)
        assert post(port, request("a", 40))[0] == 200  # queued: acknowledged before any write
        unwritable = wait_for(lambda: (h := health(port))["status"] == "unwritable" and h, 60, "a failed write")
        assert "No space left on device" in unwritable["write_error"]
        for i in range(5):
            message = assert_retry_later(*post(port, request(f"b{i}", 10)))
            assert "cannot write to the trace directory" in message and "No space left" in message
        h = health(port)
        assert (h["status"], h["queued_spans"], h["written_spans"], h["accepted_spans"]) == ("unwritable", 40, 0, 40)
        assert (h["unwritable_refused_requests"], h["unwritable_refused_spans"], h["unwritable_episodes"]) == (5, 50, 1)
        assert h["disk_refused_requests"] == 0
        os.unlink(ballast)  # space returns: the writer's retry succeeds on its own
        wait_for(lambda: (h := health(port))["status"] == "ok" and h["written_spans"] == 40, 60, "recovery")
        assert post(port, request("c", 7))[0] == 200
    finally:
        rc, out, err = sigterm(proc)
    assert rc == 0, err
    assert "47 spans written, 0 lost, 50 refused while unwritable" in out
    assert stored_names(traces) == sorted(names_of("a", 40) + names_of("c", 7))
    assert err.count("refusing new requests") == 1 and err.count("writing again after") == 1  # once per episode


def test_durable_ack_on_a_full_tmpfs_answers_503_stores_nothing_unacknowledged_and_resumes(small_disk):
    traces = small_disk / "t"
    proc, port = start_cli(traces, "--durable-ack", "--min-free-mib", "0", env=STALE)
    try:
        ballast = fill(small_disk)
        for i in range(6):  # the first fails its write; the rest are refused (back-off) or fail as probes
            assert_retry_later(*post(port, request(f"r{i}", 10)))
        h = health(port)
        assert (h["status"], h["queued_spans"], h["written_spans"], h["lost_spans"]) == ("unwritable", 0, 0, 0)
        assert h["failed_durable_spans"] >= 10 and h["failed_durable_spans"] + h["unwritable_refused_spans"] == 60
        os.unlink(ballast)
        sent = wait_for(lambda: post(port, request("ok", 9))[0] == 200, 60, "a durable write once space returned")
        assert sent and health(port)["status"] == "ok"
    finally:
        rc, out, err = sigterm(proc)
    assert rc == 0, err
    assert "9 spans written, 0 lost" in out
    assert stored_names(traces) == names_of("ok", 9)


# -- the fault-injecting layer (always runs) -----------------------------------------------------
class DiskSwitch:
    """While ``full`` is set, the store's ``write_atomic`` raises ENOSPC (counts the attempts)."""

    def __init__(self, monkeypatch) -> None:
        self.full = threading.Event()
        self.attempts = 0
        real = writer.write_atomic

        def write_atomic(*args, **kwargs):
            if self.full.is_set():
                self.attempts += 1
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(*args, **kwargs)

        monkeypatch.setattr(writer, "write_atomic", write_atomic)


def grpc_export(port: int, req: ExportTraceServiceRequest):
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=lambda r: r.SerializeToString(),
            response_deserializer=lambda b: b,
        )
        try:
            call(req, timeout=30)
            return grpc.StatusCode.OK
        except grpc.RpcError as err:
            return err.code()


def test_injected_enospc_default_mode_http_and_grpc(tmp_path, monkeypatch):
    disk = DiskSwitch(monkeypatch)
    traces = tmp_path / "t"
    c = Collector(traces, http_address="127.0.0.1:0", grpc_address="127.0.0.1:0", batch_delay_s=0).start()
    try:
        disk.full.set()
        assert post(c.http_port, request("a", 12))[0] == 200
        wait_for(lambda: c.queue.write_error is not None, 30, "the failed write")
        assert_retry_later(*post(c.http_port, request("b", 5)))
        assert grpc_export(c.grpc_port, request("g", 3)) == grpc.StatusCode.UNAVAILABLE
        h = health(c.http_port)
        assert h == {
            "status": "unwritable",
            "write_error": "[Errno 28] No space left on device",
            "queued_spans": 12,
            "queued_bytes": c.queue.queued_bytes,
            "accepted_spans": 12,
            "written_spans": 0,
            "refused_requests": 2,
            "refused_spans": 8,
            "unwritable_refused_requests": 2,
            "unwritable_refused_spans": 8,
            "write_failures": h["write_failures"],  # the writer retries meanwhile (back-off)
            "unwritable_episodes": 1,
            "lost_spans": 0,
            "failed_durable_spans": 0,
            "disk_refused_requests": 0,
            "disk_refused_spans": 0,
            "disk": {
                "free_bytes": h["disk"]["free_bytes"],  # the real disk's
                "reserved_bytes": c.queue.space.estimate(c.queue.queued_bytes),  # the 12 spans queued
                "min_free_bytes": 64 << 20,
                "refusals": 0,
            },
        }
        assert h["write_failures"] >= 1 and disk.attempts >= h["write_failures"]
        disk.full.clear()
        wait_for(lambda: c.queue.stats.written_spans == 12, 30, "the retried batch")
        assert post(c.http_port, request("c", 2))[0] == 200
        assert grpc_export(c.grpc_port, request("h", 1)) == grpc.StatusCode.OK
    finally:
        c.stop()
    assert c.queue.health()["status"] == "ok" and c.queue.stats.lost_spans == 0
    assert stored_names(traces) == sorted(names_of("a", 12) + names_of("c", 2) + names_of("h", 1))


def test_injected_enospc_durable_mode_probes_one_request_after_the_back_off(tmp_path, monkeypatch):
    disk = DiskSwitch(monkeypatch)
    traces = tmp_path / "t"
    c = Collector(traces, http_address="127.0.0.1:0", grpc_address="127.0.0.1:0", durable_ack=True).start()
    try:
        disk.full.set()
        assert "writing the spans failed" in assert_retry_later(*post(c.http_port, request("a", 4)))
        assert disk.attempts == 1 and c.queue.stats.failed_durable_spans == 4
        c.queue._retry_at = time.monotonic() + 3600  # hold the back-off: every request now is refused unwritten
        assert "cannot write to the trace directory" in assert_retry_later(*post(c.http_port, request("b", 3)))
        assert grpc_export(c.grpc_port, request("g", 2)) == grpc.StatusCode.UNAVAILABLE
        assert disk.attempts == 1  # refused without touching the disk
        assert (c.queue.stats.unwritable_refused_requests, c.queue.stats.unwritable_refused_spans) == (2, 5)
        c.queue._retry_at = 0.0  # back-off over: the next request is the probe (and fails: still full)
        assert "writing the spans failed" in assert_retry_later(*post(c.http_port, request("p", 1)))
        assert disk.attempts == 2
        disk.full.clear()
        c.queue._retry_at = 0.0
        assert post(c.http_port, request("ok", 6))[0] == 200
        assert c.queue.write_error is None
    finally:
        c.stop()
    assert stored_names(traces) == names_of("ok", 6)


def test_close_retries_a_failing_write_then_gives_up_and_counts_the_loss(tmp_path, monkeypatch):
    """What is not guaranteed: a disk still full when the drain timeout ends loses the queue."""
    disk = DiskSwitch(monkeypatch)
    sink = TableSink(tmp_path / "t")
    queue = SpanQueue(sink, max_spans=100, batch_delay_s=0, retry_delay_s=0.01, close_timeout_s=0.3)
    from kvtrace.collect.otlp_convert import request_to_table

    disk.full.set()
    assert queue.offer(request_to_table(request("a", 5))[0]) is True
    wait_for(lambda: queue.write_error is not None, 30, "the failed write")
    refused = queue.offer(request_to_table(request("b", 1))[0])
    assert not refused and refused.reason.startswith("cannot write to the trace directory ([Errno 28]")
    assert queue.close(30)
    assert (queue.stats.lost_spans, queue.stats.written_spans, queue.queued_spans) == (5, 0, 0)
    assert queue.space.health()["reserved_bytes"] == 0  # the lost spans' reservation given back
    assert disk.attempts >= 2  # retried while closing, not given up at once
    sink.shutdown()
    assert stored_names(tmp_path / "t") == []


def test_recovery_within_the_drain_timeout_writes_everything(tmp_path, monkeypatch):
    disk = DiskSwitch(monkeypatch)
    sink = TableSink(tmp_path / "t")
    queue = SpanQueue(sink, max_spans=100, batch_delay_s=0, retry_delay_s=0.01, close_timeout_s=60)
    from kvtrace.collect.otlp_convert import request_to_table

    disk.full.set()
    assert queue.offer(request_to_table(request("a", 5))[0]) is True
    wait_for(lambda: queue.write_error is not None, 30, "the failed write")
    closer = threading.Thread(target=queue.close, args=(60,))
    closer.start()
    wait_for(lambda: disk.attempts >= 3, 30, "retries while closing")
    disk.full.clear()
    closer.join(60)
    assert not closer.is_alive()
    assert (queue.stats.lost_spans, queue.stats.written_spans) == (0, 5)
    sink.shutdown()
    assert stored_names(tmp_path / "t") == names_of("a", 5)


def test_help_says_what_a_full_disk_does_and_does_not_guarantee():
    out = subprocess.run(
        [sys.executable, "-c", MAIN, "collect", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    flat = " ".join(out.split())
    assert "A full disk, in both modes: nothing acknowledged is lost, even if the disk stays full." in flat
    assert "in both modes: no failed write is ever acknowledged." in flat
    assert "--min-free-mib MIB" in flat and "less --min-free-mib, less what is admitted and not written yet" in flat
    assert "the acknowledged spans still queued are lost (counted, logged, exit 1)" in flat
    assert "--drain-timeout S" in flat and "GET /health" in flat
