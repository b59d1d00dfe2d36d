"""kvtrace.configure: resource, exporters chosen from arguments and environment."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

import kvtrace
from kvtrace import semconv as sc


def _exporters(provider):
    return [p.span_exporter for p in provider._active_span_processor._span_processors]


def test_configure_exports_with_resource(span_exporter, monkeypatch):
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("KVTRACE_SERVICE_NAME", raising=False)
    provider = kvtrace.configure(
        "kvtrace-test",
        exporters=[span_exporter],
        otlp="off",
        resource_attributes={sc.SUBSTRATE: sc.SUBSTRATE_SIM},
        handle_sigterm=False,
    )
    with provider.get_tracer("t").start_as_current_span("s"):
        pass
    provider.force_flush()
    (span,) = span_exporter.get_finished_spans()
    attrs = dict(span.resource.attributes)
    assert attrs[sc.SERVICE_NAME] == "kvtrace-test"
    assert attrs[sc.SUBSTRATE] == sc.SUBSTRATE_SIM
    assert len(attrs[sc.SERVICE_INSTANCE_ID]) == 32
    provider.shutdown()


def test_env_service_name_and_otlp_auto(monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    provider = kvtrace.configure("ignored", handle_sigterm=False)
    assert provider.resource.attributes[sc.SERVICE_NAME] == "from-env"
    assert [type(e) for e in _exporters(provider)] == [GrpcExporter]
    provider.shutdown()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    provider = kvtrace.configure("x", handle_sigterm=False)
    assert [type(e) for e in _exporters(provider)] == [HttpExporter]
    provider.shutdown()


def test_arguments_beat_environment(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("KVTRACE_OTLP", "on")
    provider = kvtrace.configure("x", otlp="off", handle_sigterm=False)
    assert _exporters(provider) == []
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    monkeypatch.delenv("KVTRACE_OTLP")
    assert _exporters(kvtrace.configure("x", handle_sigterm=False)) == []


def test_disable(monkeypatch, span_exporter):
    monkeypatch.setenv("KVTRACE_DISABLE", "1")
    assert _exporters(kvtrace.configure("x", exporters=[span_exporter], handle_sigterm=False)) == []
