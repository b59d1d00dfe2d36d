"""Spans/s ingested by ``kvtrace collect`` over OTLP/HTTP on loopback, against baselines measured
in the same run.

    python benchmarks/collect/bench_collect.py [--spans 40000] [--batch 512]

Spans look like kvtrace's (decision spans: ~17 typed attributes).  Measured, each on one core:

- ``sdk_encode``: the OTel SDK turning ReadableSpans into OTLP protobuf bytes (what every sender
  pays; the floor of any OTLP path);
- ``parquet_direct``: kvtrace's own ParquetSpanExporter writing the same spans (the in-process
  path OTLP ingest is compared with);
- ``otlp_http_ingest``: pre-encoded ExportTraceServiceRequests POSTed over one keep-alive
  connection to a running Collector until every span is in Parquet (decode + convert + queue +
  write), timed from the first request to the final flush;
- ``otlp_http_e2e``: the SDK's OTLP/HTTP exporter sending the same spans to it (encode + HTTP +
  ingest; client and server share the machine);
- the disk admission's cost (#42): ``otlp_http_ingest`` again with the queue's ``DiskSpace``
  detached (``ingest_no_admission``), both runs interleaved, per-request latency p50 / p99 and
  the ratio of the two.
"""

from __future__ import annotations

import argparse
import http.client
import shutil
import tempfile
import time

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvtrace import semconv as sc
from kvtrace.collect.server import Collector
from kvtrace.store.exporter import ParquetSpanExporter


def make_spans(n: int) -> list:
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource({sc.SERVICE_NAME: "kvtrace-sim-prefill", sc.ENGINE_ID: "p0", sc.ENGINE_ROLE: sc.ROLE_PREFILL})
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("kvtrace.vllm")
    for i in range(n):
        tracer.start_span(
            sc.SPAN_KV_DECISION,
            attributes={
                sc.GEN_AI_REQUEST_ID: f"req-{i // 4}",
                sc.SESSION_ID: f"s-{i // 40}",
                sc.TURN_INDEX: i % 10,
                sc.ENGINE_ID: "p0",
                sc.ENGINE_ROLE: sc.ROLE_PREFILL,
                sc.KV_DIRECTION: sc.DIRECTION_D2P,
                sc.KV_OUTCOME: sc.OUTCOMES[i % 6],
                sc.KV_PROMPT_TOKENS: 4000 + i,
                sc.KV_LOCAL_HIT_TOKENS: 100,
                sc.KV_REMOTE_TOKENS: 3900,
                sc.KV_PULLED_TOKENS: 3800,
                sc.KV_RECOMPUTED_TOKENS: 100,
                sc.KV_THRESHOLD: 64,
                sc.KV_EXPIRY_REMAINING_S: 470.5 - i * 1e-3,
                sc.KV_PEER_ENGINE_ID: "d0",
                sc.KV_LOAD_FAILURE_POLICY: "fail",
                sc.KV_EXPIRY_DEADLINE: 12345.678 + i,
            },
        ).end()
    return list(memory.get_finished_spans())


def batches(spans: list, size: int) -> list:
    return [spans[i : i + size] for i in range(0, len(spans), size)]


def bench_encode(chunks) -> tuple[float, list[bytes]]:
    t0 = time.perf_counter()
    bodies = [encode_spans(c).SerializeToString() for c in chunks]
    return time.perf_counter() - t0, bodies


def bench_parquet(chunks) -> float:
    directory = tempfile.mkdtemp()
    exporter = ParquetSpanExporter(directory)
    t0 = time.perf_counter()
    for c in chunks:
        exporter.export(c)
    exporter.shutdown()
    elapsed = time.perf_counter() - t0
    shutil.rmtree(directory)
    return elapsed


def bench_ingest(bodies: list[bytes], n_spans: int, admission: bool = True) -> tuple[float, list[float]]:
    """Seconds until every span is in Parquet, and each request's latency (s)."""
    directory = tempfile.mkdtemp()
    with Collector(directory, http_address="127.0.0.1:0", max_queue_spans=4 * n_spans) as collector:
        if not admission:
            collector.queue.space = None  # the baseline: no free-space check before queueing
        conn = http.client.HTTPConnection("127.0.0.1", collector.http_port)
        lat = []
        t0 = time.perf_counter()
        for body in bodies:
            r0 = time.perf_counter()
            conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
            resp = conn.getresponse()
            resp.read()
            lat.append(time.perf_counter() - r0)
            assert resp.status == 200, resp.status
        assert collector.flush(300)
        elapsed = time.perf_counter() - t0
        conn.close()
        assert collector.queue.stats.written_spans == n_spans
    shutil.rmtree(directory)
    return elapsed, lat


def bench_admission(chunk, reps: int = 20000) -> tuple[float, list[float]]:
    """One request's conversion (s, the baseline) and its disk admission's cost per call (s):
    the estimate (with its hour partitions), the reservation and its release."""
    from kvtrace.collect.otlp_convert import request_to_table
    from kvtrace.collect.queue import _partitions
    from kvtrace.store.diskspace import DiskSpace

    req = encode_spans(chunk)
    t0 = time.perf_counter()
    for _ in range(20):
        table, _, _ = request_to_table(req)
    convert = (time.perf_counter() - t0) / 20
    space = DiskSpace(tempfile.gettempdir(), min_free_bytes=64 << 20, refresh_s=0.5)
    out = []
    for _ in range(reps):
        a = time.perf_counter()
        need = space.estimate(table.nbytes, _partitions(table))
        space.reserve(need)
        space.release(need)
        out.append(time.perf_counter() - a)
    return convert, out


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def bench_e2e(chunks, n_spans: int) -> float:
    directory = tempfile.mkdtemp()
    with Collector(directory, http_address="127.0.0.1:0", max_queue_spans=4 * n_spans) as collector:
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{collector.http_port}/v1/traces")
        t0 = time.perf_counter()
        for c in chunks:
            assert exporter.export(c).name == "SUCCESS"
        assert collector.flush(300)
        elapsed = time.perf_counter() - t0
        exporter.shutdown()
    shutil.rmtree(directory)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=40000)
    parser.add_argument("--batch", type=int, default=512, help="spans per OTLP request (the SDK's default)")
    args = parser.parse_args()
    spans = make_spans(args.spans)
    chunks = batches(spans, args.batch)
    n = len(spans)
    t_encode, bodies = bench_encode(chunks)
    t_parquet = bench_parquet(chunks)
    t_ingest, lat_on = bench_ingest(bodies, n)
    lat_off: list[float] = []
    for rep in range(3):  # interleaved, so the machine's load falls on both alike
        lat_off += bench_ingest(bodies, n, admission=False)[1]
        if rep < 2:
            lat_on += bench_ingest(bodies, n)[1]
    t_e2e = bench_e2e(chunks, n)
    body_bytes = sum(map(len, bodies))
    rates = {
        "sdk_encode": n / t_encode,
        "parquet_direct": n / t_parquet,
        "otlp_http_ingest": n / t_ingest,
        "otlp_http_e2e": n / t_e2e,
    }
    print(f"spans={n} batch={args.batch} otlp_bytes_per_span={body_bytes / n:.0f}")
    for name, rate in rates.items():
        print(f"{name:18s} {rate:12,.0f} spans/s")
    print(f"ratio otlp_http_ingest / parquet_direct = {rates['otlp_http_ingest'] / rates['parquet_direct']:.2f}")
    print(f"ratio otlp_http_ingest / sdk_encode     = {rates['otlp_http_ingest'] / rates['sdk_encode']:.2f}")
    convert, admit = bench_admission(chunks[0])
    print(
        f"disk admission per request: p50 {_pct(admit, 0.5) * 1e6:.1f} us, p99 {_pct(admit, 0.99) * 1e6:.1f} us; "
        f"ratio to the request's conversion ({convert * 1e3:.2f} ms) p50 {_pct(admit, 0.5) / convert:.4f}"
    )
    for q in (0.5, 0.99):
        on, off = _pct(lat_on, q) * 1e3, _pct(lat_off, q) * 1e3
        print(
            f"request p{int(q * 100):<2d} with disk admission {on:.3f} ms, without {off:.3f} ms: ratio {on / off:.2f}"
        )


if __name__ == "__main__":
    main()
