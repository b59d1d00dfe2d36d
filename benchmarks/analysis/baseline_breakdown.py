"""The pre-#27 session and turn breakdown SQL (kvtrace's own span names only), verbatim from
``kvtrace/store/views/breakdown.py`` before agent spans were read by convention: the baseline that
``bench_analysis.py`` times the current views against in the same run.  Its scan is inlined (the
old ``kvtrace_agent_spans`` view), so it runs on any connection of :func:`kvtrace.store.connect`.
"""

# ruff: noqa: E501
from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.store.sql import float_attr, int_attr, literal, literals
from kvtrace.store.units import GIB

# category codes, higher wins
CAT_PAUSE, CAT_APP, CAT_TOOL, CAT_INPUT, CAT_GEN = 1, 2, 3, 4, 5
PRECEDENCE = ("generation", "input_processing", "tool_wait", "app_work", "user_pause")

_SESSION, _TURN, _LLM = (literal(n) for n in (sc.SPAN_AGENT_SESSION, sc.SPAN_AGENT_TURN, sc.SPAN_AGENT_LLM_CALL))
_TOOL, _APP, _PAUSE, _REQUEST = (
    literal(n)
    for n in (sc.SPAN_AGENT_TOOL_CALL, sc.SPAN_AGENT_APP_WORK, sc.SPAN_AGENT_USER_PAUSE, sc.SPAN_PROXY_REQUEST)
)
_RETENTION = literal(sc.SPAN_KV_RETENTION)

# One scan of the store feeds everything: the agent and proxy spans the breakdown needs, with TTFT
# by the ``llm_calls`` / ``requests`` views' rules.  DuckDB applies the span-name filter (through
# the ``spans`` view) before the map lookups, so only these spans pay for them; the Parquet reader
# still decodes the map columns of every row, which is most of the scan's cost.  Spans without a
# session id are kept here and fall out where the windows are made (they join no window): a
# ``session_id IS NOT NULL`` here is pushed into the Parquet scan, where it reads the attribute map
# of every span, not only of these (its cost: docs/benchmarks.md, ``benchmarks/analysis``).  The breakdown
# reads these rows several times; as a MATERIALIZED CTE they come off Parquet once.  (Going
# through the per-kind views instead costs one Parquet scan each, and the ``requests`` /
# ``sessions`` views also compute columns the breakdown does not need: trace substrate, trace and
# request counts.)
SPAN_NAMES = (
    sc.SPAN_AGENT_SESSION,
    sc.SPAN_AGENT_TURN,
    sc.SPAN_AGENT_LLM_CALL,
    sc.SPAN_AGENT_TOOL_CALL,
    sc.SPAN_AGENT_APP_WORK,
    sc.SPAN_AGENT_USER_PAUSE,
    sc.SPAN_PROXY_REQUEST,
    sc.SPAN_KV_RETENTION,
)
AGENT_SPANS_SQL = f"""
SELECT name, session_id, turn, start_ns, end_ns,
       CASE name WHEN {_LLM} THEN {float_attr(sc.LLM_TTFT_MS)}
                 WHEN {_REQUEST} THEN {float_attr(sc.REQUEST_TTFT_MS)} END AS ttft_ms,
       CASE name WHEN {_RETENTION} THEN {int_attr(sc.KV_RETENTION_BYTES)} * ((end_ns - start_ns) / 1e9) END
           AS kv_byte_s
FROM spans
WHERE name IN ({literals(SPAN_NAMES)})
"""
BASE_CTE = f"base AS MATERIALIZED ({AGENT_SPANS_SQL})"

# Session and turn windows, turn counts, and which sessions have agent LLM calls, from one grouping
# by (session, turn).  Session windows and turn counts follow the ``sessions`` view's rules (agent
# session spans, else the proxy's requests; turns from agent turn spans, else distinct request
# turns; ``test_analysis_breakdown`` checks they agree with that view).  Turn windows: agent turn
# spans; sessions without any (agent not instrumented) use the span of the proxy's requests per
# (session, turn).  The proxy numbers requests, not agent turns, so the two are never mixed within
# a session.  ``sess`` has every session id seen (also those with turn spans only, which have
# turn windows but no session window).  Turn windows take the per-session flags from window
# functions over ``st`` rather than from a join with ``sess``, so ``st`` is read once and a filter
# on the session id is pushed down to ``base``.
WINDOWS_CTE = f"""
st AS (
    SELECT session_id, turn,
           min(start_ns) FILTER (WHERE name = {_SESSION}) AS sess_start,
           max(end_ns) FILTER (WHERE name = {_SESSION}) AS sess_end,
           min(start_ns) FILTER (WHERE name = {_TURN}) AS turn_start,
           max(end_ns) FILTER (WHERE name = {_TURN}) AS turn_end,
           min(start_ns) FILTER (WHERE name = {_REQUEST}) AS req_start,
           max(end_ns) FILTER (WHERE name = {_REQUEST}) AS req_end,
           count(*) FILTER (WHERE name = {_LLM}) AS llm_calls
    FROM base WHERE name IN ({_SESSION}, {_TURN}, {_LLM}, {_REQUEST})
    GROUP BY session_id, turn
),
sess AS (
    SELECT session_id,
           COALESCE(min(sess_start), min(req_start)) AS start_ns,
           COALESCE(max(sess_end), max(req_end)) AS end_ns,
           CASE WHEN count(turn_start) > 0 THEN count(turn) FILTER (WHERE turn_start IS NOT NULL)
                ELSE count(turn) FILTER (WHERE req_start IS NOT NULL) END AS turns,
           count(turn) FILTER (WHERE turn_start IS NOT NULL) > 0 AS agent_turns,
           sum(llm_calls) > 0 AS agent_calls
    FROM st GROUP BY session_id
),
session_windows AS (
    SELECT session_id, start_ns, end_ns, turns, agent_calls FROM sess
    WHERE start_ns IS NOT NULL AND session_id IS NOT NULL
),
st_flags AS (
    SELECT *, bool_or(turn IS NOT NULL AND turn_start IS NOT NULL) OVER by_session AS agent_turns,
           bool_or(llm_calls > 0) OVER by_session AS agent_calls
    FROM st WINDOW by_session AS (PARTITION BY session_id)
),
turn_windows AS (
    SELECT session_id, turn,
           CASE WHEN agent_turns THEN turn_start ELSE req_start END AS start_ns,
           CASE WHEN agent_turns THEN turn_end ELSE req_end END AS end_ns, agent_calls
    FROM st_flags
    WHERE turn IS NOT NULL AND session_id IS NOT NULL
      AND (CASE WHEN agent_turns THEN turn_start ELSE req_start END) IS NOT NULL
)"""

# The intervals the unions are taken over; ``turn`` may be NULL.  Each LLM call (or request) gives
# one CAT_INPUT row for the whole call (start → end: input processing, plus the generation it
# hides) and one CAT_GEN row from the first token (start + TTFT) to the end when it produced one;
# tools, app work and user pauses give one row each.  ``proxy`` marks the request spans' rows:
# they count only in sessions without agent ``llm_call`` spans (``agent_calls`` of the windows).
INTERVALS_CTE = f"""
split AS (
    SELECT session_id, turn, start_ns AS s, end_ns AS e, name = {_REQUEST} AS proxy,
           CASE WHEN ttft_ms IS NULL THEN end_ns
                ELSE least(end_ns, start_ns + CAST(round(ttft_ms * 1e6) AS BIGINT)) END AS ft
    FROM base WHERE name IN ({_LLM}, {_REQUEST})
),
intervals AS (
    SELECT session_id, turn, least(s, ft) AS s, e, {CAT_INPUT} AS cat, proxy FROM split
    UNION ALL
    SELECT session_id, turn, ft, e, {CAT_GEN}, proxy FROM split WHERE ft < e
    UNION ALL
    SELECT session_id, turn, start_ns, end_ns,
           CASE name WHEN {_TOOL} THEN {CAT_TOOL} WHEN {_APP} THEN {CAT_APP} ELSE {CAT_PAUSE} END, false
    FROM base WHERE name IN ({_TOOL}, {_APP}, {_PAUSE})
)"""

SESSION_WINDOWS_SQL = f"WITH {BASE_CTE}, {WINDOWS_CTE} SELECT session_id, start_ns, end_ns, turns FROM session_windows"
INTERVALS_SQL = (
    f"WITH {BASE_CTE}, {WINDOWS_CTE}, {INTERVALS_CTE} "
    "SELECT session_id, turn, s, e, cat FROM intervals i "
    "WHERE session_id IS NOT NULL AND (NOT proxy OR session_id IN (SELECT session_id FROM sess WHERE NOT agent_calls))"
)
TURN_WINDOWS_SQL = f"WITH {BASE_CTE}, {WINDOWS_CTE} SELECT session_id, turn, start_ns, end_ns FROM turn_windows"


def _sweep_sql(windows: str, keys: list[str], clipped: str, extra_cols: str, held: str) -> str:
    """The nested unions over ``clipped`` intervals (columns keys..., s, e, cat) inside ``windows``
    (keys..., ws, we, agent_calls); output one row per window with the four parts in ms.  Rows of
    each window in start order: ``m<c>`` is the largest end among the earlier rows counted in
    U(c), so ``e - max(s, m)`` (when positive) is what the row adds to U(c).  Ties in start order
    are harmless: the earlier of two tied rows is in the other's maximum."""
    k = ", ".join(keys)
    return f"""
WITH {BASE_CTE}, {WINDOWS_CTE}, {INTERVALS_CTE},
w AS ({windows}),
iv AS ({clipped}),
gen AS (
    SELECT {k}, s, e, max(e) OVER (PARTITION BY {k} ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS m4
    FROM iv WHERE cat = {CAT_GEN}
),
run AS (
    SELECT {k}, s, e, cat,
           max(CASE WHEN cat = {CAT_INPUT} THEN e END) OVER r AS m3,
           max(CASE WHEN cat >= {CAT_TOOL} THEN e END) OVER r AS m2,
           max(CASE WHEN cat >= {CAT_APP} THEN e END) OVER r AS m1,
           max(e) OVER r AS m0
    FROM iv WHERE cat < {CAT_GEN}
    WINDOW r AS (PARTITION BY {k} ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
),
u AS (
    SELECT {k},
           sum(CASE WHEN cat = {CAT_INPUT} THEN greatest(e - greatest(s, m3), 0) ELSE 0 END) AS u3,
           sum(CASE WHEN cat >= {CAT_TOOL} THEN greatest(e - greatest(s, m2), 0) ELSE 0 END) AS u2,
           sum(CASE WHEN cat >= {CAT_APP} THEN greatest(e - greatest(s, m1), 0) ELSE 0 END) AS u1,
           sum(greatest(e - greatest(s, m0), 0)) AS u0
    FROM run GROUP BY {k}
),
g AS (SELECT {k}, sum(greatest(e - greatest(s, m4), 0)) AS u4 FROM gen GROUP BY {k}),
h AS ({held})
SELECT {k},
       (win.we - win.ws) / 1e6 AS wall_ms,
       (coalesce(u.u3, 0) - coalesce(g.u4, 0)) / 1e6 AS input_processing_ms,
       coalesce(g.u4, 0) / 1e6 AS generation_ms,
       coalesce(u.u2 - u.u3, 0) / 1e6 AS tool_wait_ms,
       (win.we - win.ws - coalesce(u.u2, 0) - coalesce(u.u0 - u.u1, 0)) / 1e6 AS app_work_ms,
       coalesce(u.u0 - u.u1, 0) / 1e6 AS user_pause_ms,
       {extra_cols},
       (win.we - win.ws - coalesce(u.u0, 0)) / 1e6 AS unattributed_ms,
       win.ws AS start_ns, win.we AS end_ns,
       coalesce(h.byte_s, 0) / {GIB} AS kv_gib_s
FROM w AS win LEFT JOIN u USING ({k}) LEFT JOIN g USING ({k}) LEFT JOIN h USING ({k})
"""


# an interval clipped to the window it joined, kept if anything is left and it counts there
_CLIP = "greatest(i.s, w.ws) AS s, least(i.e, w.we) AS e, i.cat"
_KEEP = "least(i.e, w.we) > greatest(i.s, w.ws) AND (NOT i.proxy OR NOT w.agent_calls)"

SESSION_BREAKDOWN_SQL = _sweep_sql(
    windows="SELECT session_id, start_ns AS ws, end_ns AS we, turns, agent_calls FROM session_windows "
    "WHERE end_ns >= start_ns",
    keys=["session_id"],
    clipped=f"SELECT w.session_id, {_CLIP} FROM intervals i JOIN w ON i.session_id = w.session_id WHERE {_KEEP}",
    extra_cols="win.turns",
    held=f"SELECT session_id, sum(kv_byte_s) AS byte_s FROM base WHERE name = {_RETENTION} GROUP BY session_id",
)

# Intervals join their turn by the turn attribute; intervals without one join every turn window
# of their session they overlap: each window is listed twice, under its turn (``jt``) and under
# NULL, and the join matches ``turn IS NOT DISTINCT FROM jt`` (one hash join, one read of the
# intervals, so a session filter still reaches them).
TURN_BREAKDOWN_SQL = _sweep_sql(
    windows="SELECT session_id, turn, start_ns AS ws, end_ns AS we, agent_calls FROM turn_windows "
    "WHERE end_ns >= start_ns",
    keys=["session_id", "turn"],
    clipped=f"SELECT w.session_id, w.turn, {_CLIP} "
    "FROM intervals i JOIN (SELECT *, turn AS jt FROM w UNION ALL SELECT *, NULL AS jt FROM w) w "
    f"ON i.session_id = w.session_id AND i.turn IS NOT DISTINCT FROM w.jt WHERE {_KEEP}",
    extra_cols="1::BIGINT AS turns",
    held=f"SELECT win.session_id, win.turn, sum(b.kv_byte_s) AS byte_s FROM w AS win JOIN base b "
    f"ON b.session_id = win.session_id WHERE b.name = {_RETENTION} AND b.start_ns BETWEEN win.ws AND win.we "
    "GROUP BY win.session_id, win.turn",
)
