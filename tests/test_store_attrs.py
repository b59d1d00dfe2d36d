"""Attribute values land under their own keys whatever the mix of types in one batch."""

from __future__ import annotations

import json

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvtrace import semconv as sc
from kvtrace.store.convert import spans_to_table, table_to_rows


def _spans(attribute_dicts):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    for attrs in attribute_dicts:
        tracer.start_span(sc.SPAN_PROXY_REQUEST, attributes=attrs).end()
    return exporter.get_finished_spans()


def test_mixed_types_keep_their_keys():
    # sequences before bools in one span, the reverse in the next, big ints and floats around them
    batch = [
        {sc.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",), sc.PROXY_OFFER: False, sc.KV_PULLED_TOKENS: 2**70},
        {sc.PROXY_OFFER: True, sc.GEN_AI_RESPONSE_FINISH_REASONS: ("length", "stop"), sc.REQUEST_TTFT_MS: 1.5},
        {sc.KV_PULLED_TOKENS: 7, sc.PROXY_OFFER_REASON: "no_entry", sc.PROXY_OFFER: False},
    ]
    rows = table_to_rows(spans_to_table(_spans(batch)))
    assert [r["SpanAttributes"] for r in rows] == [
        {sc.GEN_AI_RESPONSE_FINISH_REASONS: json.dumps(["stop"], separators=(",", ":")), sc.PROXY_OFFER: "false", sc.KV_PULLED_TOKENS: str(2**70)},
        {sc.PROXY_OFFER: "true", sc.GEN_AI_RESPONSE_FINISH_REASONS: json.dumps(["length", "stop"], separators=(",", ":")), sc.REQUEST_TTFT_MS: "1.5"},
        {sc.KV_PULLED_TOKENS: "7", sc.PROXY_OFFER_REASON: "no_entry", sc.PROXY_OFFER: "false"},
    ]
    assert [r["SpanAttributesInt"] for r in rows] == [{}, {}, {sc.KV_PULLED_TOKENS: 7}]
    assert [r["SpanAttributesFloat"] for r in rows] == [{}, {sc.REQUEST_TTFT_MS: 1.5}, {}]
