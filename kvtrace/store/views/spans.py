"""The span-level views: ``spans`` (every span, raw and derived columns) and one view per kind.

Every view reads ``kvtrace_raw`` (the directory's complete Parquet files, bound by
:mod:`kvtrace.store.reader`) through ``spans``.  Attribute names come from :mod:`kvtrace.semconv`
(module constants, never user input) and reach the SQL through :mod:`kvtrace.store.sql`.  Numbers
are read from the typed maps (``SpanAttributesInt`` / ``SpanAttributesFloat``), strings from
``SpanAttributes``; engine id/role and substrate fall back to resource attributes.
"""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.store.sql import bool_attr as _b
from kvtrace.store.sql import float_attr as _f
from kvtrace.store.sql import int_attr as _i
from kvtrace.store.sql import literal as _q
from kvtrace.store.sql import literals
from kvtrace.store.sql import str_attr as _s
from kvtrace.store.units import GIB
from kvtrace.store.views.raw import RAW, RAW_COLUMNS, spans_sql
from kvtrace.store.views.registry import (
    BIGINT,
    BOOLEAN,
    DOUBLE,
    SPAN_KIND_VALUES,
    TIMESTAMPTZ,
    VARCHAR,
    View,
    col,
    common,
    common_as,
)

SPANS = View(
    "spans",
    "Every span: the raw columns plus the derived ones.",
    (
        *RAW_COLUMNS,
        *common("trace_id", "span_id", "parent_span_id"),
        col("name", VARCHAR, "span name (= `SpanName`)"),
        col("kind", VARCHAR, "span kind (= `SpanKind`)", SPAN_KIND_VALUES),
        *common(
            "service_name",
            "start_time",
            "end_time",
            "start_ns",
            "end_ns",
            "duration_ms",
            "status_code",
            "session_id",
            "request_id",
            "turn",
            "engine_id",
            "engine_role",
            "substrate",
        ),
    ),
    spans_sql(RAW),
)


def trace_substrate(rows: str) -> str:
    """The substrate of each trace's engine spans, from ``rows`` (spans, or any relation with their
    ``trace_id`` and ``substrate``): what ``requests`` names for the proxy's spans, which carry none."""
    return f"(SELECT trace_id, min(substrate) AS t_substrate FROM {rows} WHERE substrate IS NOT NULL GROUP BY trace_id)"


NO_TRACE_SUBSTRATE = "(SELECT NULL::VARCHAR AS trace_id, NULL::VARCHAR AS t_substrate WHERE false)"
"""A trace-substrate relation with no row: ``requests``' SELECT then gives each span's own substrate."""


def _requests_source(trace_substrate: str) -> str:
    return f"""
FROM spans s LEFT JOIN {trace_substrate} t ON t.trace_id = s.trace_id
WHERE name = {_q(sc.SPAN_PROXY_REQUEST)}
"""


REQUESTS = View(
    "requests",
    f"Proxy SERVER spans (`{sc.SPAN_PROXY_REQUEST}`): one row per request the proxy served.",
    (
        common_as("trace_id", "s.trace_id"),
        *common(
            "span_id",
            "request_id",
            "session_id",
            "turn",
            "service_name",
            "start_time",
            "end_time",
            "start_ns",
            "end_ns",
        ),
        col("ttft_ms", DOUBLE, "time to first token at the proxy, ms", sql=_f(sc.REQUEST_TTFT_MS)),
        col(
            "latency_ms",
            DOUBLE,
            "completed latency, ms (span duration when not recorded)",
            sql=f"COALESCE({_f(sc.REQUEST_LATENCY_MS)}, duration_ms)",
        ),
        col("input_tokens", BIGINT, "prompt tokens reported by D", sql=_i(sc.GEN_AI_USAGE_INPUT_TOKENS)),
        col("output_tokens", BIGINT, "generated tokens reported by D", sql=_i(sc.GEN_AI_USAGE_OUTPUT_TOKENS)),
        *common("status_code"),
        col("http_status", BIGINT, "HTTP status returned to the client", sql=_i(sc.HTTP_RESPONSE_STATUS_CODE)),
        col("stream", BOOLEAN, "the client asked for streaming", sql=_b(sc.REQUEST_STREAM)),
        col("offered", BOOLEAN, "D's retained blocks were offered to P", sql=_b(sc.PROXY_OFFER)),
        col("offer_reason", VARCHAR, "why (not) offered", sc.OFFER_REASONS, sql=_s(sc.PROXY_OFFER_REASON)),
        col("fallback", VARCHAR, "fault handling applied", sc.FALLBACKS, sql=_s(sc.PROXY_FALLBACK)),
        col("outcome", VARCHAR, "P's decision outcome as reported", sc.OUTCOMES, sql=_s(sc.KV_OUTCOME)),
        col("pulled_tokens", BIGINT, "tokens P pulled from D", sql=_i(sc.KV_PULLED_TOKENS)),
        col("prefill_endpoint", VARCHAR, "P worker URL chosen", sql=_s(sc.PROXY_PREFILL_ENDPOINT)),
        col("decode_endpoint", VARCHAR, "D worker URL chosen", sql=_s(sc.PROXY_DECODE_ENDPOINT)),
        col("routing", VARCHAR, "routing policy (a fleet)", sc.ROUTING_POLICIES, sql=_s(sc.ROUTE_POLICY)),
        col("prefill_route", VARCHAR, "why this P", sc.ROUTE_REASONS, sql=_s(sc.ROUTE_PREFILL_REASON)),
        col("decode_route", VARCHAR, "why this D", sc.ROUTE_REASONS, sql=_s(sc.ROUTE_DECODE_REASON)),
        col(
            "substrate",
            VARCHAR,
            "the substrate of the engine spans in the request's trace",
            sc.SUBSTRATES,
            sql="COALESCE(substrate, t.t_substrate)",
        ),
    ),
    source=_requests_source(trace_substrate("spans")),
)


def requests_select(trace_substrate: str) -> str:
    """``requests``' SELECT with ``trace_substrate`` (a relation of ``trace_id, t_substrate``) naming
    the substrate of each trace's engine spans (:mod:`kvtrace.store.partials`)."""
    listed = ", ".join(c.selected() for c in REQUESTS.columns)
    return f"SELECT {listed}\n{_requests_source(trace_substrate).strip()}"


PROXY_LEGS = View(
    "proxy_legs",
    f"The proxy's `{sc.SPAN_PROXY_PREFILL}` / `{sc.SPAN_PROXY_DECODE}` spans: one row per leg sent to a worker, "
    "a failed one and its failover included.",
    (
        *common("trace_id", "span_id", "parent_span_id", "request_id", "session_id", "turn"),
        col(
            "role",
            VARCHAR,
            "which leg",
            (sc.ROLE_PREFILL, sc.ROLE_DECODE),
            sql=f"CASE name WHEN {_q(sc.SPAN_PROXY_PREFILL)} THEN {_q(sc.ROLE_PREFILL)} ELSE {_q(sc.ROLE_DECODE)} END",
        ),
        col(
            "endpoint",
            VARCHAR,
            f"the leg's worker base URL; in older traces, which do not name it, `http://` + `{sc.SERVER_ADDRESS}` "
            f"+ `:` + `{sc.SERVER_PORT}` (how the proxy spells a worker's URL)",
            sql=f"COALESCE({_s(sc.PROXY_PREFILL_ENDPOINT)}, {_s(sc.PROXY_DECODE_ENDPOINT)}, "
            f"'http://' || {_s(sc.SERVER_ADDRESS)} || ':' || CAST({_i(sc.SERVER_PORT)} AS VARCHAR))",
        ),
        col("http_status", BIGINT, "the worker's HTTP status (NULL: no answer)", sql=_i(sc.HTTP_RESPONSE_STATUS_CODE)),
        col("error_type", VARCHAR, "why the leg failed (NULL: it did not)", sql=_s(sc.ERROR_TYPE)),
        col("unreachable", BOOLEAN, "the worker never got the request", sql=_b(sc.PROXY_UNREACHABLE)),
        col("failover", BOOLEAN, "sent on from an unreachable worker", sql=_b(sc.PROXY_FAILOVER)),
        col("retry", BOOLEAN, "P's fresh prefill after it failed to read the offer", sql=_b(sc.PROXY_RETRY)),
        col("offered", BOOLEAN, "P leg: D's blocks were offered", sql=_b(sc.PROXY_OFFER)),
        col("ttft_ms", DOUBLE, "D leg: the request's time to first token at the proxy, ms", sql=_f(sc.REQUEST_TTFT_MS)),
        col("pool_wait_ms", DOUBLE, "time queued for a connection to the worker, ms", sql=_f(sc.PROXY_POOL_WAIT_MS)),
        *common("service_name", "start_time", "end_time", "start_ns", "end_ns", "duration_ms", "status_code"),
    ),
    source=f"FROM spans WHERE name IN ({literals((sc.SPAN_PROXY_PREFILL, sc.SPAN_PROXY_DECODE))})",
)

KV_DECISIONS = View(
    "kv_decisions",
    f"`{sc.SPAN_KV_DECISION}` spans: each pull-vs-recompute decision of a worker.",
    (
        *common("trace_id", "span_id", "request_id", "session_id", "turn", "engine_id", "engine_role"),
        col(
            "direction",
            VARCHAR,
            f"`{sc.DIRECTION_D2P}` (P pulls D's blocks) or `{sc.DIRECTION_P2D}`",
            sc.DIRECTIONS,
            sql=_s(sc.KV_DIRECTION),
        ),
        col("outcome", VARCHAR, "the decision", sc.OUTCOMES, sql=_s(sc.KV_OUTCOME)),
        col("prompt_tokens", BIGINT, "prompt tokens", sql=_i(sc.KV_PROMPT_TOKENS)),
        col("local_hit_tokens", BIGINT, "tokens found in the local prefix cache", sql=_i(sc.KV_LOCAL_HIT_TOKENS)),
        col("remote_tokens", BIGINT, "reusable tokens the peer offered", sql=_i(sc.KV_REMOTE_TOKENS)),
        col("pulled_tokens", BIGINT, "tokens loaded from the peer", sql=_i(sc.KV_PULLED_TOKENS)),
        col("recomputed_tokens", BIGINT, "prompt tokens computed locally", sql=_i(sc.KV_RECOMPUTED_TOKENS)),
        col("threshold", BIGINT, "kv_recompute_threshold in force", sql=_i(sc.KV_THRESHOLD)),
        col(
            "expiry_remaining_s",
            DOUBLE,
            "seconds left before the peer's blocks expire",
            sql=_f(sc.KV_EXPIRY_REMAINING_S),
        ),
        col("peer_engine_id", VARCHAR, "peer engine", sql=_s(sc.KV_PEER_ENGINE_ID)),
        col(
            "verified",
            VARCHAR,
            "whether D's digest proves the offered KV is this prompt's",
            sc.VERIFIED_VALUES,
            sql=_s(sc.KV_VERIFIED),
        ),
        col("verify_mode", VARCHAR, "the connector's verify setting", sc.VERIFY_MODES, sql=_s(sc.KV_VERIFY_MODE)),
        col(
            "verified_tokens",
            BIGINT,
            "prompt tokens proven equal to the tokens D's blocks hold",
            sql=_i(sc.KV_VERIFIED_TOKENS),
        ),
        col(
            "first_mismatch_token",
            BIGINT,
            "mismatch: start of the first digest chunk that differs",
            sql=_i(sc.KV_VERIFY_MISMATCH_TOKEN),
        ),
        col(
            "wrong_tokens",
            BIGINT,
            "mismatch: tokens vLLM's rule loads (or would) from KV of other tokens",
            sql=_i(sc.KV_VERIFY_WRONG_TOKENS),
        ),
        *common("start_time", "start_ns", "duration_ms", "service_name", "substrate"),
    ),
    source=f"FROM spans WHERE name = {_q(sc.SPAN_KV_DECISION)}",
)

KV_TRANSFERS = View(
    "kv_transfers",
    f"`{sc.SPAN_KV_TRANSFER}` spans: KV blocks moved between workers.",
    (
        *common("trace_id", "span_id", "parent_span_id", "request_id", "session_id", "turn", "engine_id"),
        col(
            "direction",
            VARCHAR,
            f"`{sc.DIRECTION_D2P}` or `{sc.DIRECTION_P2D}`",
            sc.DIRECTIONS,
            sql=_s(sc.KV_DIRECTION),
        ),
        col("tokens", BIGINT, "tokens loaded", sql=_i(sc.KV_TRANSFER_TOKENS)),
        col("blocks", BIGINT, "blocks loaded", sql=_i(sc.KV_TRANSFER_BLOCKS)),
        col("bytes", BIGINT, "bytes loaded", sql=_i(sc.KV_TRANSFER_BYTES)),
        col("status", VARCHAR, "how the transfer ended", sc.TRANSFER_STATUSES, sql=_s(sc.KV_TRANSFER_STATUS)),
        col("xfer_ms", DOUBLE, "transport time reported by the worker, ms", sql=_f(sc.KV_TRANSFER_XFER_MS)),
        *common("duration_ms", "start_time", "end_time", "start_ns", "end_ns"),
        col("peer_engine_id", VARCHAR, "engine the blocks came from", sql=_s(sc.KV_PEER_ENGINE_ID)),
        col("remote_request_id", VARCHAR, "the peer's request id", sql=_s(sc.KV_REMOTE_REQUEST_ID)),
        *common("substrate"),
    ),
    source=f"FROM spans WHERE name = {_q(sc.SPAN_KV_TRANSFER)}",
)

KV_RETENTION = View(
    "kv_retention",
    f"`{sc.SPAN_KV_RETENTION}` spans: blocks D holds after a turn, until read, expired or released.",
    (
        *common("trace_id", "span_id", "request_id", "session_id", "turn", "engine_id"),
        col("blocks", BIGINT, "blocks held", sql=_i(sc.KV_RETENTION_BLOCKS)),
        col("tokens", BIGINT, "tokens held", sql=_i(sc.KV_RETENTION_TOKENS)),
        col("bytes", BIGINT, "bytes held", sql=_i(sc.KV_RETENTION_BYTES)),
        col("ttl_s", DOUBLE, "decoder_kv_blocks_ttl, s", sql=_f(sc.KV_RETENTION_TTL_S)),
        col("outcome", VARCHAR, "how the hold ended", sc.RETENTION_OUTCOMES, sql=_s(sc.KV_RETENTION_OUTCOME)),
        *common("start_time", "end_time", "start_ns", "end_ns"),
        col("held_s", DOUBLE, "how long the blocks were held, s", sql="Duration / 1e9"),
        col("byte_seconds", DOUBLE, "`bytes * held_s`", sql=f"{_i(sc.KV_RETENTION_BYTES)} * (Duration / 1e9)"),
        *common("substrate"),
    ),
    source=f"FROM spans WHERE name = {_q(sc.SPAN_KV_RETENTION)}",
)

ENGINE_REQUESTS = View(
    "engine_requests",
    f"`{sc.SPAN_ENGINE_PREFILL}` / `{sc.SPAN_ENGINE_DECODE}` spans: a request's work on one worker.",
    (
        *common("trace_id", "span_id", "request_id", "session_id", "turn", "engine_id", "engine_role"),
        col(
            "phase",
            VARCHAR,
            "which span",
            (sc.ROLE_PREFILL, sc.ROLE_DECODE),
            sql=f"CASE name WHEN {_q(sc.SPAN_ENGINE_PREFILL)} THEN {_q(sc.ROLE_PREFILL)} ELSE {_q(sc.ROLE_DECODE)} END",
        ),
        col("prompt_tokens", BIGINT, "prompt tokens", sql=_i(sc.KV_PROMPT_TOKENS)),
        col("output_tokens", BIGINT, "generated tokens (decode)", sql=_i(sc.GEN_AI_USAGE_OUTPUT_TOKENS)),
        col("cached_tokens", BIGINT, "tokens not computed on this worker", sql=_i(sc.REQUEST_CACHED_TOKENS)),
        *common("start_ns", "end_ns", "duration_ms", "substrate"),
    ),
    source=f"FROM spans WHERE name IN ({literals((sc.SPAN_ENGINE_PREFILL, sc.SPAN_ENGINE_DECODE))})",
)

LLM_CALLS = View(
    "llm_calls",
    f"Agent `{sc.SPAN_AGENT_LLM_CALL}` spans: each LLM call as the agent saw it.",
    (
        *common("trace_id", "span_id", "session_id", "turn", "request_id"),
        col("model", VARCHAR, f"`{sc.GEN_AI_REQUEST_MODEL}`", sql=_s(sc.GEN_AI_REQUEST_MODEL)),
        col("input_tokens", BIGINT, "prompt tokens (usage)", sql=_i(sc.GEN_AI_USAGE_INPUT_TOKENS)),
        col("output_tokens", BIGINT, "generated tokens (usage)", sql=_i(sc.GEN_AI_USAGE_OUTPUT_TOKENS)),
        col("ttft_ms", DOUBLE, "time to first token, ms", sql=_f(sc.LLM_TTFT_MS)),
        col("tpot_ms", DOUBLE, "time per output token, ms", sql=_f(sc.LLM_TPOT_MS)),
        col(
            "outcome",
            VARCHAR,
            "P's decision, from the response's kv_transfer object",
            sc.OUTCOMES,
            sql=_s(sc.KV_OUTCOME),
        ),
        col("pulled_tokens", BIGINT, "tokens P pulled, from the kv_transfer object", sql=_i(sc.KV_PULLED_TOKENS)),
        *common("start_ns", "end_ns", "duration_ms", "status_code"),
    ),
    source=f"FROM spans WHERE name = {_q(sc.SPAN_AGENT_LLM_CALL)}",
)

TOOL_CALLS = View(
    "tool_calls",
    f"`{sc.SPAN_AGENT_TOOL_CALL}` spans: the agent's tool executions.",
    (
        *common("trace_id", "span_id", "session_id", "turn"),
        col("tool_name", VARCHAR, f"`{sc.GEN_AI_TOOL_NAME}`", sql=_s(sc.GEN_AI_TOOL_NAME)),
        col("tool_call_id", VARCHAR, f"`{sc.GEN_AI_TOOL_CALL_ID}`", sql=_s(sc.GEN_AI_TOOL_CALL_ID)),
        *common("start_time", "end_time", "start_ns", "end_ns", "duration_ms", "status_code"),
    ),
    source=f"FROM spans WHERE name = {_q(sc.SPAN_AGENT_TOOL_CALL)}",
)

APP_WORK = View(
    "app_work",
    f"`{sc.SPAN_AGENT_APP_WORK}` spans: the agent's own work between calls.",
    (
        *common("trace_id", "span_id", "session_id", "turn"),
        col("work_name", VARCHAR, "what the work was", sql=_s(sc.AGENT_WORK_NAME)),
        *common("start_ns", "end_ns", "duration_ms"),
    ),
    source=f"FROM spans WHERE name = {_q(sc.SPAN_AGENT_APP_WORK)}",
)

TURNS = View(
    "turns",
    f"`{sc.SPAN_AGENT_TURN}` spans: one user turn of a session.",
    common("trace_id", "span_id", "session_id", "turn", "start_time", "end_time", "start_ns", "end_ns", "duration_ms"),
    source=f"FROM spans WHERE name = {_q(sc.SPAN_AGENT_TURN)}",
)

SESSIONS = View(
    "sessions",
    f"One row per session id: from agent session spans (`{sc.SPAN_AGENT_SESSION}`), else from proxy requests.",
    (
        col("trace_id", VARCHAR, "the session span's trace, else the smallest request trace id"),
        *common("session_id"),
        col("agent_name", VARCHAR, f"`{sc.GEN_AI_AGENT_NAME}` of the session span"),
        col("scenario", VARCHAR, f"`{sc.AGENT_SCENARIO}` of the session span"),
        col("start_time", TIMESTAMPTZ, "session span start, else first request start"),
        col("end_time", TIMESTAMPTZ, "session span end, else last request end"),
        col("start_ns", BIGINT, "`start_time`, epoch ns"),
        col("end_ns", BIGINT, "`end_time`, epoch ns"),
        col("wall_ms", DOUBLE, "`end_ns - start_ns`, ms"),
        col("turns", BIGINT, "distinct turns (turn spans, else requests)"),
        col("traces", BIGINT, "distinct traces carrying the session id"),
        col("requests", BIGINT, "proxy requests, else LLM calls"),
        col(
            "kv_gib_s",
            DOUBLE,
            "KV D held for the session's next turns, GiB·s (its retention spans: bytes x held "
            "seconds / 2^30, wall clock)",
        ),
    ),
    f"""
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
trc AS (SELECT session_id, count(DISTINCT trace_id) AS traces FROM spans WHERE session_id IS NOT NULL
  GROUP BY session_id),
ret AS (SELECT session_id, sum(byte_seconds) AS byte_s FROM kv_retention WHERE session_id IS NOT NULL
  GROUP BY session_id),
ids AS (SELECT session_id FROM sess UNION SELECT session_id FROM req)
SELECT COALESCE(sess.trace_id, req.trace_id) AS trace_id, ids.session_id, sess.agent_name, sess.scenario,
  make_timestamp(COALESCE(sess.start_ns, req.start_ns) // 1000)::TIMESTAMPTZ AS start_time,
  make_timestamp(COALESCE(sess.end_ns, req.end_ns) // 1000)::TIMESTAMPTZ AS end_time,
  COALESCE(sess.start_ns, req.start_ns) AS start_ns, COALESCE(sess.end_ns, req.end_ns) AS end_ns,
  (COALESCE(sess.end_ns, req.end_ns) - COALESCE(sess.start_ns, req.start_ns)) / 1e6 AS wall_ms,
  COALESCE(trn.turns, req.turns, 0) AS turns, COALESCE(trc.traces, 0) AS traces,
  COALESCE(req.requests, llm.calls, 0) AS requests, COALESCE(ret.byte_s, 0) / {float(GIB)} AS kv_gib_s
FROM ids LEFT JOIN sess USING (session_id) LEFT JOIN req USING (session_id) LEFT JOIN llm USING (session_id)
  LEFT JOIN trn USING (session_id) LEFT JOIN trc USING (session_id) LEFT JOIN ret USING (session_id)
""",
)

VIEWS: tuple[View, ...] = (
    SPANS,
    REQUESTS,
    PROXY_LEGS,
    KV_DECISIONS,
    KV_TRANSFERS,
    KV_RETENTION,
    ENGINE_REQUESTS,
    LLM_CALLS,
    TOOL_CALLS,
    APP_WORK,
    TURNS,
    SESSIONS,
)
