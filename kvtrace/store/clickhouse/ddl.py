"""The OTel Collector ClickHouse exporter's ``otel_traces`` table, and the DDL kvtrace recommends.

The Parquet layout (:mod:`kvtrace.store.schema`) is the exporter's ``otel_traces`` table plus two
typed attribute maps, so files load into a ClickHouse cluster unchanged::

    INSERT INTO otel.otel_traces SELECT * EXCEPT (SpanAttributesInt, SpanAttributesFloat)
    FROM file('trace.parquet', Parquet)

(or ``FROM s3(...)`` / ``url(...)``).  Spans the Collector writes there directly (collectors/
clickhouse.yaml) and archived kvtrace trace directories then answer every kvtrace view
(:mod:`.store`).  ``{table}`` is the table name (:func:`render` quotes it); constants are quoted by
:mod:`kvtrace.store.sql` (ClickHouse dialect: backslashes are escapes there).
"""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.store.sql import CLICKHOUSE, ident, literal

TABLE = "otel_traces"

# The exporter's DDL (exporter/clickhouseexporter/internal/sqltemplates/traces_table.sql of
# open-telemetry/opentelemetry-collector-contrib, bloom-filter variant), its placeholders filled:
# no cluster clause, MergeTree engine, no TTL.
TRACES_TABLE_DDL = """
CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta(8), ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration UInt64 CODEC(T64, ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    ResourceAttributeItems Array(String) ALIAS arrayMap(kv -> concat(kv.1, '=', kv.2),
        CAST(ResourceAttributes, 'Array(Tuple(String, String))')),
    SpanAttributeItems Array(String) ALIAS arrayMap(kv -> concat(kv.1, '=', kv.2),
        CAST(SpanAttributes, 'Array(Tuple(String, String))')),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_res_attr_value mapValues(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_value mapValues(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1,
    INDEX idx_lower_span_name lower(SpanName) TYPE tokenbf_v1(32768, 3, 0) GRANULARITY 8
) ENGINE = MergeTree
PARTITION BY toDate(Timestamp)
PRIMARY KEY (ServiceName, SpanName, toDateTime(Timestamp))
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1
"""

_Q = {
    k: literal(v, CLICKHOUSE)
    for k, v in (("sid", sc.SESSION_ID), ("cid", sc.GEN_AI_CONVERSATION_ID), ("rid", sc.GEN_AI_REQUEST_ID))
}
SESSION_ID_COLUMN, REQUEST_ID_COLUMN = "SessionId", "RequestId"
SESSION_ID_EXPR = (
    f"if(mapContains(SpanAttributes, {_Q['sid']}), SpanAttributes[{_Q['sid']}], SpanAttributes[{_Q['cid']}])"
)
"""The span's session id as a ClickHouse expression (empty when it has none)."""

# What kvtrace adds to that table for session and request lookups (docs/clickhouse.md): the two ids
# as materialized columns, each with a bloom filter skip index.
RECOMMENDED_DDL = (
    f"ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS {SESSION_ID_COLUMN} String MATERIALIZED {SESSION_ID_EXPR} "
    "CODEC(ZSTD(1))",
    f"ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS {REQUEST_ID_COLUMN} String "
    f"MATERIALIZED SpanAttributes[{_Q['rid']}] CODEC(ZSTD(1))",
    f"ALTER TABLE {{table}} ADD INDEX IF NOT EXISTS idx_session_id {SESSION_ID_COLUMN} TYPE bloom_filter(0.001) "
    "GRANULARITY 1",
    f"ALTER TABLE {{table}} ADD INDEX IF NOT EXISTS idx_request_id {REQUEST_ID_COLUMN} TYPE bloom_filter(0.001) "
    "GRANULARITY 1",
)
"""Statements (``{table}`` placeholder) that add kvtrace's session / request lookups to the table
(parts written before get them with ``ALTER TABLE ... MATERIALIZE COLUMN / INDEX``)."""

SESSION_PROJECTION_DDL = (
    f"ALTER TABLE {{table}} ADD PROJECTION IF NOT EXISTS by_session (SELECT * ORDER BY {SESSION_ID_COLUMN}, Timestamp)"
)
"""Optional: a copy of the table sorted by session (doubles the storage; a drill-down then reads
only the session's granules)."""

# A Parquet file, as written, into the exporter's table (the typed maps are kvtrace's extra).
INSERT_PARQUET = """
INSERT INTO {table}
SELECT * EXCEPT (SpanAttributesInt, SpanAttributesFloat) FROM file({path}, Parquet)
"""


def insert_parquet(path: str, table: str = TABLE) -> str:
    """INSERT of one Parquet file (a local path) into ``table``."""
    return render(INSERT_PARQUET, table).replace("{path}", literal(path, CLICKHOUSE))


def render(sql: str, table: str = TABLE) -> str:
    """A statement of this module for ``table`` (a plain or ``db.table`` name)."""
    return sql.replace("{table}", ident(table))
