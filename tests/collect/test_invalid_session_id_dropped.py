"""Spans arriving at the collector keep their rows, but a session id attribute that is not a
valid id (NUL, newline, too long) is dropped, counted and never stored raw."""

from __future__ import annotations

import logging

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from kvtrace import semconv as sc
from kvtrace.collect import otlp_convert
from kvtrace.collect.otlp_convert import request_to_table

IDS = ["good-1", "\x00\n\ufffd", "s\n| forged |", "x" * 300, "ok <b>"]


def _request() -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = sc.SERVICE_NAME, "sender"
    ss = rs.scope_spans.add()
    for i, sid in enumerate(IDS):
        span = ss.spans.add(name=f"op-{i}", start_time_unix_nano=1_700_000_000_000_000_000 + i)
        span.trace_id = (i + 1).to_bytes(16, "big")
        span.span_id = (i + 1).to_bytes(8, "big")
        for key in (sc.SESSION_ID, sc.GEN_AI_CONVERSATION_ID):
            a = span.attributes.add()
            a.key, a.value.string_value = key, sid
        a = span.attributes.add()
        a.key, a.value.int_value = sc.TURN_INDEX, i
    return req


def test_invalid_session_ids_are_dropped_and_counted(caplog):
    otlp_convert.INVALID_SESSION_IDS.reset()
    with caplog.at_level(logging.WARNING, logger="kvtrace.store"):
        table, rejected, _ = request_to_table(_request())
    assert rejected == 0 and table.num_rows == len(IDS)
    attrs = [dict(m) for m in table.column("SpanAttributes").to_pylist()]
    kept = {"good-1", "ok <b>"}
    assert attrs == [
        {**({sc.SESSION_ID: sid, sc.GEN_AI_CONVERSATION_ID: sid} if sid in kept else {}), sc.TURN_INDEX: str(i)}
        for i, sid in enumerate(IDS)
    ]
    assert otlp_convert.INVALID_SESSION_IDS.total == 2 * (len(IDS) - len(kept))
    (line,) = [r.getMessage() for r in caplog.records]  # one line, then rate-limited; never the value
    assert line.startswith(
        f"kvtrace collect: dropped 1 invalid session id attribute(s) ({sc.SESSION_ID} holds a non-printable "
        "character (U+0000))"
    )
