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
from kvtrace.store.views.registry import BIGINT, BOOLEAN, DOUBLE, VARCHAR, View, col, common

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
# Row kinds of the breakdown's scan beside the contract's roles (internal, never stored): the proxy's request
# and retention spans.  The scan keeps them instead of span names, so the rows it materialises carry no long
# strings (DuckDB copies every string over 12 bytes to the heap).
KIND_REQUEST, KIND_RETENTION = "request", "retention"
K_REQUEST, K_RETENTION = literal(KIND_REQUEST), literal(KIND_RETENTION)
# every role a row of the breakdown's scan can carry (NULL aside: a span seen but not placed)
ROW_ROLES = (*sc.AGENT_ROLES, KIND_REQUEST, KIND_RETENTION)


def role_in(*roles: str) -> str:
    """``role IN (roles)``, written as the shorter of it and its complement over :data:`ROW_ROLES`
    (``role NOT IN (...)``; NULL is in neither): DuckDB turns an IN list of five or more constants
    into a hash (mark) join, which the breakdown would run over every scanned row, four times."""
    unknown = set(roles) - set(ROW_ROLES)
    if unknown:
        raise ValueError(f"not a role of the scan: {sorted(unknown)}")
    rest = [r for r in ROW_ROLES if r not in roles]
    return f"role IN ({literals(roles)})" if len(roles) <= len(rest) else f"role NOT IN ({literals(rest)})"


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

# Two helper scans, read by ``kvtrace doctor``'s census (kvtrace/analysis/agents.py): kvtrace's own
# agent, request and retention spans by name (``kvtrace_agent_spans``, with their role), and every
# span whose name is not kvtrace's (``kvtrace_foreign_spans``: a filter on the name only, so DuckDB
# pushes it into the Parquet reader), classified by attribute, those with no classifying attribute
# dropped.  The breakdown reads neither: it has its own single scan (``SCAN_SQL`` below).
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
# One scan for the breakdown (``b0``, MATERIALIZED): kvtrace's agent, request and retention spans by
# name and every other span classified by attribute, in one pass over ``spans`` (so that on ClickHouse,
# which analyses a CTE again at every reference, the breakdown's query tree holds the store's scan as
# few times as possible).  ``fgn`` marks the other conventions' spans; ``trace_id`` is kept only for
# them, the proxy's spans and kvtrace's own LLM calls without a TTFT (``nt``: non-streamed, they take
# their request's, joined by ``request_id``), ``span_id`` only for the calls.  The rows carry a role
# (the proxy's spans: ``K_REQUEST`` / ``K_RETENTION``), not the span name: short strings, so the rows
# materialised here and in ``base`` hold no heap strings.
_OWN = f"starts_with(SpanName, {literal(sc.KVTRACE_SPAN_PREFIX)})"
_LLM_NAME = literal(sc.SPAN_AGENT_LLM_CALL)
# which of the scan's rows keep their span's trace id (over the scan's own columns)
SCAN_KEEPS_TRACE = f"role IN ({K_REQUEST}, {K_RETENTION}) OR fgn OR nt"


def scan_ids(trace_id: str, span_id: str) -> tuple[str, str]:
    """The scan's ``trace_id`` and ``span_id`` columns over a span's two ids (``trace_id`` /
    ``span_id`` here; ``TraceId`` / ``SpanId`` in ClickHouse's materialized scan table, which stores
    only those and derives the two columns on read): each kept only on the rows that need it."""
    return f"CASE WHEN {SCAN_KEEPS_TRACE} THEN {trace_id} END", f"CASE WHEN fgn OR nt THEN {span_id} END"


_TRACE_ID, _SPAN_ID = scan_ids("trace_id", "span_id")
_SCAN_TEMPLATE = f"""
SELECT role, convention, fgn, nt, session_id, turn, start_ns, end_ns,
       {_TRACE_ID} AS trace_id,
       {_SPAN_ID} AS span_id, CASE WHEN role = {K_REQUEST} OR nt THEN rid END AS request_id,
       ttft_ms, kv_byte_s
FROM (
    SELECT *, COALESCE(llm AND ttft_ms IS NULL, false) AS nt FROM (
        SELECT CASE WHEN {_OWN} THEN CASE name {_OWN_ROLE} WHEN {REQUEST} THEN {K_REQUEST}
                                               WHEN {RETENTION} THEN {K_RETENTION} END
                    ELSE {_role_case()} END AS role,
               CASE WHEN {_OWN} THEN {KVTRACE} ELSE {_convention_case()} END AS convention, NOT {_OWN} AS fgn,
               name = {_LLM_NAME} AS llm,
               CASE WHEN {_OWN} THEN session_id ELSE {_first(sc.SESSION_ATTRIBUTES)} END AS session_id,
               CASE WHEN {_OWN} THEN turn END AS turn, start_ns, end_ns, trace_id, span_id,
               CASE WHEN name IN ({REQUEST}, {_LLM_NAME}) THEN {str_attr(sc.GEN_AI_REQUEST_ID)} END AS rid,
               CASE WHEN NOT {_OWN} THEN COALESCE({float_attr(sc.LLM_TTFT_MS)}, {_TTFT_S} * 1e3)
                    WHEN name = {_LLM_NAME} THEN {float_attr(sc.LLM_TTFT_MS)}
                    WHEN name = {REQUEST} THEN {float_attr(sc.REQUEST_TTFT_MS)} END AS ttft_ms,
               CASE name WHEN {RETENTION} THEN {int_attr(sc.KV_RETENTION_BYTES)} * ((end_ns - start_ns) / 1e9) END
                   AS kv_byte_s
        FROM {{spans}} WHERE SpanName IN ({literals(OWN_NAMES)}) OR NOT {_OWN}
    ) AS s WHERE convention IS NOT NULL
) AS n
"""


def scan_sql(spans: str = "spans") -> str:
    """The scan over ``spans`` (a relation with the ``spans`` view's columns): :data:`SCAN_SQL`, or
    the same over part of a store's files (:mod:`kvtrace.store.scan_index` writes it per file)."""
    return _SCAN_TEMPLATE.replace("{spans}", spans)


SCAN = "kvtrace_scan"
"""The view of the scan the breakdown reads: :data:`SCAN_SQL`, or where the store has per-file
indexes (:mod:`kvtrace.store.scan_index`) their rows and the scan of the other files."""
SCAN_SQL = scan_sql()

# The time join's bucket: an LLM call and a request overlap iff both cover the instant the later of
# them starts, so each is listed once per bucket of this many ns it covers and a pair is kept in the
# bucket of that instant only: an equality join (no nested loop over every call x every request),
# each overlapping pair found exactly once.
BUCKET_NS = 1_000_000_000

# The joins, shared by the breakdown and the public views.  Every relation reads ``b0`` and none
# reads another twice where once will do (ClickHouse analyses each reference anew):
# ``bt`` the spans carrying trace ids with their trace's session (window functions over the trace:
# the agent's, else the proxy's; ``tf`` = the trace holds another convention's spans); ``pr`` every
# (LLM call, request) pair that overlaps in time, ranked (same trace first, then a request of the
# call's session, then one with none or a prefix session; longest overlap first); another convention's
# calls meet requests in the time buckets of ``bx`` (``bk``; requests are listed there only when such a
# call exists: ``fll``), kvtrace's own calls (``lf`` false) only their request, by ``request_id``: one
# more row each in ``bx``, keyed by the id (``rk``, ``bk`` -1), so the one join of ``bx`` with itself
# finds both kinds of pairs (listed per second, calls queued for minutes met every call of the fleet in
# each second of theirs); ``lk_call`` each
# call's request, ``lk_trace`` the session of each request trace a broken context left without agent
# spans (``join = session_time``).  The gate: when no span carrying a trace id needs the joins (none of
# another convention, no kvtrace call without a TTFT: ``need``, one maximum over those rows only, after
# the scan, so the scan itself streams), ``bt`` is empty, so are the trace windows, the time join and
# every lookup, and the proxy's spans pass through ``base`` unchanged.
JOINS_CTE = f"""
b0 AS MATERIALIZED (SELECT * FROM {SCAN}),
bt AS (
    SELECT *, COALESCE(min(CASE WHEN fgn THEN session_id END) OVER t,
                       min(CASE WHEN role = {K_REQUEST} THEN session_id END) OVER t) AS tsid,
           max(CASE WHEN fgn THEN 1 ELSE 0 END) OVER t AS tf
    FROM (SELECT *, max(fgn OR nt) OVER () AS need, max(fgn AND role = {LLM}) OVER () AS fll
          FROM b0 WHERE trace_id IS NOT NULL) AS g
    WHERE need WINDOW t AS (PARTITION BY trace_id)
),
bx AS (
    SELECT trace_id, span_id, fgn, role, session_id, tsid, tf, start_ns, end_ns, ttft_ms, request_id,
           CASE WHEN u > hi THEN -1 ELSE u END AS bk, CASE WHEN u > hi THEN request_id ELSE '' END AS rk
    FROM (
        SELECT *, unnest(range(lo, hi + CASE WHEN byid THEN 2 ELSE 1 END)) AS u FROM (
            SELECT *, CASE WHEN timed THEN start_ns // {BUCKET_NS} ELSE 0 END AS lo,
                   CASE WHEN timed THEN greatest(end_ns - 1, start_ns) // {BUCKET_NS} ELSE -1 END AS hi
            FROM (
                SELECT trace_id, span_id, fgn, role, session_id, tsid, tf, start_ns, end_ns, ttft_ms, request_id,
                       (role = {LLM} AND fgn) OR (role = {K_REQUEST} AND fll) AS timed,
                       NOT fgn AND request_id IS NOT NULL AS byid
                FROM bt WHERE role IN ({LLM}, {K_REQUEST})
            ) AS k
        ) AS w
    ) AS x
),
pr AS (
    SELECT *, row_number() OVER (PARTITION BY llm_span_id ORDER BY jk, overlap DESC, rs) AS by_llm,
           row_number() OVER (PARTITION BY req_trace_id, rs, lf ORDER BY jk, overlap DESC, llm_span_id) AS by_req
    FROM (
        SELECT l.span_id AS llm_span_id, l.fgn AS lf, l.trace_id AS llm_trace_id, l.tsid AS llm_session_id,
               r.trace_id AS req_trace_id, r.start_ns AS rs, r.ttft_ms AS r_ttft,
               CASE WHEN r.trace_id = l.trace_id THEN 0 WHEN r.session_id = l.tsid THEN 1 ELSE 2 END AS jk,
               least(l.end_ns, r.end_ns) - greatest(l.start_ns, r.start_ns) AS overlap
        FROM bx l JOIN bx r ON r.bk = l.bk AND r.rk = l.rk
        WHERE l.role = {LLM} AND r.role = {K_REQUEST} AND r.start_ns < l.end_ns AND r.end_ns > l.start_ns
          AND (l.bk = -1 OR (l.bk = greatest(l.start_ns, r.start_ns) // {BUCKET_NS}
                             AND (r.trace_id = l.trace_id OR (r.tf = 0 AND (r.session_id IS NULL
                                  OR r.session_id LIKE {_PREFIX} OR r.session_id = l.tsid)))))
    ) AS c
),
lk_call AS (SELECT llm_span_id, rs, r_ttft FROM pr WHERE by_llm = 1),
lk_trace AS (
    SELECT req_trace_id AS trace_id, min(llm_session_id) AS session_id FROM pr
    WHERE lf AND jk > 0 AND by_req = 1 AND llm_session_id IS NOT NULL GROUP BY req_trace_id
)"""

# The breakdown's rows: kvtrace's agent spans as they are, the spans carrying trace ids in the
# session of their trace (agent spans of another convention: the trace's; requests and retention: the
# trace's where it holds such spans, else the foreign call's their trace was joined to by time: one
# lookup by trace, ``tj``), turn indices dropped where the trace changed session (the proxy numbers
# requests, not the agent's turns), an LLM call's TTFT (another convention's, or kvtrace's own
# non-streamed call's) from its request when it has none, as ``agent_llm_calls`` reports it.  ``base``
# is a UNION ALL of the two kinds of rows: the spans without trace ids (kvtrace's agent spans) straight
# from ``b0``, only the others through the lookups (empty behind the gate).  ``ftn``: one turn per foreign trace,
# the extent of its placed agent-side spans, numbered in start order within the session (a session
# with kvtrace turn spans uses those: ``turn_windows``); ``unp``: each session's spans seen but not
# placed.  Both read ``bt``, not ``base``: a foreign span's session is its trace's.
BASE_CTE = """
tj AS (
    SELECT trace_id, min(tsid) AS session_id FROM bt WHERE tf = 1 AND tsid IS NOT NULL GROUP BY trace_id
    UNION ALL
    SELECT trace_id, session_id FROM lk_trace
),
base AS NOT MATERIALIZED (
    SELECT role, session_id, turn, start_ns, end_ns, ttft_ms, kv_byte_s FROM b0 WHERE trace_id IS NULL
    UNION ALL
    SELECT b.role, COALESCE(t.session_id, b.session_id) AS session_id,
           CASE WHEN t.trace_id IS NULL THEN b.turn END AS turn, b.start_ns, b.end_ns,
           CASE WHEN y.llm_span_id IS NOT NULL AND b.ttft_ms IS NULL AND y.r_ttft IS NOT NULL
                THEN (y.rs - b.start_ns) / 1e6 + y.r_ttft ELSE b.ttft_ms END AS ttft_ms, b.kv_byte_s
    FROM b0 b LEFT JOIN tj t ON t.trace_id = b.trace_id LEFT JOIN lk_call y ON y.llm_span_id = b.span_id
    WHERE b.trace_id IS NOT NULL
),
ftn AS (
    SELECT *, CAST(row_number() OVER (PARTITION BY session_id ORDER BY s, trace_id) - 1 AS INTEGER) AS n FROM (
        SELECT tsid AS session_id, trace_id, min(start_ns) AS s, max(end_ns) AS e FROM bt
        WHERE fgn AND role IS NOT NULL AND tsid IS NOT NULL GROUP BY tsid, trace_id
    ) AS w
),
unp AS (
    SELECT COALESCE(tsid, session_id) AS session_id, CAST(count(*) AS BIGINT) AS unplaced
    FROM bt WHERE fgn AND role IS NULL GROUP BY COALESCE(tsid, session_id)
)"""

# ---------------------------------------------------------------------------------------------
# Public views: the same joins, row by row
# ---------------------------------------------------------------------------------------------

TRACE_SESSIONS_SQL = f"""
WITH {JOINS_CTE},
tt AS (
    SELECT trace_id, min(CASE WHEN fgn THEN session_id END) AS agent_session_id,
           min(CASE WHEN role = {K_REQUEST} THEN session_id END) AS proxy_session_id, max(tf) AS tf
    FROM bt GROUP BY trace_id
)
SELECT t.trace_id, COALESCE(x.session_id, t.agent_session_id, t.proxy_session_id) AS session_id,
       t.agent_session_id, t.proxy_session_id,
       CASE WHEN x.trace_id IS NULL THEN {J_TRACE} ELSE {J_TIME} END AS join_kind
FROM tt t LEFT JOIN lk_trace x ON x.trace_id = t.trace_id
WHERE x.trace_id IS NOT NULL OR (t.tf = 1 AND COALESCE(t.agent_session_id, t.proxy_session_id) IS NOT NULL)
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
fl AS (SELECT span_id, trace_id, tsid AS session_id, convention FROM bt WHERE fgn AND role = {LLM}),
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
    FROM pr p JOIN rr r ON r.trace_id = p.req_trace_id AND r.start_ns = p.rs WHERE p.lf AND p.by_llm = 1
)
SELECT c.trace_id, c.span_id, c.name, COALESCE(f.session_id, c.session_id) AS session_id,
       COALESCE(f.convention, {KVTRACE}) AS convention, c.model,
       COALESCE(c.input_tokens, m.input_tokens) AS input_tokens,
       COALESCE(c.output_tokens, m.output_tokens) AS output_tokens,
       COALESCE(c.cached_tokens, m.cached_tokens) AS cached_tokens,
       COALESCE(c.ttft_ms, (m.start_ns - c.start_ns) / 1e6 + m.ttft_ms) AS ttft_ms,
       c.start_ns, c.end_ns, c.duration_ms, c.status_code,
       COALESCE(m.join_kind, {J_NONE}) AS join_kind, m.trace_id AS request_trace_id, m.span_id AS request_span_id,
       COALESCE(m.request_id, c.request_id) AS request_id, m.outcome, m.pulled_tokens
FROM calls c LEFT JOIN fl f ON f.span_id = c.span_id AND f.trace_id = c.trace_id
LEFT JOIN m ON m.call_span_id = c.span_id AND m.call_trace_id = c.trace_id
"""

_HELPER = "Helper view of `session_breakdown` / `turn_breakdown` (internal; may change)."
HELPERS: tuple[View, ...] = (
    View(
        SCAN,
        _HELPER + " The breakdown's scan: kvtrace's agent, request and retention spans and other conventions' "
        "agent-side spans, one row each with its role (read from per-file indexes where the store has them).",
        (
            col("role", VARCHAR, "the span's role; the proxy's spans: `request` / `retention` (NULL: not placed)"),
            col("convention", VARCHAR, "the convention that classified it", sc.CONVENTIONS),
            col("fgn", BOOLEAN, "another convention's span"),
            col("nt", BOOLEAN, "kvtrace's own LLM call without a TTFT"),
            *common("session_id", "turn", "start_ns", "end_ns", "trace_id", "span_id", "request_id"),
            col("ttft_ms", DOUBLE, "TTFT, ms"),
            col("kv_byte_s", DOUBLE, "retention spans: bytes x held seconds"),
        ),
        SCAN_SQL,
        helper=True,
    ),
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
SCAN_COLUMNS = ", ".join(c.name for c in next(v for v in HELPERS if v.name == SCAN).columns)
"""The scan's columns, in order (``SELECT`` lists over its indexes)."""
