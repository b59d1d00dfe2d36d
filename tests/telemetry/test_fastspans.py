"""kvtrace.telemetry.fastspans: the spans a FastTracer exports are the SDK tracer's, field for field; it is
used only where that holds (default sampler and limits), else the SDK's tracer comes back."""

from __future__ import annotations

import logging

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from kvtrace import semconv as sc
from kvtrace.telemetry import fastspans


def _provider(**kwargs):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({sc.SERVICE_NAME: "svc"}), **kwargs)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _script(tracer) -> None:
    """Every operation the proxy uses, and the odd ones: a remote parent, events, statuses, odd values."""
    remote = trace.set_span_in_context(NonRecordingSpan(SpanContext(0xABC, 0xDEF, True, TraceFlags(1))))
    root = tracer.start_span(
        sc.SPAN_PROXY_REQUEST,
        context=remote,
        kind=SpanKind.SERVER,
        attributes={sc.HTTP_REQUEST_METHOD: "POST", sc.TURN_INDEX: 3},
    )
    root.set_attributes(
        {
            sc.SESSION_ID: "s",
            sc.PROXY_OFFER: True,
            sc.REQUEST_TTFT_MS: 1.5,
            sc.GEN_AI_RESPONSE_FINISH_REASONS: ["stop", "length"],
            sc.ENGINE_ID: None,
            sc.KV_PULLED_TOKENS: b"raw",
        }
    )
    leg = tracer.start_span(
        sc.SPAN_PROXY_PREFILL,
        context=trace.set_span_in_context(root),
        kind=SpanKind.CLIENT,
        attributes={sc.SERVER_PORT: 8100},
    )
    leg.set_status(Status(StatusCode.ERROR, "502"))
    leg.set_status(StatusCode.UNSET)  # ignored, as by the SDK
    leg.end()
    root.add_event(sc.EVENT_FIRST_TOKEN)
    root.add_event(sc.EVENT_UPSTREAM_ERROR, {sc.ERROR_TYPE: "x", sc.SERVER_PORT: 1})
    root.update_name(sc.SPAN_PROXY_REQUEST)
    root.set_status(StatusCode.OK)
    root.set_status(StatusCode.ERROR, "ignored after OK")
    root.end()
    with tracer.start_as_current_span(sc.SPAN_AGENT_TURN) as turn:
        turn.set_attribute(sc.TURN_INDEX, 1)
    with pytest.raises(ValueError):
        with tracer.start_as_current_span(sc.SPAN_AGENT_TOOL_CALL):
            raise ValueError("boom")


def _fields(span) -> dict:
    ctx, parent = span.context, span.parent
    return {
        "name": span.name,
        "kind": span.kind,
        "attributes": dict(span.attributes),
        "events": [(e.name, dict(e.attributes)) for e in span.events],
        "status": (span.status.status_code, span.status.description),
        "resource": span.resource,
        "scope": span.instrumentation_scope,
        "flags": ctx.trace_flags,
        "remote": ctx.is_remote,
        "root": parent is None,
        "trace": ctx.trace_id == 0xABC,
        "parent": parent.span_id == 0xDEF if parent is not None else None,
        "order": span.end_time >= span.start_time,
    }


def _exported(fast: bool) -> list[dict]:
    provider, exporter = _provider()
    tracer = fastspans.tracer(provider, "t", "1.0") if fast else provider.get_tracer("t", "1.0")
    assert isinstance(tracer, fastspans.FastTracer) == fast
    _script(tracer)
    return [_fields(s) for s in exporter.get_finished_spans()]


def test_fast_spans_export_what_the_sdk_exports():
    fast, sdk = _exported(True), _exported(False)
    assert len(fast) == 4
    for got, want in zip(fast, sdk, strict=True):
        if got["name"] == sc.SPAN_AGENT_TOOL_CALL:  # the exception's stack trace names the frame
            for events in (got["events"], want["events"]):
                for _, attrs in events:
                    attrs.pop("exception.stacktrace")
        assert got == want


def test_parent_links_and_sampling_follow_the_parent():
    provider, exporter = _provider()
    tracer = fastspans.tracer(provider, "t")
    unsampled = trace.set_span_in_context(NonRecordingSpan(SpanContext(5, 6, True, TraceFlags(0))))
    span = tracer.start_span("x", context=unsampled)
    assert not span.is_recording() and span.get_span_context().trace_id == 5
    span.end()
    root = tracer.start_span("root")
    child = tracer.start_span("child", context=trace.set_span_in_context(root))
    child.end()
    root.end()
    got = {s.name: s for s in exporter.get_finished_spans()}
    assert set(got) == {"root", "child"}
    assert got["child"].parent == got["root"].context and got["child"].context.trace_id == got["root"].context.trace_id
    assert got["root"].parent is None


def test_the_sdk_tracer_where_it_would_differ():
    for kwargs in ({"sampler": sampling.TraceIdRatioBased(0.5)}, {"span_limits": SpanLimits(max_attribute_length=8)}):
        provider, _ = _provider(**kwargs)
        assert not isinstance(fastspans.tracer(provider, "t"), fastspans.FastTracer)
    assert not isinstance(fastspans.tracer(trace.NoOpTracerProvider(), "t"), fastspans.FastTracer)


def _limited(fast: bool) -> tuple:
    provider, exporter = _provider(span_limits=SpanLimits(max_span_attributes=3, max_events=2, max_event_attributes=2))
    tracer = fastspans.tracer(provider, "t") if fast else provider.get_tracer("t")
    span = tracer.start_span("x", attributes={f"k{i}": i for i in range(5)})
    for i in range(4):
        span.add_event(f"e{i}", {f"a{j}": j for j in range(i)})
    span.end()
    (got,) = exporter.get_finished_spans()
    return (
        dict(got.attributes),
        got.dropped_attributes,
        got.dropped_events,
        [(e.name, dict(e.attributes), e.dropped_attributes) for e in got.events],
    )


def test_limits_as_the_sdk():
    assert (
        _limited(True)
        == _limited(False)
        == ({"k2": 2, "k3": 3, "k4": 4}, 2, 2, [("e2", {"a0": 0, "a1": 1}, 0), ("e3", {"a1": 1, "a2": 2}, 1)])
    )


def test_limits_and_ended_spans_as_the_sdk(caplog):
    provider, exporter = _provider(span_limits=SpanLimits(max_span_attributes=3, max_events=2))
    tracer = fastspans.tracer(provider, "t")
    assert isinstance(tracer, fastspans.FastTracer)
    span = tracer.start_span("x", attributes={f"k{i}": i for i in range(5)})
    for i in range(4):
        span.add_event(f"e{i}")
    span.end()
    caplog.set_level(logging.WARNING)
    span.set_attribute("late", 1)
    span.end()
    (got,) = exporter.get_finished_spans()
    assert dict(got.attributes) == {"k2": 2, "k3": 3, "k4": 4} and got.dropped_attributes == 2
    assert [e.name for e in got.events] == ["e2", "e3"]
    assert len([r for r in caplog.records if "ended span" in r.getMessage()]) == 2
