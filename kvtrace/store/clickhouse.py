"""The ClickHouse path: kvtrace's Parquet files in the OTel Collector ClickHouse exporter's table.

The Parquet layout (:mod:`kvtrace.store.schema`) is the exporter's ``otel_traces`` table plus two
typed attribute maps, so files load into a ClickHouse cluster unchanged::

    INSERT INTO otel.otel_traces SELECT * EXCEPT (SpanAttributesInt, SpanAttributesFloat)
    FROM file('trace.parquet', Parquet)

(or ``FROM s3(...)`` / ``url(...)``).  Spans the Collector writes there directly (collectors/
clickhouse.yaml) and archived kvtrace trace directories then answer the same queries.  The
session-level queries below read only the exporter's columns (every attribute as a string in
``SpanAttributes``), so they work on a table filled by either; ``tests/test_clickhouse_chdb.py``
runs them in chDB and checks them against the DuckDB views.  ``{table}`` is the table name
(:func:`render` quotes it); constants are quoted by :mod:`kvtrace.store.sql` (ClickHouse dialect:
backslashes are escapes there).
"""

from __future__ import annotations

import functools

from kvtrace import semconv as sc
from kvtrace.store.sql import CLICKHOUSE, ident, literal

TABLE = "otel_traces"

# The exporter's DDL (exporter/clickhouseexporter/internal/sql_templates/traces_table.sql of
# open-telemetry/opentelemetry-collector-contrib), with its placeholders filled: no cluster
# clause, MergeTree engine, no TTL.
TRACES_TABLE_DDL = """
CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
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
    Duration UInt64 CODEC(ZSTD(1)),
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
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_res_attr_value mapValues(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_value mapValues(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
) ENGINE = MergeTree
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp))
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1
"""

# A Parquet file, as written, into the exporter's table (the typed maps are kvtrace's extra).
INSERT_PARQUET = """
INSERT INTO {table}
SELECT * EXCEPT (SpanAttributesInt, SpanAttributesFloat) FROM file({path}, Parquet)
"""


_q = functools.partial(literal, dialect=CLICKHOUSE)


def _attr(key: str) -> str:
    return f"SpanAttributes[{_q(key)}]"


def _int(key: str) -> str:
    return f"toInt64OrNull(nullIf({_attr(key)}, ''))"


_SESSION = f"coalesce(nullIf({_attr(sc.SESSION_ID)}, ''), nullIf({_attr(sc.GEN_AI_CONVERSATION_ID)}, ''))"

# Per session: proxied requests, turns, tokens, wall time (proxy SERVER spans).
SESSION_REQUESTS = f"""
SELECT {_SESSION} AS session_id,
       count() AS requests,
       uniqExact({_int(sc.TURN_INDEX)}) AS turns,
       sum({_int(sc.GEN_AI_USAGE_INPUT_TOKENS)}) AS input_tokens,
       sum({_int(sc.GEN_AI_USAGE_OUTPUT_TOKENS)}) AS output_tokens,
       toInt64(toUnixTimestamp64Nano(min(Timestamp))) AS start_ns,
       toInt64(max(toUnixTimestamp64Nano(Timestamp) + Duration)) AS end_ns
FROM {{table}}
WHERE SpanName = {_q(sc.SPAN_PROXY_REQUEST)} AND session_id IS NOT NULL
GROUP BY session_id
ORDER BY session_id
"""

# Per session and decision outcome on prefill workers (d2p: the bidirectional pull decision).
SESSION_DECISIONS = f"""
SELECT {_SESSION} AS session_id,
       {_attr(sc.KV_OUTCOME)} AS outcome,
       count() AS decisions,
       sum({_int(sc.KV_PROMPT_TOKENS)}) AS prompt_tokens,
       sum({_int(sc.KV_PULLED_TOKENS)}) AS pulled_tokens,
       sum({_int(sc.KV_RECOMPUTED_TOKENS)}) AS recomputed_tokens
FROM {{table}}
WHERE SpanName = {_q(sc.SPAN_KV_DECISION)} AND {_attr(sc.KV_DIRECTION)} = {_q(sc.DIRECTION_D2P)}
GROUP BY session_id, outcome
ORDER BY session_id, outcome
"""

# Per session and direction: KV moved.
SESSION_TRANSFERS = f"""
SELECT {_SESSION} AS session_id,
       {_attr(sc.KV_DIRECTION)} AS direction,
       count() AS transfers,
       sum({_int(sc.KV_TRANSFER_TOKENS)}) AS tokens,
       sum({_int(sc.KV_TRANSFER_BYTES)}) AS bytes
FROM {{table}}
WHERE SpanName = {_q(sc.SPAN_KV_TRANSFER)}
GROUP BY session_id, direction
ORDER BY session_id, direction
"""

# Per session: KV memory D held for the next turn.
SESSION_RETENTION = f"""
SELECT {_SESSION} AS session_id,
       count() AS retentions,
       sum({_int(sc.KV_RETENTION_BYTES)}) AS bytes,
       sum({_int(sc.KV_RETENTION_BYTES)} * (Duration / 1e9)) AS byte_seconds
FROM {{table}}
WHERE SpanName = {_q(sc.SPAN_KV_RETENTION)}
GROUP BY session_id
ORDER BY session_id
"""

SESSION_QUERIES: dict[str, str] = {
    "requests": SESSION_REQUESTS,
    "decisions": SESSION_DECISIONS,
    "transfers": SESSION_TRANSFERS,
    "retention": SESSION_RETENTION,
}
"""Name -> ClickHouse SQL with a ``{table}`` placeholder."""


# The same four results from kvtrace's DuckDB views (kvtrace.store.views), for comparison.
DUCKDB_SESSION_QUERIES: dict[str, str] = {
    "requests": """
SELECT session_id, count(*) AS requests, count(DISTINCT turn) AS turns, sum(input_tokens) AS input_tokens,
       sum(output_tokens) AS output_tokens, min(start_ns) AS start_ns, max(end_ns) AS end_ns
FROM requests WHERE session_id IS NOT NULL GROUP BY session_id ORDER BY session_id
""",
    "decisions": f"""
SELECT session_id, outcome, count(*) AS decisions, sum(prompt_tokens) AS prompt_tokens,
       sum(pulled_tokens) AS pulled_tokens, sum(recomputed_tokens) AS recomputed_tokens
FROM kv_decisions WHERE direction = {literal(sc.DIRECTION_D2P)}
GROUP BY session_id, outcome ORDER BY session_id, outcome
""",
    "transfers": """
SELECT session_id, direction, count(*) AS transfers, sum(tokens) AS tokens, sum(bytes) AS bytes
FROM kv_transfers GROUP BY session_id, direction ORDER BY session_id, direction
""",
    "retention": """
SELECT session_id, count(*) AS retentions, sum(bytes) AS bytes, sum(byte_seconds) AS byte_seconds
FROM kv_retention GROUP BY session_id ORDER BY session_id
""",
}


def insert_parquet(path: str, table: str = TABLE) -> str:
    """INSERT of one Parquet file (a local path) into ``table``."""
    return render(INSERT_PARQUET, table).replace("{path}", literal(path, CLICKHOUSE))


def render(sql: str, table: str = TABLE) -> str:
    """A query of this module for ``table`` (a plain or ``db.table`` name)."""
    return sql.replace("{table}", ident(table))
