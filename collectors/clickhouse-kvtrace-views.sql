-- kvtrace's session lookup on the ClickHouse exporter's otel_traces table (kvtrace session lookup v1).
-- Generated from kvtrace/store/clickhouse/mviews.py; `kvtrace clickhouse init` runs the same
-- statements. Run it against the exporter's database, e.g.
--   clickhouse-client --database otel --multiquery < clickhouse-kvtrace-views.sql
-- The backfill (last two statements) may be rerun at any time: readers ignore repeated rows.

CREATE TABLE IF NOT EXISTS "otel_traces_kvtrace_sessions" (
    SessionId String CODEC(ZSTD(1)),
    TraceId String CODEC(ZSTD(1))
) ENGINE = ReplacingMergeTree
ORDER BY (SessionId, TraceId)
COMMENT 'kvtrace session lookup v1';

CREATE TABLE IF NOT EXISTS "otel_traces_kvtrace_traces" (
    TraceId String CODEC(ZSTD(1)),
    Start SimpleAggregateFunction(min, Int64),
    End SimpleAggregateFunction(max, Int64)
) ENGINE = AggregatingMergeTree
ORDER BY TraceId
COMMENT 'kvtrace session lookup v1';

CREATE MATERIALIZED VIEW IF NOT EXISTS "otel_traces_kvtrace_sessions_mv" TO "otel_traces_kvtrace_sessions"
AS SELECT DISTINCT arrayJoin(arrayDistinct(arrayFilter(s -> s != '', [SpanAttributes['session.id'], SpanAttributes['gen_ai.conversation.id'], SpanAttributes['langfuse.session.id'], SpanAttributes['traceloop.association.properties.session_id']]))) AS SessionId, TraceId FROM "otel_traces" WHERE TraceId != ''
COMMENT 'kvtrace session lookup v1';

CREATE MATERIALIZED VIEW IF NOT EXISTS "otel_traces_kvtrace_traces_mv" TO "otel_traces_kvtrace_traces"
AS SELECT TraceId, min(toUnixTimestamp64Nano(Timestamp)) AS Start, max(toUnixTimestamp64Nano(Timestamp) + toInt64(Duration)) AS End FROM "otel_traces" WHERE TraceId != '' GROUP BY TraceId SETTINGS aggregate_functions_null_for_empty = 0
COMMENT 'kvtrace session lookup v1';

INSERT INTO "otel_traces_kvtrace_sessions" (SessionId, TraceId) SELECT DISTINCT arrayJoin(arrayDistinct(arrayFilter(s -> s != '', [SpanAttributes['session.id'], SpanAttributes['gen_ai.conversation.id'], SpanAttributes['langfuse.session.id'], SpanAttributes['traceloop.association.properties.session_id']]))) AS SessionId, TraceId FROM "otel_traces" WHERE TraceId != '';

INSERT INTO "otel_traces_kvtrace_traces" (TraceId, Start, End) SELECT TraceId, min(toUnixTimestamp64Nano(Timestamp)) AS Start, max(toUnixTimestamp64Nano(Timestamp) + toInt64(Duration)) AS End FROM "otel_traces" WHERE TraceId != '' GROUP BY TraceId SETTINGS aggregate_functions_null_for_empty = 0;
