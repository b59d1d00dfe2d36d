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
  ingest; client and server share the machine).
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


def bench_ingest(bodies: list[bytes], n_spans: int) -> float:
    directory = tempfile.mkdtemp()
    with Collector(directory, http_address="127.0.0.1:0", max_queue_spans=4 * n_spans) as collector:
        conn = http.client.HTTPConnection("127.0.0.1", collector.http_port)
        t0 = time.perf_counter()
        for body in bodies:
            conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200, resp.status
        assert collector.flush(300)
        elapsed = time.perf_counter() - t0
        conn.close()
        assert collector.queue.stats.written_spans == n_spans
    shutil.rmtree(directory)
    return elapsed


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
    t_ingest = bench_ingest(bodies, n)
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


if __name__ == "__main__":
    main()
