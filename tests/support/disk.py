"""A real full disk for the writers' tests: a small tmpfs (``small_disk``, the root conftest's
fixture) and a ballast file that fills it; and what the collector's full-disk tests send and
check (OTLP requests of named spans, the ``kvtrace collect`` command, the rows stored)."""

from __future__ import annotations

import errno
import http.client
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from kvtrace import semconv as sc
from kvtrace.store import files


@contextmanager
def tmpfs(path: Path, size: str = "3m") -> Iterator[Path | str]:
    """A tmpfs of ``size`` mounted at ``path`` (created), unmounted after; yields the path, or the
    reason it could not be mounted (a str) where mounting is refused."""
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        yield done.stderr.strip() or f"mount exited {done.returncode}"
        return
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk) -> str:
    """Fill ``disk`` with a ballast file until ENOSPC; its path (delete it and space returns)."""
    ballast = os.path.join(disk, "ballast")
    with open(ballast, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (64 << 10))
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return ballast


# -- the collector's side -------------------------------------------------------------------
PROTOBUF = "application/x-protobuf"
MAIN = "import sys; from kvtrace.cli import main; sys.exit(main(sys.argv[1:]))"
PAD = 1500  # bytes of random hex per span (~750 B stored): about 4,000 spans fill 3 MiB


def request(name: str, n: int, pad: int = 0) -> ExportTraceServiceRequest:
    """``n`` spans named ``{name}-{i}`` with distinct ids (and ``pad`` random bytes of text each)."""
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    for i in range(n):
        span = ss.spans.add(
            name=f"{name}-{i}",
            kind=Span.SPAN_KIND_SERVER,
            start_time_unix_nano=1_700_000_000_000_000_000 + i,
            end_time_unix_nano=1_700_000_000_000_001_000 + i,
        )
        span.trace_id = os.urandom(16)
        span.span_id = os.urandom(8)
        a = span.attributes.add()
        # the padding rides in an attribute that may be long (a session id over 256 bytes is dropped)
        a.key, a.value.string_value = sc.GEN_AI_REQUEST_MODEL, os.urandom(pad // 2).hex()
    return req


def post(port: int, req: ExportTraceServiceRequest) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v1/traces", body=req.SerializeToString(), headers={"Content-Type": PROTOBUF})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def health(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        assert resp.status == 200
        return json.loads(resp.read())
    finally:
        conn.close()


def stored_names(traces) -> list[str]:
    """Span names of every row in the trace directory (duplicates kept), sorted."""
    names: list[str] = []
    for path in files.list_files(traces) if os.path.isdir(traces) else []:
        names += pq.read_table(path, columns=["SpanName"], partitioning=None).column(0).to_pylist()
    return sorted(names)


def names_of(name: str, n: int) -> list[str]:
    return [f"{name}-{i}" for i in range(n)]


def assert_retry_later(status: int, headers: dict, body: bytes) -> str:
    """A 503 with Retry-After and a google.rpc.Status UNAVAILABLE + RetryInfo; its message."""
    assert status == 503 and int(headers["Retry-After"]) >= 1
    st = status_pb2.Status.FromString(body)
    assert st.code == code_pb2.UNAVAILABLE and st.details[0].Is(error_details_pb2.RetryInfo.DESCRIPTOR)
    return st.message


# -- a real full disk ------------------------------------------------------------------------
def start_cli(traces, *flags, env: dict | None = None) -> tuple[subprocess.Popen, int]:
    """``kvtrace collect`` on HTTP only, port chosen by the OS (``env``: extra variables)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", MAIN, "collect", "--otlp-grpc", "off", "--otlp-http", "127.0.0.1:0"]
        + ["--traces", str(traces), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    line = proc.stdout.readline()
    assert "OTLP/HTTP on" in line, proc.stderr.read()
    return proc, int(line.rsplit(":", 1)[1].split("/")[0])


def sigterm(proc: subprocess.Popen) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err
