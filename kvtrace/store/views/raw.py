"""The raw relation every view reads: ``kvtrace_raw``, its columns, how it reads trace files, and
the ``spans`` view's SELECT over it (or over any relation with its columns: the reader's unindexed
files, :mod:`kvtrace.store.scan_index`'s one file)."""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.store.sql import int_attr as _i
from kvtrace.store.sql import str_attr as _s
from kvtrace.store.sql import str_attr_or_resource as _sr
from kvtrace.store.views.registry import (
    BIGINT,
    INTEGER,
    SPAN_KIND_VALUES,
    STATUS_CODE_VALUES,
    VARCHAR,
    Column,
    col,
)

RAW = "kvtrace_raw"
"""The relation over the directory's files (:mod:`kvtrace.store.reader` defines it)."""


def read_files(files: str = "$files") -> str:
    """How ``RAW`` reads trace files: ``files`` is a list expression of DuckDB globs, one per file."""
    return (
        f"SELECT * FROM read_parquet({files}, hive_partitioning = true, union_by_name = true, "
        "hive_types = {'date': DATE, 'hour': INTEGER})"
    )


READ_FILES = read_files()
"""How ``RAW`` reads trace files (``$files``: one DuckDB glob per file)."""

_STR_MAP, _TS_NS = "MAP(VARCHAR, VARCHAR)", "TIMESTAMPTZ_NS"
RAW_COLUMNS: tuple[Column, ...] = (
    col("Timestamp", _TS_NS, "span start (ns precision)"),
    col("TraceId", VARCHAR, "trace id, hex"),
    col("SpanId", VARCHAR, "span id, hex"),
    col("ParentSpanId", VARCHAR, "parent span id, hex (`''` for roots)"),
    col("TraceState", VARCHAR, "W3C tracestate"),
    col("SpanName", VARCHAR, "span name"),
    col("SpanKind", VARCHAR, "span kind", SPAN_KIND_VALUES),
    col("ServiceName", VARCHAR, "resource `service.name`"),
    col("ResourceAttributes", _STR_MAP, "resource attributes"),
    col("ScopeName", VARCHAR, "instrumentation scope name"),
    col("ScopeVersion", VARCHAR, "instrumentation scope version"),
    col("SpanAttributes", _STR_MAP, "every attribute as a string (bools `true`/`false`, arrays JSON)"),
    col("Duration", BIGINT, "span duration, ns"),
    col("StatusCode", VARCHAR, "span status", STATUS_CODE_VALUES),
    col("StatusMessage", VARCHAR, "status description"),
    col("Events.Timestamp", f"{_TS_NS}[]", "event times (one entry per event, parallel lists)"),
    col("Events.Name", "VARCHAR[]", "event names"),
    col("Events.Attributes", f"{_STR_MAP}[]", "event attributes"),
    col("Links.TraceId", "VARCHAR[]", "linked trace ids (one entry per link, parallel lists)"),
    col("Links.SpanId", "VARCHAR[]", "linked span ids"),
    col("Links.TraceState", "VARCHAR[]", "linked trace states"),
    col("Links.Attributes", f"{_STR_MAP}[]", "link attributes"),
    col("SpanAttributesInt", "MAP(VARCHAR, BIGINT)", "the int attributes, typed"),
    col("SpanAttributesFloat", "MAP(VARCHAR, DOUBLE)", "the float attributes, typed"),
    col("date", "DATE", "Hive partition: UTC date of the span start"),
    col("hour", INTEGER, "Hive partition: UTC hour of the span start"),
)

_SPANS_SELECT = f"""
SELECT r.*,
  TraceId AS trace_id, SpanId AS span_id, ParentSpanId AS parent_span_id, SpanName AS name,
  SpanKind AS kind, ServiceName AS service_name,
  CAST(Timestamp AS TIMESTAMPTZ) AS start_time,
  CAST(Timestamp AS TIMESTAMPTZ) + to_microseconds(Duration // 1000) AS end_time,
  epoch_ns(Timestamp) AS start_ns, epoch_ns(Timestamp) + Duration AS end_ns,
  Duration / 1e6 AS duration_ms, StatusCode AS status_code,
  COALESCE({_s(sc.SESSION_ID)}, {_s(sc.GEN_AI_CONVERSATION_ID)}) AS session_id,
  {_s(sc.GEN_AI_REQUEST_ID)} AS request_id,
  CAST({_i(sc.TURN_INDEX)} AS INTEGER) AS turn,
  {_sr(sc.ENGINE_ID)} AS engine_id, {_sr(sc.ENGINE_ROLE)} AS engine_role,
  {_sr(sc.SUBSTRATE)} AS substrate
FROM {{raw}} AS r
"""


def spans_sql(raw: str) -> str:
    """The ``spans`` view's SELECT over relation ``raw`` (one with :data:`RAW`'s columns)."""
    return _SPANS_SELECT.replace("{raw}", raw)
