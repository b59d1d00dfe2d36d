"""What bidirectional reuse costs in memory: KV bytes D holds for next turns.

Each ``kv.retention`` span is one finished request's blocks pinned on a decode worker from its
start until they were read by the next turn's P (``read``), timed out (``expired``) or were freed
(``released``).  From them:

- :func:`series`: bytes held per engine over time, a step series (value from ``t`` until the next
  point), built by a sweep of +bytes/−bytes events; downsampled to at most ``max_points`` per
  engine by keeping each bucket's maximum (peaks are what matter for capacity) and the engine's
  last point (where the series ends, usually back at 0);
- :func:`summary`: per engine, pinned requests, byte·seconds, peak bytes, expiries, and blocks
  held but never read (outcome expired or released).

A time range or a session reads only the spans its rows can be (on DuckDB:
:func:`kvtrace.analysis.pushdown.request_scoped`; a row overlaps the range, and its span is whole
within its request's bounds).
"""

from __future__ import annotations

import pyarrow as pa

from kvtrace import semconv as sc
from kvtrace.analysis.common import one, rows, table
from kvtrace.analysis.filters import RETENTION_SCOPE, Filters, where
from kvtrace.analysis.pushdown import request_scoped
from kvtrace.store.sql import literal

_EVENTS = """
    SELECT engine_id, start_ns AS t, bytes AS d, blocks AS db FROM r
    UNION ALL
    SELECT engine_id, end_ns, -bytes, -blocks FROM r
"""

SERIES_SQL = f"""
WITH r AS (SELECT * FROM kv_retention {{where}}),
ev AS ({_EVENTS}),
pts AS (SELECT engine_id, t, sum(d)::BIGINT AS d, sum(db)::BIGINT AS db FROM ev GROUP BY engine_id, t),
s AS (
    SELECT engine_id, t,
           (sum(d) OVER run)::BIGINT AS bytes_held, (sum(db) OVER run)::BIGINT AS blocks_held
    FROM pts
    WINDOW run AS (PARTITION BY engine_id ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
),
b AS (
    SELECT engine_id, t, bytes_held, blocks_held,
           CASE WHEN $bucket_ns <= 0 THEN (row_number() OVER (PARTITION BY engine_id ORDER BY t))::BIGINT
                WHEN t = max(t) OVER (PARTITION BY engine_id) THEN 9223372036854775807::BIGINT
                ELSE (t - min(t) OVER (PARTITION BY engine_id)) // $bucket_ns END AS bucket
    FROM s
)
SELECT engine_id, min(t) AS t, max(bytes_held) AS bytes_held, max(blocks_held) AS blocks_held
FROM b GROUP BY engine_id, bucket ORDER BY engine_id, t
"""

SPAN_SQL = "SELECT min(start_ns) AS t0, max(end_ns) AS t1, count(*) AS n FROM kv_retention {where}"

SUMMARY_SQL = f"""
WITH r AS (SELECT * FROM kv_retention {{where}}),
ev AS ({_EVENTS}),
pts AS (SELECT engine_id, t, sum(d)::BIGINT AS d FROM ev GROUP BY engine_id, t),
s AS (
    SELECT engine_id, (sum(d) OVER (PARTITION BY engine_id ORDER BY t
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))::BIGINT AS held
    FROM pts
),
peak AS (SELECT engine_id, max(held) AS peak_bytes FROM s GROUP BY engine_id),
agg AS (
    SELECT engine_id, count(*) AS retained,
           count(*) FILTER (WHERE outcome = {literal(sc.RETENTION_READ)}) AS read,
           count(*) FILTER (WHERE outcome = {literal(sc.RETENTION_EXPIRED)}) AS expired,
           count(*) FILTER (WHERE outcome = {literal(sc.RETENTION_RELEASED)}) AS released,
           sum(blocks)::BIGINT AS blocks, sum(bytes)::BIGINT AS bytes,
           coalesce(sum(blocks) FILTER (WHERE outcome IS DISTINCT FROM {literal(sc.RETENTION_READ)}), 0)::BIGINT
               AS blocks_never_read,
           coalesce(sum(bytes) FILTER (WHERE outcome IS DISTINCT FROM {literal(sc.RETENTION_READ)}), 0)::BIGINT
               AS bytes_never_read,
           sum(byte_seconds) AS byte_seconds, avg(held_s) AS mean_held_s, max(held_s) AS max_held_s
    FROM r GROUP BY engine_id
)
SELECT agg.*, peak.peak_bytes FROM agg JOIN peak USING (engine_id) ORDER BY engine_id
"""

TOTALS_SQL = f"""
WITH s AS ({SUMMARY_SQL})
SELECT coalesce(sum(retained), 0)::BIGINT AS retained, coalesce(sum(read), 0)::BIGINT AS read,
       coalesce(sum(expired), 0)::BIGINT AS expired, coalesce(sum(released), 0)::BIGINT AS released,
       coalesce(sum(bytes), 0)::BIGINT AS bytes, coalesce(sum(blocks_never_read), 0)::BIGINT AS blocks_never_read,
       coalesce(sum(bytes_never_read), 0)::BIGINT AS bytes_never_read,
       coalesce(sum(byte_seconds), 0) AS byte_seconds, coalesce(sum(peak_bytes), 0)::BIGINT AS peak_bytes_sum
FROM s
"""

EXPIRIES_SQL = f"""
SELECT session_id, turn, request_id, engine_id, blocks, bytes, ttl_s, held_s, start_ns, end_ns
FROM kv_retention WHERE outcome = {literal(sc.RETENTION_EXPIRED)} {{where}}
ORDER BY end_ns LIMIT $limit
"""


def series(con, filters: Filters | None = None, max_points: int = 2000) -> pa.Table:
    """Bytes (and blocks) held per engine over time: columns engine_id, t (ns), bytes_held,
    blocks_held; at most about ``max_points`` points per engine (bucket maxima)."""
    clause, params = where(filters, RETENTION_SCOPE)
    con = request_scoped(con, filters)
    span = one(con, SPAN_SQL.format(where=clause), params)
    bucket_ns = 0
    if span.get("n") and 2 * span["n"] > max_points and span["t1"] > span["t0"]:
        bucket_ns = max(1, (span["t1"] - span["t0"]) // max(1, max_points - 1))
    return table(con, SERIES_SQL.format(where=clause), {**params, "bucket_ns": bucket_ns})


def summary(con, filters: Filters | None = None) -> list[dict]:
    """Per decode engine: retained requests, read/expired/released counts, bytes, byte·seconds,
    peak bytes, blocks and bytes never read, mean/max hold time."""
    clause, params = where(filters, RETENTION_SCOPE)
    return rows(request_scoped(con, filters), SUMMARY_SQL.format(where=clause), params)


def totals(con, filters: Filters | None = None) -> dict:
    """:func:`summary` summed over engines (``peak_bytes_sum``: sum of per-engine peaks)."""
    clause, params = where(filters, RETENTION_SCOPE)
    return one(request_scoped(con, filters), TOTALS_SQL.format(where=clause), params)


def expiries(con, filters: Filters | None = None, limit: int = 1000) -> pa.Table:
    """Retentions that expired unread, oldest first."""
    clause, params = where(filters, RETENTION_SCOPE, prefix="AND")
    return table(request_scoped(con, filters), EXPIRIES_SQL.format(where=clause), {**params, "limit": limit})
