"""Attribute values land under their own keys whatever the mix of types in one batch."""

from __future__ import annotations

import base64
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
        {
            sc.GEN_AI_RESPONSE_FINISH_REASONS: json.dumps(["stop"], separators=(",", ":")),
            sc.PROXY_OFFER: "false",
            sc.KV_PULLED_TOKENS: str(2**70),
        },
        {
            sc.PROXY_OFFER: "true",
            sc.GEN_AI_RESPONSE_FINISH_REASONS: json.dumps(["length", "stop"], separators=(",", ":")),
            sc.REQUEST_TTFT_MS: "1.5",
        },
        {sc.KV_PULLED_TOKENS: "7", sc.PROXY_OFFER_REASON: "no_entry", sc.PROXY_OFFER: "false"},
    ]
    assert [r["SpanAttributesInt"] for r in rows] == [{}, {}, {sc.KV_PULLED_TOKENS: 7}]
    assert [r["SpanAttributesFloat"] for r in rows] == [{}, {sc.REQUEST_TTFT_MS: 1.5}, {}]


# -- one bad value never costs a batch ---------------------------------------

import logging  # noqa: E402

import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.trace import SpanContext, Status, StatusCode  # noqa: E402
from opentelemetry.trace.span import TraceFlags  # noqa: E402

from kvtrace.store import files, sanitise  # noqa: E402
from kvtrace.store.exporter import ParquetSpanExporter  # noqa: E402
from kvtrace.store.schema import SCHEMA  # noqa: E402

BAD = "conv-\ud800-x"  # an unpaired surrogate: a valid Python str with no UTF-8 form
ESCAPED = "conv-\\ud800-x"  # what is stored: the surrogate as the six characters \ud800


@pytest.fixture(autouse=True)
def _fresh_bad_value_logs():
    sanitise.BAD_VALUES.reset()
    sanitise.DROPPED_SPANS.reset()
    yield


def _good(i: int) -> dict:
    return {
        sc.GEN_AI_CONVERSATION_ID: f"conv-{i}",
        sc.TURN_INDEX: i,
        sc.REQUEST_TTFT_MS: i / 4,
        sc.PROXY_OFFER: i % 2 == 0,
        sc.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",),
    }


def _export(spans, directory) -> list[dict]:
    exporter = ParquetSpanExporter(directory)
    assert exporter.export(spans).name == "SUCCESS"
    exporter.shutdown()
    rows = []
    for path in files.list_files(directory):
        rows += table_to_rows(pq.read_table(path, partitioning=None).select(SCHEMA.names).cast(SCHEMA))
    return sorted(rows, key=lambda r: r["Timestamp"])


def _store_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kvtrace.store" and r.levelno == logging.WARNING]


def test_one_bad_attribute_value_keeps_the_whole_batch(tmp_path, caplog):
    """300 good spans + 1 whose conversation id holds "\\ud800": 301 rows (before: the export
    failed and all 301 were lost); the bad value is stored escaped, every other value as is;
    one log line, naming the attribute (not the value)."""
    attrs = [_good(i) for i in range(300)]
    attrs.insert(150, {**_good(150), sc.GEN_AI_CONVERSATION_ID: BAD})
    caplog.set_level(logging.WARNING, logger="kvtrace.store")
    rows = _export(_spans(attrs), tmp_path / "bad")
    assert len(rows) == 301
    attrs[150][sc.GEN_AI_CONVERSATION_ID] = ESCAPED  # the same batch, written with the escape
    control = _export(_spans(attrs), tmp_path / "control")
    for column in ("SpanAttributes", "SpanAttributesInt", "SpanAttributesFloat", "SpanName"):
        assert [r[column] for r in rows] == [r[column] for r in control], column
    assert rows[150]["SpanAttributes"][sc.GEN_AI_CONVERSATION_ID] == ESCAPED
    assert rows[149]["SpanAttributes"][sc.GEN_AI_CONVERSATION_ID] == "conv-149"
    warnings = _store_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert f"SpanAttributes[{sc.GEN_AI_CONVERSATION_ID!r}]" in warnings[0] and "\ud800" not in warnings[0]
    assert sanitise.BAD_VALUES.total == 1


def test_the_log_is_rate_limited_across_batches(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kvtrace.store")
    exporter = ParquetSpanExporter(tmp_path)
    for _ in range(3):  # three batches
        assert exporter.export(_spans([_good(1), {sc.SESSION_ID: BAD}])).name == "SUCCESS"
    exporter.shutdown()
    assert len(_store_warnings(caplog)) == 1
    assert sanitise.BAD_VALUES.total == 3


def _bad_everywhere():
    """Spans with the bad string in every text column the SDK lets it reach."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({sc.SERVICE_NAME: "svc-" + BAD, sc.ENGINE_ID: BAD}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t\ud800", "1.0\ud800")
    with tracer.start_as_current_span("op-" + BAD, attributes={sc.SESSION_ID + "\ud800": "v"}) as span:
        span.add_event(sc.EVENT_FIRST_TOKEN + BAD, {sc.TURN_INDEX: BAD})
        span.set_attribute(sc.GEN_AI_RESPONSE_FINISH_REASONS, ("stop", BAD))
        span.set_status(Status(StatusCode.ERROR, "failed: " + BAD))
    tracer.start_span(sc.SPAN_PROXY_REQUEST, attributes=_good(7)).end()
    return exporter.get_finished_spans()


def test_bad_text_in_any_column_is_escaped_not_fatal(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kvtrace.store")
    bad, good = _export(_bad_everywhere(), tmp_path)
    assert bad["SpanName"] == "op-" + ESCAPED
    assert bad["ServiceName"] == "svc-" + ESCAPED
    assert bad["ResourceAttributes"][sc.ENGINE_ID] == ESCAPED
    assert (bad["ScopeName"], bad["ScopeVersion"]) == ("t\\ud800", "1.0\\ud800")
    assert bad["SpanAttributes"] == {
        sc.SESSION_ID + "\\ud800": "v",
        sc.GEN_AI_RESPONSE_FINISH_REASONS: '["stop","' + ESCAPED + '"]',
    }
    assert bad["Events.Name"] == [sc.EVENT_FIRST_TOKEN + ESCAPED]
    assert bad["Events.Attributes"] == [{sc.TURN_INDEX: ESCAPED}]
    assert bad["StatusMessage"] == "failed: " + ESCAPED
    assert good["SpanName"] == sc.SPAN_PROXY_REQUEST and good["SpanAttributesInt"] == {sc.TURN_INDEX: 7}
    assert len(_store_warnings(caplog)) == 1  # nine bad columns, one line


def test_non_text_values_are_stringified_and_undumpable_ones_named(tmp_path):
    """Spans from outside the SDK (public-property path) can carry any object."""

    class Unprintable:
        def __str__(self):
            raise RuntimeError("no")

    cyclic: list = []
    cyclic.append(cyclic)
    base = _spans([{sc.TURN_INDEX: 1}])[0]
    odd = ReadableSpan(
        name="odd",
        context=base.context,
        resource=base.resource,
        attributes={
            sc.SESSION_ID: Unprintable(),
            sc.TURN_INDEX: b"\xff\xfe",
            sc.ENGINE_ID: cyclic,
            sc.PROXY_OFFER: {(1, 2): "tuple key"},
        },
        start_time=base.start_time,
        end_time=base.end_time,
    )
    table = spans_to_table([odd, base])
    attrs = table_to_rows(table)[0]["SpanAttributes"]
    assert attrs[sc.SESSION_ID] == "<unconvertible Unprintable>"
    assert attrs[sc.TURN_INDEX] == base64.b64encode(b"\xff\xfe").decode()  # bytes: base64, as always
    assert attrs[sc.ENGINE_ID] == "[[...]]"  # json.dumps refuses a cycle: str() of it
    assert attrs[sc.PROXY_OFFER] == "{(1, 2): 'tuple key'}"


def test_a_span_that_cannot_be_converted_at_all_is_dropped_alone(tmp_path, caplog):
    """Should a span defeat conversion entirely (here: a start time that is not a number),
    only that span is dropped; its 300 batch mates are written; one log line."""
    caplog.set_level(logging.WARNING, logger="kvtrace.store")
    good = _spans([_good(i) for i in range(300)])
    broken = ReadableSpan(
        name="broken", context=SpanContext(1, 2, False, TraceFlags(1)), start_time="not a time", end_time=None
    )
    rows = _export([*good[:100], broken, *good[100:]], tmp_path)
    assert len(rows) == 300
    assert [r["SpanAttributes"][sc.GEN_AI_CONVERSATION_ID] for r in rows] == [f"conv-{i}" for i in range(300)]
    warnings = _store_warnings(caplog)
    assert len(warnings) == 1 and "'broken'" in warnings[0] and "dropped" in warnings[0]
