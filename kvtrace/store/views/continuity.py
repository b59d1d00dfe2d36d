"""The ``continuity`` view: every chat turn the proxy checked against its session's last served turn.

One row per proxy request span carrying ``kvtrace.session.continuity`` (prefix matching on): how
its session was found, whether its messages extended the last served turn or diverged (and at
which message), the tokens D held that the break made unusable, and what the turn cost on P (the
d2p decision's token split, P's engine prefill time) and at the proxy (TTFT).  Agent and scenario
come from the agent's session span: the one of the ``llm_call`` in the request's trace (the agent's
session id can differ from the proxy's, e.g. a ``prefix-`` session), else the proxy's session id.

One scan of the store: the proxy request, decision, engine prefill, llm_call and agent session
spans are read once (MATERIALIZED) and joined by request id and trace.
"""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.store.sql import float_attr as _f
from kvtrace.store.sql import int_attr as _i
from kvtrace.store.sql import literal as _q
from kvtrace.store.sql import literals
from kvtrace.store.sql import str_attr as _s
from kvtrace.store.views.registry import BIGINT, DOUBLE, VARCHAR, View, col, common

_REQ, _DEC, _PRE = _q(sc.SPAN_PROXY_REQUEST), _q(sc.SPAN_KV_DECISION), _q(sc.SPAN_ENGINE_PREFILL)
_CALL, _SESS = _q(sc.SPAN_AGENT_LLM_CALL), _q(sc.SPAN_AGENT_SESSION)
_NAMES = (
    sc.SPAN_PROXY_REQUEST,
    sc.SPAN_KV_DECISION,
    sc.SPAN_ENGINE_PREFILL,
    sc.SPAN_AGENT_LLM_CALL,
    sc.SPAN_AGENT_SESSION,
)

BASE_SQL = f"""
    SELECT name, trace_id, span_id, request_id, session_id, turn, start_ns, duration_ms, engine_role,
           {_s(sc.SESSION_SOURCE)} AS source, {_s(sc.SESSION_CONTINUITY)} AS continuity,
           {_i(sc.SESSION_DIVERGED_AT)} AS diverged_at, {_i(sc.SESSION_REUSABLE_TOKENS_LOST)} AS tokens_lost,
           {_s(sc.PROXY_OFFER_REASON)} AS offer_reason, {_s(sc.KV_OUTCOME)} AS outcome,
           {_f(sc.REQUEST_TTFT_MS)} AS ttft_ms, {_s(sc.KV_DIRECTION)} AS direction,
           {_i(sc.KV_PROMPT_TOKENS)} AS prompt_tokens, {_i(sc.KV_LOCAL_HIT_TOKENS)} AS local_hit_tokens,
           {_i(sc.KV_PULLED_TOKENS)} AS pulled_tokens, {_i(sc.KV_RECOMPUTED_TOKENS)} AS recomputed_tokens,
           {_s(sc.GEN_AI_AGENT_NAME)} AS agent_name, {_s(sc.AGENT_SCENARIO)} AS scenario
    FROM spans WHERE name IN ({literals(_NAMES)})
"""
"""The spans ``continuity`` reads, one row each with the attributes it reads: a SELECT over ``spans``
(:mod:`kvtrace.store.partials` keeps each file's rows)."""


def continuity_sql(base: str) -> str:
    """The view's SELECT over ``base`` (:data:`BASE_SQL`'s rows)."""
    return f"""
WITH base AS MATERIALIZED ({base}),
{_JOINS}"""


_JOINS = f"""req AS (SELECT * FROM base WHERE name = {_REQ} AND continuity IS NOT NULL),
dec AS (
    SELECT request_id, arg_max(prompt_tokens, start_ns) AS prompt_tokens,
           arg_max(local_hit_tokens, start_ns) AS local_hit_tokens, arg_max(pulled_tokens, start_ns) AS pulled_tokens,
           arg_max(recomputed_tokens, start_ns) AS recomputed_tokens
    FROM base WHERE name = {_DEC} AND direction = {_q(sc.DIRECTION_D2P)} AND request_id IS NOT NULL
    GROUP BY request_id
),
pre AS (
    SELECT request_id, sum(duration_ms) AS prefill_ms FROM base
    WHERE name = {_PRE} AND engine_role = {_q(sc.ROLE_PREFILL)} AND request_id IS NOT NULL GROUP BY request_id
),
calls AS (SELECT trace_id, min(session_id) AS agent_session FROM base WHERE name = {_CALL} GROUP BY trace_id),
agents AS (
    SELECT session_id, min(agent_name) AS agent_name, min(scenario) AS scenario FROM base
    WHERE name = {_SESS} AND session_id IS NOT NULL GROUP BY session_id
)
SELECT r.trace_id, r.span_id, r.request_id, r.session_id, r.turn, r.start_ns,
       a.agent_name, a.scenario, r.source, r.continuity, r.diverged_at,
       r.tokens_lost AS reusable_tokens_lost, r.offer_reason, r.outcome,
       d.prompt_tokens, d.local_hit_tokens, d.pulled_tokens, d.recomputed_tokens, p.prefill_ms, r.ttft_ms
FROM req r
LEFT JOIN dec d ON d.request_id = r.request_id
LEFT JOIN pre p ON p.request_id = r.request_id
LEFT JOIN calls c ON c.trace_id = r.trace_id
LEFT JOIN agents a ON a.session_id = COALESCE(c.agent_session, r.session_id)
"""
CONTINUITY_SQL = continuity_sql(BASE_SQL)

CONTINUITY = View(
    "continuity",
    f"Chat turns the proxy checked for continuity (`{sc.SESSION_CONTINUITY}`, prefix matching on): does each "
    "extend its session's last served turn, and what a break cost.",
    (
        *common("trace_id", "span_id", "request_id", "session_id", "turn", "start_ns"),
        col("agent_name", VARCHAR, "the agent's session span's agent (via the trace's llm_call, else the session id)"),
        col("scenario", VARCHAR, "the agent's session span's bench scenario"),
        col("source", VARCHAR, "how the proxy found the session", sc.SESSION_SOURCES),
        col("continuity", VARCHAR, "against the session's last served turn", sc.CONTINUITIES),
        col("diverged_at", BIGINT, "index of the first message that differs (diverged turns)"),
        col("reusable_tokens_lost", BIGINT, "tokens D held that P would have pulled had the prompt extended them"),
        col("offer_reason", VARCHAR, "the proxy's offer decision", sc.OFFER_REASONS),
        col("outcome", VARCHAR, "P's decision outcome", sc.OUTCOMES),
        col("prompt_tokens", BIGINT, "prompt tokens (P's d2p decision)"),
        col("local_hit_tokens", BIGINT, "tokens P found in its prefix cache"),
        col("pulled_tokens", BIGINT, "tokens P pulled from D"),
        col("recomputed_tokens", BIGINT, "prompt tokens P computed"),
        col("prefill_ms", DOUBLE, "P's engine prefill span(s), ms"),
        col("ttft_ms", DOUBLE, "time to first token at the proxy, ms"),
    ),
    CONTINUITY_SQL,
)

VIEWS: tuple[View, ...] = (CONTINUITY,)
