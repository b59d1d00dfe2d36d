"""Where an agent's time goes: the ``session_breakdown`` and ``turn_breakdown`` views.

:func:`install_views` adds them (and their helper views) to a store connection made by
:func:`kvtrace.store.views.connect`; the dashboard, the report and ``kvtrace demo`` read them.

Every session's wall time (from the ``sessions`` view, which spans all of the session's traces)
is split into four parts that sum to it exactly (in ns; ±1 ms after rounding to ms):

- **input processing**: request start → first token (queueing, prefill on P, KV transfers);
- **generation**: first token → last token;
- **tool waits**: ``tool_call`` spans;
- **app work**: ``app_work`` spans plus the session's unattributed time (``unattributed_ms``,
  an extra column, is that second part on its own).

LLM intervals come from the agent's ``llm_call`` spans (start → start + TTFT → end).  A session
without any ``llm_call`` span (an agent that is not instrumented) uses the proxy's request spans
instead (start → first-token event → end).  A call that never produced a token counts as input
processing throughout.

Overlaps are resolved by an interval union and a fixed precedence, so parallel LLM calls,
parallel tools and calls made while a tool runs are never double-counted: every instant of the
wall time belongs to exactly one part, the highest of **generation > input processing > tool
wait > app work** active at that instant (tokens streaming in are what the user waits for most
directly; a tool running while the model is busy is hidden behind it).  Intervals are clipped to
the session's (or turn's) window.

The SQL is a sweep over boundary points (DuckDB window functions): every interval contributes a
+1 and a -1 event for its category, running sums over the events in time order give the active
count of each category between consecutive instants, and each elementary segment is attributed
to the highest active category.  Cost: one Parquet scan and one sort of the agent spans.
"""

from __future__ import annotations

from kvtrace import semconv as sc

# category codes, higher wins
CAT_APP, CAT_TOOL, CAT_INPUT, CAT_GEN = 1, 2, 3, 4
PRECEDENCE = ("generation", "input_processing", "tool_wait", "app_work")

# One scan of the store feeds the sweep: the agent and proxy spans it needs, with TTFT by the
# ``llm_calls`` / ``requests`` views' rules.  The breakdown reads these rows many times (windows,
# intervals, turn counts); as a MATERIALIZED CTE they come off Parquet once.  (Going through the
# per-kind views instead costs one Parquet scan each, and the ``requests`` / ``sessions`` views
# also compute columns the sweep does not need: trace substrate, trace and request counts.)
_TTFT = "COALESCE(SpanAttributesFloat['{k}'], CAST(SpanAttributesInt['{k}'] AS DOUBLE))"
AGENT_SPANS_SQL = f"""
CREATE OR REPLACE VIEW kvtrace_agent_spans AS
SELECT name, session_id, turn, start_ns, end_ns,
       CASE name WHEN '{sc.SPAN_AGENT_LLM_CALL}' THEN {_TTFT.format(k=sc.LLM_TTFT_MS)}
                 WHEN '{sc.SPAN_PROXY_REQUEST}' THEN {_TTFT.format(k=sc.REQUEST_TTFT_MS)} END AS ttft_ms
FROM spans
WHERE name IN ('{sc.SPAN_AGENT_SESSION}', '{sc.SPAN_AGENT_TURN}', '{sc.SPAN_AGENT_LLM_CALL}',
               '{sc.SPAN_AGENT_TOOL_CALL}', '{sc.SPAN_AGENT_APP_WORK}', '{sc.SPAN_PROXY_REQUEST}')
  AND session_id IS NOT NULL
"""
BASE_CTE = "base AS MATERIALIZED (SELECT * FROM kvtrace_agent_spans)"

# Session windows and turn counts by the ``sessions`` view's rules (agent session spans, else the
# proxy's requests; turns from agent turn spans, else distinct request turns).
# ``test_analysis_breakdown`` checks they agree with that view.
SESSION_WINDOWS_CTE = f"""
sw_sess AS (
    SELECT session_id, min(start_ns) AS start_ns, max(end_ns) AS end_ns FROM base
    WHERE name = '{sc.SPAN_AGENT_SESSION}' GROUP BY session_id
),
sw_req AS (
    SELECT session_id, min(start_ns) AS start_ns, max(end_ns) AS end_ns, count(DISTINCT turn) AS turns
    FROM base WHERE name = '{sc.SPAN_PROXY_REQUEST}' GROUP BY session_id
),
sw_trn AS (
    SELECT session_id, count(DISTINCT turn) AS turns FROM base
    WHERE name = '{sc.SPAN_AGENT_TURN}' GROUP BY session_id
),
session_windows AS (
    SELECT session_id, COALESCE(sw_sess.start_ns, sw_req.start_ns) AS start_ns,
           COALESCE(sw_sess.end_ns, sw_req.end_ns) AS end_ns, COALESCE(sw_trn.turns, sw_req.turns, 0) AS turns
    FROM sw_sess FULL OUTER JOIN sw_req USING (session_id) LEFT JOIN sw_trn USING (session_id)
)"""

# Intervals of every session, one row per (interval, category); ``turn`` may be NULL.
INTERVALS_CTE = f"""
llm_sessions AS (SELECT DISTINCT session_id FROM base WHERE name = '{sc.SPAN_AGENT_LLM_CALL}'),
calls AS (
    SELECT session_id, turn, start_ns AS s, end_ns AS e, ttft_ms FROM base
    WHERE name = '{sc.SPAN_AGENT_LLM_CALL}'
    UNION ALL
    SELECT session_id, turn, start_ns, end_ns, ttft_ms FROM base
    WHERE name = '{sc.SPAN_PROXY_REQUEST}' AND session_id NOT IN (SELECT session_id FROM llm_sessions)
),
split AS (
    SELECT session_id, turn, s, e,
           CASE WHEN ttft_ms IS NULL THEN e
                ELSE least(e, s + CAST(round(ttft_ms * 1e6) AS BIGINT)) END AS ft
    FROM calls
),
intervals AS (
    SELECT session_id, turn, s, ft AS e, {CAT_INPUT} AS cat FROM split
    UNION ALL
    SELECT session_id, turn, ft, e, {CAT_GEN} FROM split WHERE ft < e
    UNION ALL
    SELECT session_id, turn, start_ns, end_ns, {CAT_TOOL} FROM base WHERE name = '{sc.SPAN_AGENT_TOOL_CALL}'
    UNION ALL
    SELECT session_id, turn, start_ns, end_ns, {CAT_APP} FROM base WHERE name = '{sc.SPAN_AGENT_APP_WORK}'
)"""

# Turn windows: agent turn spans; sessions without any (agent not instrumented) use the span of
# the proxy's requests per (session, turn).  The proxy numbers requests, not agent turns, so the
# two are never mixed within a session.
TURN_WINDOWS_CTE = f"""
tw_agent AS (
    SELECT session_id, turn, min(start_ns) AS start_ns, max(end_ns) AS end_ns
    FROM base WHERE name = '{sc.SPAN_AGENT_TURN}' AND turn IS NOT NULL
    GROUP BY session_id, turn
),
tw_proxy AS (
    SELECT session_id, turn, min(start_ns) AS start_ns, max(end_ns) AS end_ns
    FROM base WHERE name = '{sc.SPAN_PROXY_REQUEST}' AND turn IS NOT NULL
    GROUP BY session_id, turn
),
turn_windows AS (
    SELECT * FROM tw_agent
    UNION ALL
    SELECT p.* FROM tw_proxy p ANTI JOIN (SELECT DISTINCT session_id FROM tw_agent) a ON a.session_id = p.session_id
)"""

SESSION_WINDOWS_SQL = f"CREATE OR REPLACE VIEW kvtrace_session_windows AS WITH {BASE_CTE}, {SESSION_WINDOWS_CTE} " \
                      "SELECT * FROM session_windows"
INTERVALS_SQL = f"CREATE OR REPLACE VIEW kvtrace_intervals AS WITH {BASE_CTE}, {INTERVALS_CTE} SELECT * FROM intervals"
TURN_WINDOWS_SQL = f"CREATE OR REPLACE VIEW kvtrace_turn_windows AS WITH {BASE_CTE}, {TURN_WINDOWS_CTE} " \
                   "SELECT * FROM turn_windows"


def _sweep_sql(view: str, ctes: str, windows: str, keys: list[str], clipped: str, extra_cols: str) -> str:
    """The sweep over ``clipped`` intervals (columns keys..., s, e, cat) inside ``windows``
    (keys..., ws, we); output one row per window with the four parts in ms.  Rows at the same
    instant need no grouping: between them the segment length is 0, and the last of them carries
    the running counts after all of that instant's events.  Partitions are keyed by the hash of
    the session id first (an integer sort), then the id itself (exact)."""
    k = ", ".join(keys)
    part = ", ".join(["hash(session_id)", *keys])
    on = " AND ".join(f"w.{c} = a.{c}" for c in keys)
    return f"""
CREATE OR REPLACE VIEW {view} AS
WITH {BASE_CTE}, {ctes},
w AS ({windows}),
iv AS ({clipped}),
ev AS (
    SELECT {k}, s AS t, cat, 1 AS d FROM iv
    UNION ALL
    SELECT {k}, e, cat, -1 FROM iv
    UNION ALL SELECT {k}, ws, 0, 0 FROM w
    UNION ALL SELECT {k}, we, 0, 0 FROM w
),
sweep AS (
    SELECT {k}, t,
           lead(t) OVER run AS nt,
           sum(CASE WHEN cat = {CAT_GEN} THEN d ELSE 0 END) OVER run AS a4,
           sum(CASE WHEN cat = {CAT_INPUT} THEN d ELSE 0 END) OVER run AS a3,
           sum(CASE WHEN cat = {CAT_TOOL} THEN d ELSE 0 END) OVER run AS a2,
           sum(CASE WHEN cat = {CAT_APP} THEN d ELSE 0 END) OVER run AS a1
    FROM ev
    WINDOW run AS (PARTITION BY {part} ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
),
a AS (
    SELECT {k},
           sum(CASE WHEN a4 > 0 THEN nt - t ELSE 0 END) AS gen_ns,
           sum(CASE WHEN a4 <= 0 AND a3 > 0 THEN nt - t ELSE 0 END) AS input_ns,
           sum(CASE WHEN a4 <= 0 AND a3 <= 0 AND a2 > 0 THEN nt - t ELSE 0 END) AS tool_ns,
           sum(CASE WHEN a4 <= 0 AND a3 <= 0 AND a2 <= 0 AND a1 > 0 THEN nt - t ELSE 0 END) AS app_ns,
           sum(CASE WHEN a4 <= 0 AND a3 <= 0 AND a2 <= 0 AND a1 <= 0 THEN nt - t ELSE 0 END) AS idle_ns
    FROM sweep WHERE nt IS NOT NULL
    GROUP BY {k}
)
SELECT {", ".join(f"w.{c}" for c in keys)},
       (w.we - w.ws) / 1e6 AS wall_ms,
       coalesce(a.input_ns, 0) / 1e6 AS input_processing_ms,
       coalesce(a.gen_ns, 0) / 1e6 AS generation_ms,
       coalesce(a.tool_ns, 0) / 1e6 AS tool_wait_ms,
       (coalesce(a.app_ns, 0) + coalesce(a.idle_ns, w.we - w.ws)) / 1e6 AS app_work_ms,
       {extra_cols},
       coalesce(a.idle_ns, w.we - w.ws) / 1e6 AS unattributed_ms,
       w.ws AS start_ns, w.we AS end_ns
FROM w LEFT JOIN a ON {on}
"""


SESSION_BREAKDOWN_SQL = _sweep_sql(
    "session_breakdown",
    ctes=f"{SESSION_WINDOWS_CTE}, {INTERVALS_CTE}",
    windows="SELECT session_id, start_ns AS ws, end_ns AS we, turns FROM session_windows "
    "WHERE end_ns >= start_ns",
    keys=["session_id"],
    clipped="SELECT i.session_id, greatest(i.s, w.ws) AS s, least(i.e, w.we) AS e, i.cat "
    "FROM intervals i JOIN w ON i.session_id = w.session_id "
    "WHERE least(i.e, w.we) > greatest(i.s, w.ws)",
    extra_cols="w.turns",
)

# Intervals join their turn by the turn attribute; intervals without one join every turn window
# of their session they overlap.
TURN_BREAKDOWN_SQL = _sweep_sql(
    "turn_breakdown",
    ctes=f"{TURN_WINDOWS_CTE}, {INTERVALS_CTE}",
    windows="SELECT session_id, turn, start_ns AS ws, end_ns AS we FROM turn_windows WHERE end_ns >= start_ns",
    keys=["session_id", "turn"],
    clipped="SELECT w.session_id, w.turn, greatest(i.s, w.ws) AS s, least(i.e, w.we) AS e, i.cat "
    "FROM intervals i JOIN w ON i.session_id = w.session_id AND i.turn = w.turn "
    "WHERE least(i.e, w.we) > greatest(i.s, w.ws) "
    "UNION ALL "
    "SELECT w.session_id, w.turn, greatest(i.s, w.ws), least(i.e, w.we), i.cat "
    "FROM intervals i JOIN w ON i.session_id = w.session_id "
    "WHERE i.turn IS NULL AND least(i.e, w.we) > greatest(i.s, w.ws)",
    extra_cols="1 AS turns",
)

VIEWS_SQL = (AGENT_SPANS_SQL, SESSION_WINDOWS_SQL, INTERVALS_SQL, TURN_WINDOWS_SQL, SESSION_BREAKDOWN_SQL,
             TURN_BREAKDOWN_SQL)

BREAKDOWN_COLUMNS = (
    "session_id", "wall_ms", "input_processing_ms", "generation_ms", "tool_wait_ms", "app_work_ms", "turns",
)
PART_COLUMNS = ("input_processing_ms", "generation_ms", "tool_wait_ms", "app_work_ms")
SPAN_NAMES = (sc.SPAN_AGENT_LLM_CALL, sc.SPAN_AGENT_TOOL_CALL, sc.SPAN_AGENT_APP_WORK, sc.SPAN_PROXY_REQUEST)


def install_views(con) -> None:
    """Create the breakdown views (idempotent) on a connection that has the store's views."""
    for sql in VIEWS_SQL:
        con.execute(sql)
