"""A client's side of ``kvtrace collect`` for the collector tests: OTLP export requests with known
spans (and, on demand, invalid span ids), the gRPC and HTTP calls that send them, a ``kvtrace
collect`` subprocess on 127.0.0.1, and a sink that holds the writer thread where a test wants it."""

from __future__ import annotations

import http.client
import signal
import subprocess
import sys
import threading

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from kvtrace import semconv as sc
from kvtrace.collect.grpc_server import SERVICE
from kvtrace.collect.sink import TableSink
from kvtrace.testing.wait import wait_for

PROTOBUF = "application/x-protobuf"


def export_request(n: int, *, bad_ids: int = 0, name: str = "op") -> ExportTraceServiceRequest:
    """``n`` spans named ``{name}-{i}`` (trace and span ids i+1, turn index i), then ``bad_ids`` spans
    with a 3-byte span id the collector must reject."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = sc.SERVICE_NAME, "sender"
    ss = rs.scope_spans.add()
    for i in range(n + bad_ids):
        span = ss.spans.add(
            name=f"{name}-{i}",
            kind=Span.SPAN_KIND_SERVER,
            start_time_unix_nano=1_700_000_000_000_000_000 + i,
            end_time_unix_nano=1_700_000_000_000_001_000 + i,
        )
        span.trace_id = (i + 1).to_bytes(16, "big")
        span.span_id = (i + 1).to_bytes(8, "big") if i < n else b"\x01\x02\x03"
        span.status.code = 2
        span.status.message = "bad"
        a = span.attributes.add()
        a.key, a.value.int_value = sc.TURN_INDEX, i
    return req


def grpc_export(port: int, body: bytes):
    """(response, None) or (None, the RpcError) of one gRPC Export of ``body``."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(f"/{SERVICE}/Export")
        try:
            return ExportTraceServiceResponse.FromString(call(body, timeout=30)), None
        except grpc.RpcError as err:
            return None, err


class BlockingSink(TableSink):
    """Holds the writer thread inside write_table until released; can fail its first writes."""

    def __init__(self, directory, fail_first: int = 0) -> None:
        super().__init__(directory)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail_first = fail_first

    def write_table(self, table) -> None:
        self.entered.set()
        assert self.release.wait(30)
        if self.fail_first:
            self.fail_first -= 1
            raise OSError("disk full (test)")
        super().write_table(table)


def start_cli(traces, *flags) -> tuple[subprocess.Popen, int, int | None]:
    """A ``kvtrace collect`` subprocess on 127.0.0.1 (HTTP, and gRPC unless flags say 'off');
    returns (process, http port, grpc port)."""
    main = "import sys; from kvtrace.cli import main; sys.exit(main(sys.argv[1:]))"
    grpc_flags = [] if "--otlp-grpc" in flags else ["--otlp-grpc", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            main,
            "collect",
            *grpc_flags,
            "--otlp-http",
            "127.0.0.1:0",
            "--traces",
            str(traces),
            *flags,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ports = {}
    while "http" not in ports:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        if "OTLP/gRPC on" in line:
            ports["grpc"] = int(line.rsplit(":", 1)[1])
        elif "OTLP/HTTP on" in line:
            ports["http"] = int(line.rsplit(":", 1)[1].split("/")[0])
    assert "writing" in proc.stdout.readline()
    return proc, ports["http"], ports.get("grpc")


def stop_cli(proc: subprocess.Popen) -> str:
    """SIGTERM, then its output once it exited 0."""
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out


def post(port: int, body: bytes, headers: dict | None = None) -> tuple[int, bytes]:
    """(status, body) of an OTLP/HTTP protobuf POST of ``body`` to /v1/traces."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": PROTOBUF, **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def post_until_accepted(port: int, body: bytes, deadline_s: float = 60.0) -> int:
    """POST like an OTLP sender: resend after "retry later" (503) until answered otherwise (the status)."""

    def answer() -> int | None:
        status = post(port, body)[0]
        return None if status == 503 else status

    # poll interval 50 ms: the server's Retry-After is 1 s, no need to wait it all
    return wait_for(answer, deadline_s, "an answer other than 503 (retry later)", interval=0.05)
