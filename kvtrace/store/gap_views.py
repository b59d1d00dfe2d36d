"""DuckDB view ``turn_gaps``: how long D held a turn's blocks before the session came back.

One row per ``kvtrace.kv.retention`` span of a session (blocks D kept after a turn's decode):
the session's next d2p decision on a P engine (the next request's "pull or recompute"), the gap
between them, what D held meanwhile and what happened.  The next decision is the session's first
d2p decision that starts after the retention started and for which this retention is the
session's latest one (a DuckDB ASOF join): when two turns of a session overlap, the older
retention has no next decision, as the proxy then offers only the newest turn's blocks.

Times are in **model seconds**: wall seconds x the decode engine's ``kvtrace.sim.time_scale``
resource attribute (1 for vLLM), the unit TTLs are configured in.  ``expiry_gap_s`` is the same
gap as vLLM measures it (D's TTL minus the ``kvtrace.kv.expiry_remaining_s`` P saw), known when
the next request was offered these blocks.  The what-if replay (:mod:`kvtrace.analysis.whatif`)
reads this view.
"""

from __future__ import annotations

from kvtrace import semconv as sc


def _q(name: str) -> str:
    """A semconv name as a SQL string literal (names never contain quotes)."""
    assert "'" not in name
    return f"'{name}'"


def _i(key: str) -> str:
    return f"SpanAttributesInt[{_q(key)}]"


def _f(key: str) -> str:
    return f"COALESCE(SpanAttributesFloat[{_q(key)}], CAST(SpanAttributesInt[{_q(key)}] AS DOUBLE))"


def _s(key: str) -> str:
    return f"SpanAttributes[{_q(key)}]"


TIME_SCALE = f"COALESCE(TRY_CAST(ResourceAttributes[{_q(sc.SIM_TIME_SCALE)}] AS DOUBLE), 1.0)"

TURN_GAPS_VIEW = f"""
CREATE OR REPLACE VIEW turn_gaps AS
WITH r AS (
  SELECT trace_id, span_id, session_id, turn, request_id, engine_id, start_ns, end_ns,
         {_i(sc.KV_RETENTION_BLOCKS)} AS blocks, {_i(sc.KV_RETENTION_TOKENS)} AS tokens,
         {_i(sc.KV_RETENTION_BYTES)} AS bytes, {_f(sc.KV_RETENTION_TTL_S)} AS ttl_s,
         {_s(sc.KV_RETENTION_OUTCOME)} AS retention_outcome, {TIME_SCALE} AS time_scale
  FROM spans WHERE name = {_q(sc.SPAN_KV_RETENTION)} AND session_id IS NOT NULL
),
d AS (
  SELECT trace_id, span_id, session_id, turn, request_id, engine_id, start_ns,
         {_s(sc.KV_OUTCOME)} AS outcome, {_i(sc.KV_PULLED_TOKENS)} AS pulled_tokens,
         {_i(sc.KV_RECOMPUTED_TOKENS)} AS recomputed_tokens, {_f(sc.KV_EXPIRY_REMAINING_S)} AS expiry_remaining_s,
         {_s(sc.KV_PEER_ENGINE_ID)} AS peer_engine_id
  FROM spans
  WHERE name = {_q(sc.SPAN_KV_DECISION)} AND {_s(sc.KV_DIRECTION)} = {_q(sc.DIRECTION_D2P)} AND session_id IS NOT NULL
),
latest AS (
  SELECT d.trace_id AS d_trace, d.span_id AS d_span, r.trace_id AS r_trace, r.span_id AS r_span
  FROM d ASOF JOIN r ON d.session_id = r.session_id AND d.start_ns >= r.start_ns
  QUALIFY row_number() OVER (PARTITION BY r.trace_id, r.span_id ORDER BY d.start_ns, d.span_id) = 1
),
q AS (
  SELECT trace_id, request_id, {_f(sc.PROXY_ENTRY_AGE_S)} AS entry_age_s,
         {_f(sc.PROXY_CONVERSATION_TTL_S)} AS conversation_ttl_s, {_s(sc.PROXY_OFFER)} = 'true' AS offered,
         {_s(sc.PROXY_OFFER_REASON)} AS offer_reason
  FROM spans WHERE name = {_q(sc.SPAN_PROXY_REQUEST)} AND request_id IS NOT NULL
  QUALIFY row_number() OVER (PARTITION BY trace_id, request_id ORDER BY start_ns) = 1
),
a AS (
  SELECT session_id, min({_s(sc.GEN_AI_AGENT_NAME)}) AS agent_name, min({_s(sc.AGENT_SCENARIO)}) AS scenario
  FROM spans WHERE name = {_q(sc.SPAN_AGENT_SESSION)} AND session_id IS NOT NULL GROUP BY session_id
)
SELECT r.trace_id, r.span_id, r.session_id, r.turn, r.request_id, r.engine_id, a.agent_name, a.scenario,
       r.start_ns, r.end_ns, (r.end_ns - r.start_ns) / 1e9 * r.time_scale AS held_s,
       r.blocks, r.tokens, r.bytes, r.ttl_s, r.retention_outcome, r.time_scale,
       d.trace_id AS next_trace_id, d.span_id AS next_span_id, d.request_id AS next_request_id,
       d.turn AS next_turn, d.engine_id AS next_engine_id, d.start_ns AS next_start_ns,
       (d.start_ns - r.start_ns) / 1e9 * r.time_scale AS gap_s,
       CASE WHEN d.peer_engine_id = r.engine_id THEN r.ttl_s - d.expiry_remaining_s END AS expiry_gap_s,
       q.entry_age_s * r.time_scale AS entry_age_s, q.conversation_ttl_s * r.time_scale AS offer_ttl_s,
       q.offered, q.offer_reason, d.outcome, d.pulled_tokens, d.recomputed_tokens
FROM r
LEFT JOIN latest l ON l.r_trace = r.trace_id AND l.r_span = r.span_id
LEFT JOIN d ON d.trace_id = l.d_trace AND d.span_id = l.d_span
LEFT JOIN q ON q.trace_id = d.trace_id AND q.request_id = d.request_id
LEFT JOIN a ON a.session_id = r.session_id
"""

VIEWS: dict[str, str] = {"turn_gaps": TURN_GAPS_VIEW}
"""View name -> CREATE statement (needs the ``spans`` view)."""
