"""Where an agent's time goes: the ``session_breakdown`` and ``turn_breakdown`` views.

Registered in :mod:`kvtrace.store.views` with their helper views (``kvtrace_agent_spans``,
``kvtrace_session_windows``, ``kvtrace_intervals``, ``kvtrace_turn_windows``), so every
connection has them; :mod:`kvtrace.analysis.sessions` reads them for the dashboard, the report
and ``kvtrace demo``.

Every session's wall time (from the ``sessions`` view, which spans all of the session's traces)
is split into five parts that sum to it exactly (in ns; ±1 ms after rounding to ms):

- **input processing**: request start → first token (queueing, prefill on P, KV transfers);
- **generation**: first token → last token;
- **tool waits**: ``tool_call`` spans;
- **app work**: ``app_work`` spans plus the session's unattributed time (``unattributed_ms``,
  an extra column, is that second part on its own);
- **user pauses**: ``user_pause`` spans (``Agent.user_pause()``: the agent waits for its user:
  think time, an approval, a pause-resume gap), time nobody but the user is responsible for.

Memory: ``kv_gib_s`` is the KV D held for the window's next turns (``kv.retention`` spans, bytes ×
held seconds, wall clock / 2^30): a session's are all of its retentions; a turn's those that started
in its window (the turn whose answer D kept).

LLM intervals come from the agent's ``llm_call`` spans (start → start + TTFT → end).  A session
without any ``llm_call`` span (an agent that is not instrumented) uses the proxy's request spans
instead (start → first-token event → end).  A call that never produced a token counts as input
processing throughout.

Overlaps are resolved by an interval union and a fixed precedence, so parallel LLM calls,
parallel tools and calls made while a tool runs are never double-counted: every instant of the
wall time belongs to exactly one part, the highest of **generation > input processing > tool
wait > app work > user pause** active at that instant (tokens streaming in are what the user
waits for most directly; a tool running while the model is busy is hidden behind it; anything
the agent does while its user thinks is the agent's, not the pause's).  Intervals are clipped to
the session's (or turn's) window.

The SQL gets the precedence from nested unions instead of a sweep over every boundary point:
with U(c) the union of the (clipped) intervals of category >= c, generation = |U(gen)|, input
processing = |U(input)| - |U(gen)|, tool wait = |U(tool)| - |U(input)|, user pause =
|U(pause)| - |U(app)|, app work = wall - |U(tool)| - user pause and unattributed = wall -
|U(pause)|, all in integer ns.  A union's length is one pass
over its intervals in start order (a DuckDB window function): each interval adds the part of it
that ends after the largest end before it.  U(input) is the union of whole LLM calls (input
processing up to the first token, generation after it), so one sort with two partitions per window
suffices: the generation intervals, and the calls, tools, app work and pauses together (four running
maxima; the generation partition needs one of them).  Cost: one Parquet scan, one grouping of the
session, turn, call and request spans by (session, turn), one sort of the intervals.  The scan (``b0``)
and the clipped intervals (``iv``: the sort is cheaper over a materialised input than fed by the join
that clips them; docs/benchmarks.md) are MATERIALIZED; the rest stays inlinable so that a filter on
``session_id`` (the dashboard's drill-down) reaches the grouping and the sorts.
"""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.store.units import GIB
from kvtrace.store.views.agents import (
    AGENT_SPANS_SQL,
    JOINS_CTE,
    K_REQUEST,
    K_RETENTION,
    KIND_REQUEST,
    LLM,
    PAUSE,
    SESSION,
    TOOL,
    TURN,
    role_in,
)
from kvtrace.store.views.agents import BASE_CTE as AGENTS_BASE_CTE
from kvtrace.store.views.registry import BIGINT, DOUBLE, INTEGER, VARCHAR, View, col, common

# category codes, higher wins
CAT_PAUSE, CAT_APP, CAT_TOOL, CAT_INPUT, CAT_GEN = 1, 2, 3, 4, 5
PRECEDENCE = ("generation", "input_processing", "tool_wait", "app_work", "user_pause")


# One scan of the store feeds everything: kvtrace's agent, request and retention spans and every
# agent-side span of another convention, with their role and TTFT (:mod:`.agents`, which also
# says what the classification costs).  The ``spans`` view applies the name filter before the map
# lookups, so only these spans pay for them; the Parquet reader still decodes the map columns of
# every row, which is most of the scan's cost.  Spans without a session id are kept here and fall
# out where the windows are made (they join no window): a ``session_id IS NOT NULL`` here is
# pushed into the Parquet scan, where it reads the attribute map of every span, not only of these
# (its cost: docs/benchmarks.md, ``benchmarks/analysis``).  The breakdown reads these rows several times; as a
# MATERIALIZED CTE they come off Parquet once.  ``base`` (:data:`.agents.BASE_CTE`) puts every
# row into the session of its trace.
BASE_CTE = f"{JOINS_CTE}, {AGENTS_BASE_CTE}"

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
_WINDOW_ROLES = role_in(sc.ROLE_SESSION, sc.ROLE_TURN, sc.ROLE_LLM_CALL, sc.ROLE_AGENT, KIND_REQUEST)
WINDOWS_CTE = f"""
st AS (
    SELECT session_id, turn,
           min(start_ns) FILTER (WHERE role = {SESSION}) AS sess_start,
           max(end_ns) FILTER (WHERE role = {SESSION}) AS sess_end,
           min(start_ns) FILTER (WHERE role = {TURN}) AS turn_start,
           max(end_ns) FILTER (WHERE role = {TURN}) AS turn_end,
           min(start_ns) FILTER (WHERE role = {K_REQUEST}) AS req_start,
           max(end_ns) FILTER (WHERE role = {K_REQUEST}) AS req_end,
           count(*) FILTER (WHERE role = {LLM}) AS llm_calls
    FROM base WHERE {_WINDOW_ROLES}
    GROUP BY session_id, turn
),
fsess AS (SELECT session_id, min(s) AS s, max(e) AS e, count(*) AS turns FROM ftn GROUP BY session_id),
sess0 AS (
    SELECT session_id, min(sess_start) AS sess_start, max(sess_end) AS sess_end, min(req_start) AS req_start,
           max(req_end) AS req_end,
           CASE WHEN count(turn_start) > 0 THEN count(turn) FILTER (WHERE turn_start IS NOT NULL) END AS kturns,
           count(turn) FILTER (WHERE req_start IS NOT NULL) AS rturns, sum(llm_calls) > 0 AS agent_calls
    FROM st GROUP BY session_id
),
sess AS (
    SELECT s.session_id, COALESCE(s.sess_start, f.s, s.req_start) AS start_ns,
           COALESCE(s.sess_end, f.e, s.req_end) AS end_ns, COALESCE(s.kturns, f.turns, s.rturns) AS turns,
           s.agent_calls, COALESCE(u.unplaced, 0) AS unplaced
    FROM sess0 s LEFT JOIN fsess f ON f.session_id = s.session_id LEFT JOIN unp u ON u.session_id = s.session_id
),
session_windows AS (
    SELECT session_id, start_ns, end_ns, turns, agent_calls, unplaced FROM sess
    WHERE start_ns IS NOT NULL AND session_id IS NOT NULL
),
tw AS (
    SELECT session_id, turn, turn_start, turn_end, req_start, req_end, CAST(NULL AS BIGINT) AS fs,
           CAST(NULL AS BIGINT) AS fe, llm_calls FROM st
    UNION ALL
    SELECT session_id, n, NULL, NULL, NULL, NULL, s, e, 0 FROM ftn
),
tw_best AS (
    SELECT *, CASE WHEN turn_start IS NOT NULL THEN 3 WHEN fs IS NOT NULL THEN 2 WHEN req_start IS NOT NULL THEN 1
                   ELSE 0 END AS pri FROM tw
),
tw_flags AS (
    SELECT *, max(CASE WHEN turn IS NOT NULL THEN pri END) OVER by_session AS best,
           bool_or(llm_calls > 0) OVER by_session AS agent_calls
    FROM tw_best WINDOW by_session AS (PARTITION BY session_id)
),
turn_windows AS (
    SELECT session_id, turn, CASE best WHEN 3 THEN turn_start WHEN 2 THEN fs WHEN 1 THEN req_start END AS start_ns,
           CASE best WHEN 3 THEN turn_end WHEN 2 THEN fe WHEN 1 THEN req_end END AS end_ns, agent_calls
    FROM tw_flags
    WHERE turn IS NOT NULL AND session_id IS NOT NULL
      AND (pri = best OR (best = 1 AND req_start IS NOT NULL) OR (best = 2 AND fs IS NOT NULL))
)"""

# The intervals the unions are taken over; ``turn`` may be NULL.  Each LLM call (or request) gives
# one CAT_INPUT row for the whole call (start → end: input processing, plus the generation it
# hides) and one CAT_GEN row from the first token (start + TTFT) to the end when it produced one;
# tools, app work and user pauses give one row each.  ``proxy`` marks the request spans' rows:
# they count only in sessions without agent ``llm_call`` spans (``agent_calls`` of the windows).  The rows
# come from one read of ``base`` (``c0`` the first category of a span, an unnest of one or two categories),
# so on ClickHouse the breakdown's query tree holds the scan once here, not once per kind of row.
_INTERVAL_ROLES = role_in(
    sc.ROLE_LLM_CALL, sc.ROLE_TOOL_WAIT, sc.ROLE_APP_WORK, sc.ROLE_USER_PAUSE, sc.ROLE_AGENT, KIND_REQUEST
)
INTERVALS_CTE = f"""
split AS (
    SELECT session_id, turn, start_ns AS s, end_ns AS e, role = {K_REQUEST} AS proxy,
           CASE WHEN ttft_ms IS NULL THEN end_ns
                ELSE least(end_ns, start_ns + CAST(round(ttft_ms * 1e6) AS BIGINT)) END AS ft,
           CASE WHEN role IN ({LLM}, {K_REQUEST}) THEN {CAT_INPUT} WHEN role = {TOOL} THEN {CAT_TOOL}
                WHEN role = {PAUSE} THEN {CAT_PAUSE} ELSE {CAT_APP} END AS c0
    FROM base WHERE {_INTERVAL_ROLES}
),
intervals AS (
    SELECT session_id, turn, CASE WHEN cat = {CAT_GEN} THEN ft WHEN c0 = {CAT_INPUT} THEN least(s, ft) ELSE s END AS s,
           e, cat, proxy
    FROM (
        SELECT *, CAST(unnest(range(c0, CASE WHEN c0 = {CAT_INPUT} AND ft < e THEN c0 + 2 ELSE c0 + 1 END)) AS INTEGER)
                  AS cat
        FROM split
    ) AS x
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
    are harmless: the earlier of two tied rows is in the other's maximum.  The generation rows are a
    partition of their own (``cat = CAT_GEN`` in the window's key), where ``m0`` is U(gen)'s maximum:
    one sort, four maxima, none computed over rows it cannot count."""
    k = ", ".join(keys)
    return f"""
WITH {BASE_CTE}, {WINDOWS_CTE}, {INTERVALS_CTE},
w AS ({windows}),
iv AS MATERIALIZED ({clipped}),
run AS (
    SELECT {k}, s, e, cat,
           max(CASE WHEN cat = {CAT_INPUT} THEN e END) OVER r AS m3,
           max(CASE WHEN cat >= {CAT_TOOL} THEN e END) OVER r AS m2,
           max(CASE WHEN cat >= {CAT_APP} THEN e END) OVER r AS m1,
           max(e) OVER r AS m0
    FROM iv
    WINDOW r AS (PARTITION BY {k}, cat = {CAT_GEN} ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
),
u AS (
    SELECT {k},
           sum(CASE WHEN cat = {CAT_GEN} THEN greatest(e - greatest(s, m0), 0) ELSE 0 END) AS u4,
           sum(CASE WHEN cat = {CAT_INPUT} THEN greatest(e - greatest(s, m3), 0) ELSE 0 END) AS u3,
           sum(CASE WHEN cat >= {CAT_TOOL} AND cat < {CAT_GEN} THEN greatest(e - greatest(s, m2), 0) ELSE 0 END) AS u2,
           sum(CASE WHEN cat >= {CAT_APP} AND cat < {CAT_GEN} THEN greatest(e - greatest(s, m1), 0) ELSE 0 END) AS u1,
           sum(CASE WHEN cat < {CAT_GEN} THEN greatest(e - greatest(s, m0), 0) ELSE 0 END) AS u0
    FROM run GROUP BY {k}
),
h AS ({held})
SELECT {k},
       (win.we - win.ws) / 1e6 AS wall_ms,
       (coalesce(u.u3, 0) - coalesce(u.u4, 0)) / 1e6 AS input_processing_ms,
       coalesce(u.u4, 0) / 1e6 AS generation_ms,
       coalesce(u.u2 - u.u3, 0) / 1e6 AS tool_wait_ms,
       (win.we - win.ws - coalesce(u.u2, 0) - coalesce(u.u0 - u.u1, 0)) / 1e6 AS app_work_ms,
       coalesce(u.u0 - u.u1, 0) / 1e6 AS user_pause_ms,
       {extra_cols},
       (win.we - win.ws - coalesce(u.u0, 0)) / 1e6 AS unattributed_ms,
       win.ws AS start_ns, win.we AS end_ns,
       coalesce(h.byte_s, 0) / {GIB} AS kv_gib_s
FROM w AS win LEFT JOIN u USING ({k}) LEFT JOIN h USING ({k})
"""


# an interval clipped to the window it joined, kept if anything is left and it counts there
_CLIP = "greatest(i.s, w.ws) AS s, least(i.e, w.we) AS e, i.cat"
_KEEP = "least(i.e, w.we) > greatest(i.s, w.ws) AND (NOT i.proxy OR NOT w.agent_calls)"

SESSION_BREAKDOWN_SQL = _sweep_sql(
    windows="SELECT session_id, start_ns AS ws, end_ns AS we, turns, agent_calls, unplaced FROM session_windows "
    "WHERE end_ns >= start_ns",
    keys=["session_id"],
    clipped=f"SELECT w.session_id, {_CLIP} FROM intervals i JOIN w ON i.session_id = w.session_id WHERE {_KEEP}",
    extra_cols="win.turns, win.unplaced AS unplaced_spans",
    held=f"SELECT session_id, sum(kv_byte_s) AS byte_s FROM base WHERE role = {K_RETENTION} GROUP BY session_id",
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
    extra_cols="1::BIGINT AS turns, NULL::BIGINT AS unplaced_spans",
    held=f"SELECT win.session_id, win.turn, sum(b.kv_byte_s) AS byte_s FROM w AS win JOIN base b "
    f"ON b.session_id = win.session_id WHERE b.role = {K_RETENTION} AND b.start_ns BETWEEN win.ws AND win.we "
    "GROUP BY win.session_id, win.turn",
)

PRECEDENCE_NOTE = " > ".join(PRECEDENCE)
BREAKDOWN_COLUMNS = (
    "session_id",
    "wall_ms",
    "input_processing_ms",
    "generation_ms",
    "tool_wait_ms",
    "app_work_ms",
    "user_pause_ms",
    "turns",
)
PART_COLUMNS = ("input_processing_ms", "generation_ms", "tool_wait_ms", "app_work_ms", "user_pause_ms")


def _parts(window: str) -> tuple:
    return (
        col("wall_ms", DOUBLE, f"the {window}'s wall time, ms"),
        col("input_processing_ms", DOUBLE, "request start → first token (queueing, prefill, KV transfers), ms"),
        col("generation_ms", DOUBLE, "first token → last token, ms"),
        col("tool_wait_ms", DOUBLE, "tool calls, ms"),
        col("app_work_ms", DOUBLE, "app-work spans plus unattributed time, ms"),
        col("user_pause_ms", DOUBLE, "user-pause spans (the agent waits for its user: think time, approvals), ms"),
    )


_TAIL = (
    col(
        "unattributed_ms",
        DOUBLE,
        "the part of `app_work_ms` no span covers (untraced work, pauses the agent did not mark as user pauses), ms",
    ),
    col("start_ns", BIGINT, "window start, epoch ns"),
    col("end_ns", BIGINT, "window end, epoch ns"),
)
_KV_HELD = col(
    "kv_gib_s",
    DOUBLE,
    "KV D held for the next turns, GiB·s (retention spans: the session's all; a "
    "turn's those that started in its window; wall-clock s)",
)
_HELPER = "Helper view of `session_breakdown` / `turn_breakdown` (internal; may change)."

VIEWS: tuple[View, ...] = (
    View(
        "kvtrace_agent_spans",
        _HELPER + " kvtrace's agent and proxy spans, with their role and TTFT (`session_id` may be NULL: such spans "
        "join no window); the breakdown reads them and other conventions' spans in one scan of its own.",
        (
            col("name", VARCHAR, "span name"),
            col("role", VARCHAR, "the span's role (NULL: requests and retention)", sc.AGENT_ROLES),
            col("convention", VARCHAR, f"`{sc.CONV_KVTRACE}`", (sc.CONV_KVTRACE,)),
            *common("session_id", "turn", "start_ns", "end_ns"),
            col("ttft_ms", DOUBLE, "TTFT of LLM calls and proxy requests, ms"),
            col("kv_byte_s", DOUBLE, "retention spans: bytes x held seconds"),
        ),
        AGENT_SPANS_SQL,
        helper=True,
    ),
    View(
        "kvtrace_session_windows",
        _HELPER + " Each session's window and turn count.",
        (
            *common("session_id"),
            col("start_ns", BIGINT, "window start, epoch ns"),
            col("end_ns", BIGINT, "window end, epoch ns"),
            col("turns", BIGINT, "turns"),
        ),
        SESSION_WINDOWS_SQL,
        helper=True,
    ),
    View(
        "kvtrace_intervals",
        _HELPER + " The intervals the parts are unions of.",
        (
            *common("session_id", "turn"),
            col("s", BIGINT, "interval start, epoch ns"),
            col("e", BIGINT, "interval end, epoch ns"),
            col(
                "cat",
                INTEGER,
                f"category: {CAT_GEN} generation, {CAT_INPUT} input processing, {CAT_TOOL} tool, "
                f"{CAT_APP} app work, {CAT_PAUSE} user pause",
            ),
        ),
        INTERVALS_SQL,
        helper=True,
    ),
    View(
        "kvtrace_turn_windows",
        _HELPER + " Each turn's window (agent turn span, else the turn's requests).",
        (
            *common("session_id", "turn"),
            col("start_ns", BIGINT, "window start, epoch ns"),
            col("end_ns", BIGINT, "window end, epoch ns"),
        ),
        TURN_WINDOWS_SQL,
        helper=True,
    ),
    View(
        "session_breakdown",
        "Where each session's wall time goes: five parts that sum to it, each instant counted once, by "
        f"precedence {PRECEDENCE_NOTE}.",
        (
            *common("session_id"),
            *_parts("session"),
            col("turns", BIGINT, "turns of the session"),
            col(
                "unplaced_spans",
                BIGINT,
                "agent-side spans of the session's traces the breakdown could not place (a convention's attribute "
                "with a value it does not map); `kvtrace doctor --traces DIR` lists them",
            ),
            *_TAIL,
            _KV_HELD,
        ),
        SESSION_BREAKDOWN_SQL,
    ),
    View(
        "turn_breakdown",
        "The same split per turn (window: the agent turn span, else the turn's requests).",
        (
            *common("session_id", "turn"),
            *_parts("turn"),
            col("turns", BIGINT, "1"),
            col("unplaced_spans", BIGINT, "NULL (a session's count is in `session_breakdown`)"),
            *_TAIL,
            _KV_HELD,
        ),
        TURN_BREAKDOWN_SQL,
    ),
)
