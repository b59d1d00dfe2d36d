"""Agent spans of any convention: which role each plays, which session its trace belongs to, and
which proxy request each LLM call made.

The span contract's mapping (:mod:`kvtrace.semconv.conventions`) becomes SQL here: kvtrace's own
agent spans by name, every other span by its attributes (OTel GenAI ``gen_ai.operation.name``,
OpenInference ``openinference.span.kind``, OpenLLMetry ``traceloop.span.kind`` /
``llm.request.type``).  The breakdown (:mod:`.breakdown`) builds on the CTEs below; the public
views ``trace_sessions`` and ``agent_llm_calls`` show the same joins row by row.

Sessions: the first session id found on a trace's agent-side spans (``session.id``,
``gen_ai.conversation.id``, ``langfuse.session.id``, Traceloop's association property) is the
session of every span of that trace, else the proxy's session of a request in the trace (its
prefix session: the agent set none).  Where the W3C context did not reach the proxy (the request
is the root of a trace without agent spans, e.g. LangGraph + OpenInference), a request whose own
session is none or a prefix session (or the call's own) joins the foreign LLM call it overlaps
longest (``join = session_time``), and its trace takes that call's session.

Cost: the classification's map lookups run only on spans whose name does not start with
``kvtrace.`` (a string test on every span), so a store of kvtrace's own spans pays nothing for
them; trace ids are carried only for requests and for spans whose session could change.
"""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.store.sql import float_attr, int_attr, literal, literals, str_attr
from kvtrace.store.views.registry import BIGINT, DOUBLE, VARCHAR, View, col, common

KVTRACE = literal(sc.CONV_KVTRACE)
LLM, TOOL, AGENT, APP, PAUSE, TURN, SESSION = (
    literal(r)
    for r in (
        sc.ROLE_LLM_CALL,
        sc.ROLE_TOOL_WAIT,
        sc.ROLE_AGENT,
        sc.ROLE_APP_WORK,
        sc.ROLE_USER_PAUSE,
        sc.ROLE_TURN,
        sc.ROLE_SESSION,
    )
)
REQUEST, RETENTION = literal(sc.SPAN_PROXY_REQUEST), literal(sc.SPAN_KV_RETENTION)
J_TRACE, J_TIME, J_NONE = (literal(j) for j in sc.JOINS)


def _first(attrs, accessor=str_attr) -> str:
    return f"COALESCE({', '.join(accessor(a) for a in attrs)})"


def _role_case() -> str:
    """The role of a span that is not kvtrace's own, by :data:`~kvtrace.semconv.ROLE_RULES`."""
    whens = " ".join(f"WHEN {str_attr(a)} IN ({literals(v)}) THEN {literal(r)}" for _, a, v, r in sc.ROLE_RULES)
    return f"CASE {whens} END"


def _convention_case() -> str:
    """The convention of the first classifying attribute a foreign span carries (NULL: none, or
    vLLM's own span, which carries ``gen_ai.*`` attributes but is the engine's)."""
    firsts: dict[str, str] = {}
    for conv, attr, _, _ in sc.ROLE_RULES:
        firsts.setdefault(attr, conv)
    whens = " ".join(f"WHEN {str_attr(a)} IS NOT NULL THEN {literal(c)}" for a, c in firsts.items())
    return f"CASE WHEN name = {literal(sc.SPAN_VLLM_LLM_REQUEST)} THEN NULL {whens} END"


OWN_NAMES = (*sc.ROLE_BY_SPAN_NAME, sc.SPAN_PROXY_REQUEST, sc.SPAN_KV_RETENTION)
_OWN_ROLE = " ".join(f"WHEN {literal(n)} THEN {literal(r)}" for n, r in sc.ROLE_BY_SPAN_NAME.items())
_PREFIX = literal(sc.PREFIX_SESSION_PREFIX + "%")
_TTFT_S = float_attr(sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK)

# Three scans.  kvtrace's own agent, request and retention spans by name (``kvtrace_agent_spans``, the
# breakdown's materialised ``b0``: what it read before conventions were mapped, plus the role).
# Every span whose name is not kvtrace's (``kvtrace_foreign_spans``): a filter on the name only, so
# DuckDB pushes it into the Parquet reader and a store of kvtrace's spans reads nothing more than
# that column; the spans found are classified by attribute, those with no classifying attribute
# dropped.  And, only when there are foreign spans (``gate``), the proxy's request and retention
# spans again with their trace ids (``kvtrace_proxy_spans``): the breakdown then takes them from
# there, in the session of their trace.
AGENT_SPANS_SQL = f"""
SELECT name, CASE name {_OWN_ROLE} END AS role, {KVTRACE} AS convention, session_id, turn, start_ns, end_ns,
       CASE name WHEN {literal(sc.SPAN_AGENT_LLM_CALL)} THEN {float_attr(sc.LLM_TTFT_MS)}
                 WHEN {REQUEST} THEN {float_attr(sc.REQUEST_TTFT_MS)} END AS ttft_ms,
       CASE name WHEN {RETENTION} THEN {int_attr(sc.KV_RETENTION_BYTES)} * ((end_ns - start_ns) / 1e9) END
           AS kv_byte_s
FROM spans
WHERE name IN ({literals(OWN_NAMES)})
"""
FOREIGN_SPANS_SQL = f"""
SELECT * FROM (
    SELECT name, {_role_case()} AS role, {_convention_case()} AS convention,
           {_first(sc.SESSION_ATTRIBUTES)} AS session_id, start_ns, end_ns, trace_id, span_id,
           COALESCE({float_attr(sc.LLM_TTFT_MS)}, {_TTFT_S} * 1e3) AS ttft_ms
    FROM spans WHERE NOT starts_with(SpanName, {literal(sc.KVTRACE_SPAN_PREFIX)})
) AS f WHERE convention IS NOT NULL
"""
PROXY_SPANS_SQL = f"""
SELECT name, session_id, turn, start_ns, end_ns, trace_id,
       CASE name WHEN {REQUEST} THEN {float_attr(sc.REQUEST_TTFT_MS)} END AS ttft_ms,
       CASE name WHEN {RETENTION} THEN {int_attr(sc.KV_RETENTION_BYTES)} * ((end_ns - start_ns) / 1e9) END
           AS kv_byte_s
FROM spans WHERE name IN ({REQUEST}, {RETENTION})
"""

# The joins, shared by the breakdown and the public views: ``fx`` the foreign agent-side spans,
# ``rq0`` / ``rq`` the proxy's request and retention spans / requests (empty without foreign
# spans), ``atr`` each foreign trace's session (the agent's, else the proxy's), ``pr`` every
# (LLM call, request) pair that overlaps in time, ranked (same trace first, then a request of the
# call's session, then one with none or a prefix session; longest overlap first), ``tmap`` the session of each trace whose spans change
# session.  In a store without foreign spans every one of them is empty, and the joins with them
# cost a probe of an empty table.
JOINS_CTE = f"""
fx AS MATERIALIZED (SELECT * FROM kvtrace_foreign_spans),
gate AS (SELECT 1 AS open FROM fx LIMIT 1),
rq0 AS MATERIALIZED (SELECT p.* FROM kvtrace_proxy_spans p JOIN gate ON true),
rq AS (SELECT trace_id, session_id, start_ns, end_ns, ttft_ms FROM rq0 WHERE name = {REQUEST}),
atr AS (
    SELECT f.trace_id, COALESCE(f.sid, p.sid) AS session_id, f.sid AS agent_session_id, p.sid AS proxy_session_id
    FROM (SELECT trace_id, min(session_id) AS sid FROM fx GROUP BY trace_id) f
    LEFT JOIN (SELECT trace_id, min(session_id) AS sid FROM rq WHERE trace_id IN (SELECT trace_id FROM fx)
               GROUP BY trace_id) p ON p.trace_id = f.trace_id
),
fl AS (
    SELECT l.span_id, l.trace_id, l.start_ns, l.end_ns, a.session_id
    FROM fx l JOIN atr a ON a.trace_id = l.trace_id WHERE l.role = {LLM}
),
cand AS (
    SELECT l.span_id AS llm_span_id, l.trace_id AS llm_trace_id, r.trace_id AS req_trace_id, r.start_ns AS rs,
           r.ttft_ms AS r_ttft, 0 AS jk, least(l.end_ns, r.end_ns) - greatest(l.start_ns, r.start_ns) AS overlap
    FROM fl l JOIN rq r ON r.trace_id = l.trace_id
    WHERE r.start_ns < l.end_ns AND r.end_ns > l.start_ns
    UNION ALL
    SELECT l.span_id AS llm_span_id, l.trace_id AS llm_trace_id, r.trace_id AS req_trace_id, r.start_ns AS rs,
           r.ttft_ms AS r_ttft, CASE WHEN r.session_id = l.session_id THEN 1 ELSE 2 END AS jk,
           least(l.end_ns, r.end_ns) - greatest(l.start_ns, r.start_ns) AS overlap
    FROM fl l, rq r
    WHERE r.start_ns < l.end_ns AND r.end_ns > l.start_ns AND r.trace_id NOT IN (SELECT trace_id FROM fx)
      AND (r.session_id IS NULL OR r.session_id LIKE {_PREFIX} OR r.session_id = l.session_id)
),
pr AS (
    SELECT *, row_number() OVER (PARTITION BY llm_span_id ORDER BY jk, overlap DESC, rs) AS by_llm,
           row_number() OVER (PARTITION BY req_trace_id, rs ORDER BY jk, overlap DESC, llm_span_id) AS by_req
    FROM cand
),
tmap AS (
    SELECT trace_id, session_id, {J_TRACE} AS join_kind FROM atr WHERE session_id IS NOT NULL
    UNION ALL
    SELECT p.req_trace_id AS trace_id, min(a.session_id) AS session_id, {J_TIME} AS join_kind
    FROM pr p JOIN atr a ON a.trace_id = p.llm_trace_id
    WHERE p.jk > 0 AND p.by_req = 1 AND a.session_id IS NOT NULL
    GROUP BY p.req_trace_id
)"""

# The breakdown's rows: kvtrace's agent spans from ``b0`` as they are (so a session filter still
# reaches the materialised scan), the requests and retention spans in the session of their trace
# (``tmap``; from ``b0`` when there are no foreign spans), turn indices dropped where the trace
# changed session (the proxy numbers requests, not the agent's turns), a
# foreign LLM call's TTFT from its request when it has none.  ``ftn``: one turn per foreign trace, the
# extent of its placed agent-side spans, numbered in start order within the session (a session with
# kvtrace turn spans uses those: ``turn_windows``); ``unp``: each session's spans seen but not placed.
BASE_CTE = f"""
ftw AS (
    SELECT a.session_id, f.trace_id, min(f.start_ns) AS s, max(f.end_ns) AS e
    FROM fx f JOIN atr a ON a.trace_id = f.trace_id
    WHERE f.role IS NOT NULL AND a.session_id IS NOT NULL
    GROUP BY a.session_id, f.trace_id
),
ftn AS (SELECT *, CAST(row_number() OVER (PARTITION BY session_id ORDER BY s, trace_id) - 1 AS INTEGER) AS n FROM ftw),
base AS (
    SELECT name, role, session_id, turn, start_ns, end_ns, ttft_ms, kv_byte_s FROM b0
    WHERE name NOT IN ({REQUEST}, {RETENTION}) OR NOT EXISTS (SELECT 1 FROM gate)
    UNION ALL
    SELECT r.name, NULL AS role, COALESCE(t.session_id, r.session_id) AS session_id,
           CASE WHEN t.trace_id IS NULL THEN r.turn END AS turn, r.start_ns, r.end_ns, r.ttft_ms, r.kv_byte_s
    FROM rq0 r LEFT JOIN tmap t ON t.trace_id = r.trace_id
    UNION ALL
    SELECT f.name, f.role, COALESCE(t.session_id, f.session_id) AS session_id, NULL AS turn,
           f.start_ns, f.end_ns,
           CASE WHEN p.llm_span_id IS NOT NULL AND f.ttft_ms IS NULL AND p.r_ttft IS NOT NULL
                THEN (p.rs - f.start_ns) / 1e6 + p.r_ttft ELSE f.ttft_ms END AS ttft_ms,
           NULL AS kv_byte_s
    FROM fx f LEFT JOIN tmap t ON t.trace_id = f.trace_id
    LEFT JOIN (SELECT llm_span_id, rs, r_ttft FROM pr WHERE by_llm = 1) p ON p.llm_span_id = f.span_id
),
unp AS (
    SELECT COALESCE(t.session_id, f.session_id) AS session_id, CAST(count(*) AS BIGINT) AS unplaced
    FROM fx f LEFT JOIN tmap t ON t.trace_id = f.trace_id WHERE f.role IS NULL
    GROUP BY COALESCE(t.session_id, f.session_id)
)"""

# ---------------------------------------------------------------------------------------------
# Public views: the same joins, row by row
# ---------------------------------------------------------------------------------------------

TRACE_SESSIONS_SQL = f"""
WITH {JOINS_CTE}
SELECT t.trace_id, t.session_id, a.agent_session_id,
       COALESCE(a.proxy_session_id, q.proxy_session_id) AS proxy_session_id, t.join_kind
FROM tmap t LEFT JOIN atr a ON a.trace_id = t.trace_id
LEFT JOIN (SELECT trace_id, min(session_id) AS proxy_session_id FROM rq GROUP BY trace_id) q ON q.trace_id = t.trace_id
"""

_R_COLS = ", ".join(
    f"r.{c} AS {c}"
    for c in (
        "trace_id",
        "span_id",
        "request_id",
        "start_ns",
        "ttft_ms",
        "input_tokens",
        "output_tokens",
        "cached_tokens",
        "outcome",
        "pulled_tokens",
    )
)
_CALL_MODEL = _first((sc.GEN_AI_REQUEST_MODEL, sc.OI_LLM_MODEL_NAME))
_CALL_TTFT = f"COALESCE({float_attr(sc.LLM_TTFT_MS)}, {_TTFT_S} * 1e3)"
AGENT_LLM_CALLS_SQL = f"""
WITH {JOINS_CTE},
calls AS (
    SELECT trace_id, span_id, name, session_id, request_id, start_ns, end_ns, duration_ms, status_code,
           {_CALL_MODEL} AS model, {_first(sc.INPUT_TOKEN_ATTRIBUTES, int_attr)} AS input_tokens,
           {_first(sc.OUTPUT_TOKEN_ATTRIBUTES, int_attr)} AS output_tokens,
           {_first(sc.CACHED_TOKEN_ATTRIBUTES, int_attr)} AS cached_tokens, {_CALL_TTFT} AS ttft_ms
    FROM spans WHERE name = {literal(sc.SPAN_AGENT_LLM_CALL)} OR span_id IN (SELECT span_id FROM fl)
),
rr AS (
    SELECT trace_id, span_id, request_id, start_ns, {float_attr(sc.REQUEST_TTFT_MS)} AS ttft_ms,
           {int_attr(sc.GEN_AI_USAGE_INPUT_TOKENS)} AS input_tokens,
           {int_attr(sc.GEN_AI_USAGE_OUTPUT_TOKENS)} AS output_tokens,
           {int_attr(sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS)} AS cached_tokens, {str_attr(sc.KV_OUTCOME)} AS outcome,
           {int_attr(sc.KV_PULLED_TOKENS)} AS pulled_tokens
    FROM spans WHERE name = {REQUEST}
),
m AS (
    SELECT c.span_id AS call_span_id, c.trace_id AS call_trace_id, {_R_COLS}, {J_TRACE} AS join_kind
    FROM calls c JOIN rr r ON r.request_id = c.request_id WHERE c.name = {literal(sc.SPAN_AGENT_LLM_CALL)}
    UNION ALL
    SELECT p.llm_span_id AS call_span_id, p.llm_trace_id AS call_trace_id, {_R_COLS},
           CASE WHEN p.jk = 0 THEN {J_TRACE} ELSE {J_TIME} END AS join_kind
    FROM pr p JOIN rr r ON r.trace_id = p.req_trace_id AND r.start_ns = p.rs WHERE p.by_llm = 1
)
SELECT c.trace_id, c.span_id, c.name, COALESCE(f.session_id, c.session_id) AS session_id,
       COALESCE(b.convention, {KVTRACE}) AS convention, c.model,
       COALESCE(c.input_tokens, m.input_tokens) AS input_tokens,
       COALESCE(c.output_tokens, m.output_tokens) AS output_tokens,
       COALESCE(c.cached_tokens, m.cached_tokens) AS cached_tokens,
       COALESCE(c.ttft_ms, (m.start_ns - c.start_ns) / 1e6 + m.ttft_ms) AS ttft_ms,
       c.start_ns, c.end_ns, c.duration_ms, c.status_code,
       COALESCE(m.join_kind, {J_NONE}) AS join_kind, m.trace_id AS request_trace_id, m.span_id AS request_span_id,
       COALESCE(m.request_id, c.request_id) AS request_id, m.outcome, m.pulled_tokens
FROM calls c LEFT JOIN fl f ON f.span_id = c.span_id AND f.trace_id = c.trace_id
LEFT JOIN (SELECT span_id, trace_id, convention FROM fx) b ON b.span_id = c.span_id AND b.trace_id = c.trace_id
LEFT JOIN m ON m.call_span_id = c.span_id AND m.call_trace_id = c.trace_id
"""

_HELPER = "Helper view of `session_breakdown` / `turn_breakdown` (internal; may change)."
HELPERS: tuple[View, ...] = (
    View(
        "kvtrace_foreign_spans",
        _HELPER + " Agent-side spans of other conventions (names not kvtrace's), classified by attribute.",
        (
            col("name", VARCHAR, "span name"),
            col("role", VARCHAR, "the span's role (NULL: seen but not placed)", sc.AGENT_ROLES[2:6]),
            col("convention", VARCHAR, "the convention that classified it", sc.CONVENTIONS[1:]),
            col("session_id", VARCHAR, "the conventions' session attributes, first present"),
            *common("start_ns", "end_ns", "trace_id", "span_id"),
            col("ttft_ms", DOUBLE, "own TTFT, ms"),
        ),
        FOREIGN_SPANS_SQL,
        helper=True,
    ),
    View(
        "kvtrace_proxy_spans",
        _HELPER + " The proxy's request and kv retention spans with their trace ids.",
        (
            col("name", VARCHAR, "span name"),
            *common("session_id", "turn", "start_ns", "end_ns", "trace_id"),
            col("ttft_ms", DOUBLE, "requests: TTFT at the proxy, ms"),
            col("kv_byte_s", DOUBLE, "retention spans: bytes x held seconds"),
        ),
        PROXY_SPANS_SQL,
        helper=True,
    ),
)

VIEWS: tuple[View, ...] = (
    View(
        "trace_sessions",
        "Traces whose session the agent decides: those holding agent-side spans of another convention (their "
        "session id, else the proxy's) and the proxy-request traces a broken context link left without one, "
        "joined to the LLM call they overlap. Every span of such a trace is in `session_id` in the breakdown.",
        (
            *common("trace_id"),
            col("session_id", VARCHAR, "the session every span of the trace is counted in"),
            col("agent_session_id", VARCHAR, "the session id the agent-side spans carry (NULL: none did)"),
            col("proxy_session_id", VARCHAR, "the session the proxy named for the trace's requests (e.g. `prefix-…`)"),
            col("join_kind", VARCHAR, "how the trace found its session (`trace`: its own agent spans)", sc.JOINS[:2]),
        ),
        TRACE_SESSIONS_SQL,
    ),
    View(
        "agent_llm_calls",
        "Every LLM call an agent made, kvtrace's own and any convention's, with its proxy request and the KV "
        "decision the proxy recorded (`request_id` joins `kv_decisions`). Tokens and TTFT are the call's own "
        "where its span has them, else the request's.",
        (
            *common("trace_id", "span_id"),
            col("name", VARCHAR, "span name"),
            col("session_id", VARCHAR, "the session of the call's trace"),
            col("convention", VARCHAR, "whose span", sc.CONVENTIONS),
            col("model", VARCHAR, "requested model"),
            col("input_tokens", BIGINT, "prompt tokens, cached ones included"),
            col("output_tokens", BIGINT, "generated tokens"),
            col("cached_tokens", BIGINT, "prompt tokens read from cache (the proxy's: local hit + pulled)"),
            col("ttft_ms", DOUBLE, "time to first token from the call's start, ms"),
            *common("start_ns", "end_ns", "duration_ms", "status_code"),
            col("join_kind", VARCHAR, "how the call found its proxy request", sc.JOINS),
            col("request_trace_id", VARCHAR, "the request's trace"),
            col("request_span_id", VARCHAR, "the request's span"),
            *common("request_id"),
            col("outcome", VARCHAR, "P's KV decision as the proxy recorded it", sc.OUTCOMES),
            col("pulled_tokens", BIGINT, "tokens P pulled from D"),
        ),
        AGENT_LLM_CALLS_SQL,
    ),
)
