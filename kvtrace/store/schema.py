"""The Parquet layout of a kvtrace trace store.

Columns follow the OpenTelemetry Collector ClickHouse exporter's ``otel_traces`` table, so the
files load into ClickHouse unchanged (``Events`` and ``Links`` are ClickHouse ``Nested`` columns,
stored as parallel ``Events.*`` / ``Links.*`` arrays).  ``SpanAttributes`` holds every attribute
as a string, exactly as that exporter writes it (arrays as JSON); two extra maps keep numeric
attributes typed so DuckDB never has to cast strings: ``SpanAttributesInt`` (int) and
``SpanAttributesFloat`` (float).  Booleans are ``"true"``/``"false"`` in ``SpanAttributes``.

Directory layout (Hive partitions by UTC date and hour of the span start)::

    DIR/date=2026-11-29/hour=18/<writer>-b000042.parquet     one exported batch
    DIR/date=2026-11-29/hour=18/<writer>-s000001-000042.parquet   a rolled segment

Files are written under a ``.tmp`` dot-name and renamed; readers never see partial files.
"""

from __future__ import annotations

import pyarrow as pa

STR_MAP = pa.map_(pa.string(), pa.string())
TS = pa.timestamp("ns", tz="UTC")

SCHEMA = pa.schema(
    [
        pa.field("Timestamp", TS, nullable=False),
        pa.field("TraceId", pa.string(), nullable=False),
        pa.field("SpanId", pa.string(), nullable=False),
        pa.field("ParentSpanId", pa.string(), nullable=False),
        pa.field("TraceState", pa.string(), nullable=False),
        pa.field("SpanName", pa.string(), nullable=False),
        pa.field("SpanKind", pa.string(), nullable=False),
        pa.field("ServiceName", pa.string(), nullable=False),
        pa.field("ResourceAttributes", STR_MAP, nullable=False),
        pa.field("ScopeName", pa.string(), nullable=False),
        pa.field("ScopeVersion", pa.string(), nullable=False),
        pa.field("SpanAttributes", STR_MAP, nullable=False),
        pa.field("Duration", pa.int64(), nullable=False),
        pa.field("StatusCode", pa.string(), nullable=False),
        pa.field("StatusMessage", pa.string(), nullable=False),
        pa.field("Events.Timestamp", pa.list_(TS), nullable=False),
        pa.field("Events.Name", pa.list_(pa.string()), nullable=False),
        pa.field("Events.Attributes", pa.list_(STR_MAP), nullable=False),
        pa.field("Links.TraceId", pa.list_(pa.string()), nullable=False),
        pa.field("Links.SpanId", pa.list_(pa.string()), nullable=False),
        pa.field("Links.TraceState", pa.list_(pa.string()), nullable=False),
        pa.field("Links.Attributes", pa.list_(STR_MAP), nullable=False),
        pa.field("SpanAttributesInt", pa.map_(pa.string(), pa.int64()), nullable=False),
        pa.field("SpanAttributesFloat", pa.map_(pa.string(), pa.float64()), nullable=False),
    ]
)

# ClickHouse exporter spellings (collector-contrib traceutil.SpanKindStr / StatusCodeStr), keyed
# by the Python SDK's enum values (SpanKind.INTERNAL = 0 ..., StatusCode.UNSET = 0 ...)
SPAN_KIND_UNSPECIFIED = "SPAN_KIND_UNSPECIFIED"
SPAN_KINDS = {
    0: "SPAN_KIND_INTERNAL",
    1: "SPAN_KIND_SERVER",
    2: "SPAN_KIND_CLIENT",
    3: "SPAN_KIND_PRODUCER",
    4: "SPAN_KIND_CONSUMER",
}
STATUS_CODES = {0: "STATUS_CODE_UNSET", 1: "STATUS_CODE_OK", 2: "STATUS_CODE_ERROR"}
