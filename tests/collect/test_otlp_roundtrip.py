"""OTLP round trip: kvtrace.configure's OTLP exporter (gRPC and HTTP/protobuf) -> kvtrace collect
-> Parquet gives exactly the rows kvtrace's own ParquetSpanExporter writes for the same spans."""

from __future__ import annotations

import base64
import json
import urllib.request

import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

import kvtrace
from kvtrace import semconv as sc
from kvtrace.collect import otlp_convert
from kvtrace.collect.server import Collector
from kvtrace.store.convert import spans_to_table, table_to_rows

from support.sim_workload import read_rows, run_workload, tmp_files

ENDPOINT_VARS = (
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "KVTRACE_OTLP",
    "KVTRACE_TRACES_DIR",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
)


@pytest.fixture
def collector(tmp_path):
    with Collector(tmp_path / "collected", grpc_address="127.0.0.1:0", http_address="127.0.0.1:0") as c:
        yield c


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ENDPOINT_VARS:
        monkeypatch.delenv(var, raising=False)


def _point_sdk_at(monkeypatch, collector: Collector, protocol: str) -> None:
    if protocol == "grpc":
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{collector.grpc_port}")
    else:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{collector.http_port}/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", protocol)


def _rich_spans(provider: TracerProvider) -> None:
    """Every kind, every attribute type, events, links, error status, trace state, nesting."""
    tracer = provider.get_tracer("kvtrace.test", "9.9")
    remote = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, True, TraceFlags(1), TraceState([("vendor", "v1")])
    )
    # the SDK's OTLP encoder drops a link's trace state, so the linked context carries none
    linked = SpanContext(remote.trace_id, 0x00F067AA0BA902B7, True, TraceFlags(1))
    attrs = {
        "s": "text",
        "i": -7,
        "big": 2**62,
        "f": 0.1,
        "whole": 3.0,
        "b": True,
        "no": False,
        "ss": ("a", "b"),
        "ii": (1, 2),
        "ff": (1.5, -0.25),
        "bb": (True, False),
    }
    with tracer.start_as_current_span(
        "root", context=set_span_in_context(NonRecordingSpan(remote)), kind=SpanKind.SERVER, attributes=attrs
    ) as root:
        root.add_event("ev", {"n": 1, "x": 2.5, "t": "y", "arr": ("p", "q")})
        root.add_event("bare")
        for kind in (SpanKind.CLIENT, SpanKind.PRODUCER, SpanKind.CONSUMER, SpanKind.INTERNAL):
            with tracer.start_as_current_span(
                f"child-{kind.name}", kind=kind, links=[Link(linked, {"why": "test", "n": 2})]
            ) as child:
                child.set_attribute(sc.TURN_INDEX, kind.value)
        with tracer.start_as_current_span("failing") as bad:
            bad.set_status(Status(StatusCode.ERROR, "boom"))
        with tracer.start_as_current_span("ok") as ok:
            ok.set_status(Status(StatusCode.OK))


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_configure_otlp_round_trip_equals_parquet_exporter(tmp_path, monkeypatch, collector, protocol):
    _point_sdk_at(monkeypatch, collector, protocol)
    direct = tmp_path / "direct"
    provider = kvtrace.configure(
        "kvtrace-test",
        traces_dir=direct,
        otlp=None,
        handle_sigterm=False,
        resource_attributes={sc.SUBSTRATE: sc.SUBSTRATE_SIM, "n": 3},
    )
    _rich_spans(provider)
    provider.shutdown()
    assert collector.flush(30)
    expected, got = read_rows(direct), read_rows(collector.traces_dir)
    assert len(expected) == 7
    assert got == expected
    resource = got[0]["ResourceAttributes"]
    assert resource[sc.SERVICE_NAME] == "kvtrace-test" and resource[sc.SUBSTRATE] == sc.SUBSTRATE_SIM
    assert resource[sc.SERVICE_INSTANCE_ID] and resource[sc.HOST_NAME]
    assert tmp_files(collector.traces_dir) == []


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_simulated_workload_round_trip(tmp_path, monkeypatch, collector, protocol):
    _point_sdk_at(monkeypatch, collector, protocol)
    run_workload(traces_dir=tmp_path / "direct", otlp="on", sessions=2, turns=2)
    assert collector.flush(30)
    expected, got = read_rows(tmp_path / "direct"), read_rows(collector.traces_dir)
    assert len(expected) >= 4 * 9
    assert got == expected
    engine = [r for r in got if r["SpanName"] == sc.SPAN_ENGINE_PREFILL]
    assert {r["ResourceAttributes"][sc.ENGINE_ROLE] for r in engine} == {sc.ROLE_PREFILL}
    assert all(r["SpanAttributes"][sc.ENGINE_ID] == r["ResourceAttributes"][sc.ENGINE_ID] for r in engine)
    assert len({r["ResourceAttributes"][sc.SERVICE_INSTANCE_ID] for r in got}) == 3


def test_gzip_http(tmp_path, monkeypatch, collector):
    _point_sdk_at(monkeypatch, collector, "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    provider = kvtrace.configure("gz", traces_dir=tmp_path / "direct", otlp="on", handle_sigterm=False)
    _rich_spans(provider)
    provider.shutdown()
    assert collector.flush(30)
    assert read_rows(collector.traces_dir) == read_rows(tmp_path / "direct")


def _hex_json(request) -> bytes:
    """An ExportTraceServiceRequest in OTLP/JSON (hex ids, as the spec and the JS/Go SDKs send it)."""
    doc = json_format.MessageToDict(request)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for obj in (span, *span.get("links", [])):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in obj:
                            obj[key] = base64.b64decode(obj[key]).hex()
    doc["unknownTopLevelField"] = {"ignored": True}
    return json.dumps(doc).encode()


def _post(url: str, body: bytes, ctype: str) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_http_json_round_trip(collector):
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    _rich_spans(provider)
    spans = memory.get_finished_spans()
    status, headers, body = _post(
        f"http://127.0.0.1:{collector.http_port}/v1/traces", _hex_json(encode_spans(spans)), "application/json"
    )
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert json.loads(body) == {}
    assert collector.flush(30)
    expected = sorted(table_to_rows(spans_to_table(spans)), key=lambda r: (r["TraceId"], r["SpanId"]))
    assert read_rows(collector.traces_dir) == expected


def test_any_value_every_type():
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

    kv = KeyValueList(values=[KeyValue(key="k", value=AnyValue(int_value=1))])
    cases = [
        (AnyValue(string_value="s"), "s"),
        (AnyValue(bool_value=True), True),
        (AnyValue(int_value=-3), -3),
        (AnyValue(double_value=0.5), 0.5),
        (AnyValue(bytes_value=b"\x00\xff"), b"\x00\xff"),
        (AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=1), AnyValue(string_value="x")])), [1, "x"]),
        (AnyValue(kvlist_value=kv), {"k": 1}),
        (AnyValue(), None),
    ]
    for value, expected in cases:
        got = otlp_convert.any_value(value)
        assert got == expected and type(got) is type(expected)
