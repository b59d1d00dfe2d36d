"""DuckDB views over a kvtrace trace directory (the query contract; see docs/query.md).

``connect(dir)`` is called by ``kvtrace query``, the report and the dashboard; ``refresh``
re-lists the files (the dashboard calls it before re-running queries).  The file list comes
from :func:`kvtrace.store.files.list_files` (complete, de-duplicated files only) and is bound as
a parameter of ``read_parquet``; every other view is a named SQL constant below.  Attribute
names come from :mod:`kvtrace.semconv` (module constants, never user input).  Numbers are read
from the typed maps (``SpanAttributesInt`` / ``SpanAttributesFloat``), strings from
``SpanAttributes``; engine id/role and substrate fall back to resource attributes.
"""

from __future__ import annotations

import os

import duckdb
import pyarrow as pa

from kvtrace import semconv as sc
from kvtrace.store.gap_views import VIEWS as GAP_VIEWS
from kvtrace.store.vllm_views import VIEWS as VLLM_VIEWS
from kvtrace.store.files import list_files
from kvtrace.store.sqltext import bool_attr as _b, float_attr as _f, int_attr as _i, literal as _q
from kvtrace.store.sqltext import span_or_resource as _sr, str_attr as _s
from kvtrace.store.schema import SCHEMA


class StoreError(Exception):
    """No trace data where it was asked for (one-line message)."""


RAW = "kvtrace_raw"
READ_FILES = (
    "SELECT * FROM read_parquet($files, hive_partitioning = true, union_by_name = true, "
    "hive_types = {'date': DATE, 'hour': INTEGER})"
)


SPANS_SQL = f"""
CREATE OR REPLACE VIEW spans AS
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
FROM {RAW} AS r
"""

# substrate of proxy/agent spans: that of the engine spans in the same trace
_TRACE_SUBSTRATE = "(SELECT trace_id, min(substrate) AS t_substrate FROM spans WHERE substrate IS NOT NULL GROUP BY trace_id)"

REQUESTS_SQL = f"""
CREATE OR REPLACE VIEW requests AS
SELECT s.trace_id, span_id, request_id, session_id, turn, service_name, start_time, end_time, start_ns, end_ns,
  {_f(sc.REQUEST_TTFT_MS)} AS ttft_ms, COALESCE({_f(sc.REQUEST_LATENCY_MS)}, duration_ms) AS latency_ms,
  {_i(sc.GEN_AI_USAGE_INPUT_TOKENS)} AS input_tokens, {_i(sc.GEN_AI_USAGE_OUTPUT_TOKENS)} AS output_tokens,
  status_code, {_i(sc.HTTP_RESPONSE_STATUS_CODE)} AS http_status, {_b(sc.REQUEST_STREAM)} AS stream,
  {_b(sc.PROXY_OFFER)} AS offered, {_s(sc.PROXY_OFFER_REASON)} AS offer_reason,
  {_s(sc.PROXY_FALLBACK)} AS fallback, {_s(sc.KV_OUTCOME)} AS outcome,
  {_i(sc.KV_PULLED_TOKENS)} AS pulled_tokens,
  {_s(sc.PROXY_PREFILL_ENDPOINT)} AS prefill_endpoint, {_s(sc.PROXY_DECODE_ENDPOINT)} AS decode_endpoint,
  COALESCE(substrate, t.t_substrate) AS substrate
FROM spans s LEFT JOIN {_TRACE_SUBSTRATE} t ON t.trace_id = s.trace_id
WHERE name = {_q(sc.SPAN_PROXY_REQUEST)}
"""

KV_DECISIONS_SQL = f"""
CREATE OR REPLACE VIEW kv_decisions AS
SELECT trace_id, span_id, request_id, session_id, turn, engine_id, engine_role,
  {_s(sc.KV_DIRECTION)} AS direction, {_s(sc.KV_OUTCOME)} AS outcome,
  {_i(sc.KV_PROMPT_TOKENS)} AS prompt_tokens, {_i(sc.KV_LOCAL_HIT_TOKENS)} AS local_hit_tokens,
  {_i(sc.KV_REMOTE_TOKENS)} AS remote_tokens, {_i(sc.KV_PULLED_TOKENS)} AS pulled_tokens,
  {_i(sc.KV_RECOMPUTED_TOKENS)} AS recomputed_tokens, {_i(sc.KV_THRESHOLD)} AS threshold,
  {_f(sc.KV_EXPIRY_REMAINING_S)} AS expiry_remaining_s, {_s(sc.KV_PEER_ENGINE_ID)} AS peer_engine_id,
  start_time, start_ns, duration_ms, service_name, substrate
FROM spans WHERE name = {_q(sc.SPAN_KV_DECISION)}
"""

KV_TRANSFERS_SQL = f"""
CREATE OR REPLACE VIEW kv_transfers AS
SELECT trace_id, span_id, parent_span_id, request_id, session_id, turn, engine_id,
  {_s(sc.KV_DIRECTION)} AS direction, {_i(sc.KV_TRANSFER_TOKENS)} AS tokens,
  {_i(sc.KV_TRANSFER_BLOCKS)} AS blocks, {_i(sc.KV_TRANSFER_BYTES)} AS bytes,
  {_s(sc.KV_TRANSFER_STATUS)} AS status, {_f(sc.KV_TRANSFER_XFER_MS)} AS xfer_ms, duration_ms,
  start_time, end_time, start_ns, end_ns, {_s(sc.KV_PEER_ENGINE_ID)} AS peer_engine_id,
  {_s(sc.KV_REMOTE_REQUEST_ID)} AS remote_request_id, substrate
FROM spans WHERE name = {_q(sc.SPAN_KV_TRANSFER)}
"""

KV_RETENTION_SQL = f"""
CREATE OR REPLACE VIEW kv_retention AS
SELECT trace_id, span_id, request_id, session_id, turn, engine_id,
  {_i(sc.KV_RETENTION_BLOCKS)} AS blocks, {_i(sc.KV_RETENTION_TOKENS)} AS tokens,
  {_i(sc.KV_RETENTION_BYTES)} AS bytes, {_f(sc.KV_RETENTION_TTL_S)} AS ttl_s,
  {_s(sc.KV_RETENTION_OUTCOME)} AS outcome, start_time, end_time, start_ns, end_ns,
  Duration / 1e9 AS held_s, {_i(sc.KV_RETENTION_BYTES)} * (Duration / 1e9) AS byte_seconds, substrate
FROM spans WHERE name = {_q(sc.SPAN_KV_RETENTION)}
"""

ENGINE_REQUESTS_SQL = f"""
CREATE OR REPLACE VIEW engine_requests AS
SELECT trace_id, span_id, request_id, session_id, turn, engine_id, engine_role,
  CASE name WHEN {_q(sc.SPAN_ENGINE_PREFILL)} THEN {_q(sc.ROLE_PREFILL)} ELSE {_q(sc.ROLE_DECODE)} END AS phase,
  {_i(sc.KV_PROMPT_TOKENS)} AS prompt_tokens, {_i(sc.GEN_AI_USAGE_OUTPUT_TOKENS)} AS output_tokens,
  {_i(sc.REQUEST_CACHED_TOKENS)} AS cached_tokens, start_ns, end_ns, duration_ms, substrate
FROM spans WHERE name IN ({_q(sc.SPAN_ENGINE_PREFILL)}, {_q(sc.SPAN_ENGINE_DECODE)})
"""

LLM_CALLS_SQL = f"""
CREATE OR REPLACE VIEW llm_calls AS
SELECT trace_id, span_id, session_id, turn, request_id, {_s(sc.GEN_AI_REQUEST_MODEL)} AS model,
  {_i(sc.GEN_AI_USAGE_INPUT_TOKENS)} AS input_tokens, {_i(sc.GEN_AI_USAGE_OUTPUT_TOKENS)} AS output_tokens,
  {_f(sc.LLM_TTFT_MS)} AS ttft_ms, {_f(sc.LLM_TPOT_MS)} AS tpot_ms, {_s(sc.KV_OUTCOME)} AS outcome,
  {_i(sc.KV_PULLED_TOKENS)} AS pulled_tokens, start_ns, end_ns, duration_ms, status_code
FROM spans WHERE name = {_q(sc.SPAN_AGENT_LLM_CALL)}
"""

TOOL_CALLS_SQL = f"""
CREATE OR REPLACE VIEW tool_calls AS
SELECT trace_id, span_id, session_id, turn, {_s(sc.GEN_AI_TOOL_NAME)} AS tool_name,
  {_s(sc.GEN_AI_TOOL_CALL_ID)} AS tool_call_id, start_time, end_time, start_ns, end_ns, duration_ms, status_code
FROM spans WHERE name = {_q(sc.SPAN_AGENT_TOOL_CALL)}
"""

APP_WORK_SQL = f"""
CREATE OR REPLACE VIEW app_work AS
SELECT trace_id, span_id, session_id, turn, {_s(sc.AGENT_WORK_NAME)} AS work_name, start_ns, end_ns, duration_ms
FROM spans WHERE name = {_q(sc.SPAN_AGENT_APP_WORK)}
"""

TURNS_SQL = f"""
CREATE OR REPLACE VIEW turns AS
SELECT trace_id, span_id, session_id, turn, start_time, end_time, start_ns, end_ns, duration_ms
FROM spans WHERE name = {_q(sc.SPAN_AGENT_TURN)}
"""

SESSIONS_SQL = f"""
CREATE OR REPLACE VIEW sessions AS
WITH sess AS (
  SELECT session_id, min(trace_id) AS trace_id, min({_s(sc.GEN_AI_AGENT_NAME)}) AS agent_name,
    min({_s(sc.AGENT_SCENARIO)}) AS scenario, min(start_ns) AS start_ns, max(end_ns) AS end_ns
  FROM spans WHERE name = {_q(sc.SPAN_AGENT_SESSION)} AND session_id IS NOT NULL GROUP BY session_id),
req AS (
  SELECT session_id, min(trace_id) AS trace_id, min(start_ns) AS start_ns, max(end_ns) AS end_ns,
    count(*) AS requests, count(DISTINCT turn) AS turns
  FROM requests WHERE session_id IS NOT NULL GROUP BY session_id),
llm AS (SELECT session_id, count(*) AS calls FROM llm_calls WHERE session_id IS NOT NULL GROUP BY session_id),
trn AS (SELECT session_id, count(DISTINCT turn) AS turns FROM turns WHERE session_id IS NOT NULL GROUP BY session_id),
trc AS (SELECT session_id, count(DISTINCT trace_id) AS traces FROM spans WHERE session_id IS NOT NULL GROUP BY session_id),
ids AS (SELECT session_id FROM sess UNION SELECT session_id FROM req)
SELECT COALESCE(sess.trace_id, req.trace_id) AS trace_id, ids.session_id, sess.agent_name, sess.scenario,
  make_timestamp(COALESCE(sess.start_ns, req.start_ns) // 1000)::TIMESTAMPTZ AS start_time,
  make_timestamp(COALESCE(sess.end_ns, req.end_ns) // 1000)::TIMESTAMPTZ AS end_time,
  COALESCE(sess.start_ns, req.start_ns) AS start_ns, COALESCE(sess.end_ns, req.end_ns) AS end_ns,
  (COALESCE(sess.end_ns, req.end_ns) - COALESCE(sess.start_ns, req.start_ns)) / 1e6 AS wall_ms,
  COALESCE(trn.turns, req.turns, 0) AS turns, COALESCE(trc.traces, 0) AS traces,
  COALESCE(req.requests, llm.calls, 0) AS requests
FROM ids LEFT JOIN sess USING (session_id) LEFT JOIN req USING (session_id) LEFT JOIN llm USING (session_id)
  LEFT JOIN trn USING (session_id) LEFT JOIN trc USING (session_id)
"""

VIEW_SQL: dict[str, str] = {
    "spans": SPANS_SQL,
    "requests": REQUESTS_SQL,
    "kv_decisions": KV_DECISIONS_SQL,
    "kv_transfers": KV_TRANSFERS_SQL,
    "kv_retention": KV_RETENTION_SQL,
    "engine_requests": ENGINE_REQUESTS_SQL,
    "llm_calls": LLM_CALLS_SQL,
    "tool_calls": TOOL_CALLS_SQL,
    "app_work": APP_WORK_SQL,
    "turns": TURNS_SQL,
    "sessions": SESSIONS_SQL,
    **VLLM_VIEWS,  # vLLM's own llm_request spans beside kvtrace's requests (kvtrace collect)
    **GAP_VIEWS,  # turn_gaps: how long D held a turn's blocks before the session came back
}
VIEWS: tuple[str, ...] = tuple(VIEW_SQL)


def _empty_raw() -> pa.Table:
    schema = SCHEMA.append(pa.field("date", pa.date32())).append(pa.field("hour", pa.int32()))
    return schema.empty_table()


def _bind_files(con: duckdb.DuckDBPyConnection, traces_dir: str | os.PathLike, allow_empty: bool) -> None:
    """(Re)define the raw relation over the directory's current files."""
    try:
        files = list_files(traces_dir)
    except FileNotFoundError:
        if not allow_empty:
            raise StoreError(f"trace directory {os.fspath(traces_dir)} does not exist") from None
        files = []
    if not files and not allow_empty:
        raise StoreError(f"no trace files in {os.fspath(traces_dir)}")
    if files:
        con.sql(READ_FILES, params={"files": files}).create_view(RAW, replace=True)
    else:
        con.from_arrow(_empty_raw()).create_view(RAW, replace=True)


def connect(traces_dir: str | os.PathLike, *, allow_empty: bool = False,
            con: duckdb.DuckDBPyConnection | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection (or ``con``) with every view of :data:`VIEWS` defined.

    Raises :class:`StoreError` for a missing or empty directory unless ``allow_empty``, in
    which case the views exist with their columns and zero rows."""
    con = con or duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    _bind_files(con, traces_dir, allow_empty)
    for sql in VIEW_SQL.values():
        con.execute(sql)
    return con


def refresh(con: duckdb.DuckDBPyConnection, traces_dir: str | os.PathLike, *, allow_empty: bool = True) -> None:
    """Re-list the directory so the views see files written since ``connect``."""
    _bind_files(con, traces_dir, allow_empty)


def view_columns(con: duckdb.DuckDBPyConnection | None = None) -> dict[str, list[str]]:
    """View name -> its columns, as defined (uses an empty store when ``con`` is None)."""
    if con is None:
        con = duckdb.connect()
        con.from_arrow(_empty_raw()).create_view(RAW, replace=True)
        for sql in VIEW_SQL.values():
            con.execute(sql)
    return {v: [row[0] for row in con.execute(f"DESCRIBE {v}").fetchall()] for v in VIEWS}
