"""Reading the breakdown views: sorted/limited session tables, totals, turns, and one session's
spans for the drill-down waterfall.

Aggregate first: :func:`totals` and :func:`breakdown` (``ORDER BY`` a whitelisted column,
``LIMIT``) keep the dashboard usable at 100k sessions; :func:`spans_of_session` reads one
session's traces only, capped at ``limit`` spans.
"""

from __future__ import annotations

import pyarrow as pa

from kvtrace import semconv as sc
from kvtrace.analysis.common import one, rows, table
from kvtrace.analysis.filters import SESSION_SCOPE, Filters, where
from kvtrace.analysis.pushdown import narrowed
from kvtrace.store import lookup
from kvtrace.store.sql import literal
from kvtrace.store.views.breakdown import BREAKDOWN_COLUMNS

SORTABLE = BREAKDOWN_COLUMNS + ("unattributed_ms", "start_ns", "kv_gib_s", "unplaced_spans")

BREAKDOWN_SQL = """
SELECT session_id, wall_ms, input_processing_ms, generation_ms, tool_wait_ms, app_work_ms, user_pause_ms, turns,
       unattributed_ms, start_ns, end_ns, kv_gib_s, unplaced_spans
FROM session_breakdown {where}
ORDER BY {order} {direction} NULLS LAST, session_id
LIMIT $limit
"""

# (name, aggregate, wrapper) of each total: TOTALS_SQL groups them, OVERVIEW_SQL takes them over all
# rows as window aggregates (``total_<name>``) beside the top rows, so one query computes the view once
_TOTALS = (
    ("sessions", "count(*)", "{}"),
    ("turns", "sum(turns)", "coalesce({}, 0)::BIGINT"),
    *(
        (c, f"sum({c})", "coalesce({}, 0)")
        for c in (
            "wall_ms",
            "input_processing_ms",
            "generation_ms",
            "tool_wait_ms",
            "app_work_ms",
            "user_pause_ms",
            "unattributed_ms",
        )
    ),
    ("start_ns", "min(start_ns)", "{}"),
    ("end_ns", "max(end_ns)", "{}"),
    ("kv_gib_s", "sum(kv_gib_s)", "coalesce({}, 0)"),
    # agent-side spans the breakdown could not place, and the sessions holding them (a warning)
    ("unplaced_spans", "sum(unplaced_spans)", "coalesce({}, 0)::BIGINT"),
    ("flagged_sessions", "count(*) FILTER (WHERE unplaced_spans > 0)", "{}"),
)
TOTALS_SQL = "SELECT " + ", ".join(w.format(a) + f" AS {n}" for n, a, w in _TOTALS) + " FROM session_breakdown {where}"
assert BREAKDOWN_SQL.count("\nFROM session_breakdown") == 1  # where OVERVIEW_SQL adds the totals
OVERVIEW_SQL = BREAKDOWN_SQL.replace(
    "\nFROM session_breakdown",
    "".join(f",\n       {w.format(a + ' OVER ()')} AS total_{n}" for n, a, w in _TOTALS) + "\nFROM session_breakdown",
)

TURNS_SQL = """
SELECT session_id, turn, wall_ms, input_processing_ms, generation_ms, tool_wait_ms, app_work_ms, user_pause_ms,
       unattributed_ms, start_ns, end_ns, kv_gib_s
FROM turn_breakdown {where}
ORDER BY session_id, turn
LIMIT $limit
"""

SESSION_INFO_SQL = """
SELECT session_id, agent_name, scenario, start_ns, end_ns, wall_ms, turns, traces, requests, kv_gib_s
FROM sessions WHERE session_id = $session_id
"""

# the session's traces, then every span in them (agent, proxy, engines, transfers, retention)
SESSION_SPANS_SQL = """
WITH t AS (SELECT DISTINCT trace_id FROM spans WHERE session_id = $session_id)
SELECT s.trace_id, s.span_id, s.parent_span_id, s.name, s.kind, s.service_name, s.start_ns, s.end_ns,
       s.duration_ms, s.status_code, s.turn, s.request_id, s.engine_id, s.engine_role, s.substrate
FROM spans s SEMI JOIN t ON s.trace_id = t.trace_id
ORDER BY s.start_ns, s.end_ns DESC, s.span_id
LIMIT $limit
"""

LIST_SESSIONS_SQL = """
SELECT session_id FROM session_breakdown {where} ORDER BY wall_ms DESC NULLS LAST, session_id LIMIT $limit
"""

# one grouped pass over the spans (four columns read), then the widgets' values from its few rows
FACETS_SQL = """
WITH g AS (
    SELECT service_name, substrate, count(*) AS spans, min(start_ns) AS start_ns, max(end_ns) AS end_ns
    FROM {spans} GROUP BY service_name, substrate
)
SELECT (SELECT list(DISTINCT service_name ORDER BY service_name) FROM g
        WHERE service_name IS NOT NULL AND service_name <> '') AS services,
       (SELECT list(DISTINCT substrate ORDER BY substrate) FROM g WHERE substrate IS NOT NULL) AS substrates,
       (SELECT min(start_ns) FROM g) AS start_ns, (SELECT max(end_ns) FROM g) AS end_ns,
       (SELECT CAST(COALESCE(sum(spans), 0) AS BIGINT) FROM g) AS spans
"""

# facets of the spans that start in the range (a bound on ``Timestamp`` on ClickHouse)
FACETS_SCOPE = {"start_ns": "start_ns >= $start_ns", "end_ns": "start_ns <= $end_ns"}

# the clocks the simulated workers ran on (kvtrace.sim.clock): a virtual run's timestamps are simulated;
# their engine spans say it (picked by name, so no other span's attribute maps are read: docs/benchmarks.md)
CLOCKS_SQL = f"""
SELECT DISTINCT ResourceAttributes[{literal(sc.SIM_CLOCK)}] AS clock
FROM spans WHERE name IN ({literal(sc.SPAN_ENGINE_PREFILL)}, {literal(sc.SPAN_ENGINE_DECODE)})
"""

TIME_SPAN_SQL = "SELECT min(start_ns) AS start_ns, max(end_ns) AS end_ns, count(*) AS spans FROM spans"
# DuckDB: the same from the files' facets (kvtrace.store.lookup), no raw span read
TIME_SPAN_LOOKUP_SQL = (
    f"SELECT min(start_ns) AS start_ns, max(end_ns) AS end_ns, COALESCE(sum(spans), 0)::BIGINT AS spans "
    f"FROM {lookup.FACETS}"
)

# waterfall lane per span name (page code colours by lane)
LANES = {
    sc.SPAN_AGENT_SESSION: "agent",
    sc.SPAN_AGENT_TURN: "agent",
    sc.SPAN_AGENT_LLM_CALL: "agent",
    sc.SPAN_AGENT_APP_WORK: "agent",
    sc.SPAN_AGENT_TOOL_CALL: "tool",
    sc.SPAN_AGENT_USER_PAUSE: "user",
    sc.SPAN_PROXY_REQUEST: "proxy",
    sc.SPAN_PROXY_PREFILL: "proxy",
    sc.SPAN_PROXY_DECODE: "proxy",
    sc.SPAN_ENGINE_PREFILL: "P",
    sc.SPAN_ENGINE_DECODE: "D",
    sc.SPAN_KV_DECISION: "kv",
    sc.SPAN_KV_TRANSFER: "transfer",
    sc.SPAN_KV_RETENTION: "retention",
}


def breakdown(
    con, filters: Filters | None = None, *, order: str = "wall_ms", descending: bool = True, limit: int = 1000
) -> pa.Table:
    """Rows of ``session_breakdown`` sorted by ``order`` (one of :data:`SORTABLE`)."""
    return _sorted(con, BREAKDOWN_SQL, filters, order, descending, limit)


def _sorted(con, sql: str, filters: Filters | None, order: str, descending: bool, limit: int) -> pa.Table:
    if order not in SORTABLE:
        raise ValueError(f"cannot sort by {order!r}; choose one of {', '.join(SORTABLE)}")
    clause, params = where(filters, SESSION_SCOPE)
    sql = sql.format(where=clause, order=order, direction="DESC" if descending else "ASC")
    return table(narrowed(con, filters), sql, {**params, "limit": limit})


def totals(con, filters: Filters | None = None) -> dict:
    """The five parts summed over all (filtered) sessions, with session and turn counts."""
    clause, params = where(filters, SESSION_SCOPE)
    return one(narrowed(con, filters), TOTALS_SQL.format(where=clause), params)


def overview(
    con, filters: Filters | None = None, *, order: str = "wall_ms", descending: bool = True, limit: int = 1000
) -> dict:
    """``{"totals": totals(...), "rows": breakdown(...)}`` from one computation of the view (the
    sessions page shows both)."""
    out = _sorted(con, OVERVIEW_SQL, filters, order, descending, limit)
    rows = out.drop_columns([f"total_{n}" for n, _, _ in _TOTALS])
    if not out.num_rows:  # no sessions: the totals of nothing
        return {"totals": totals(con, filters), "rows": rows}
    return {"totals": {n: out.column(f"total_{n}")[0].as_py() for n, _, _ in _TOTALS}, "rows": rows}


def turns(con, filters: Filters | None = None, limit: int = 100_000) -> pa.Table:
    """Rows of ``turn_breakdown`` (use ``Filters(session_id=...)`` for one session)."""
    clause, params = where(filters, SESSION_SCOPE)
    return table(narrowed(con, filters), TURNS_SQL.format(where=clause), {**params, "limit": limit})


def session_info(con, session_id: str) -> dict:
    return one(narrowed(con, Filters(session_id=session_id)), SESSION_INFO_SQL, {"session_id": session_id})


def list_sessions(con, filters: Filters | None = None, limit: int = 500) -> list[str]:
    """Session ids, longest first (the drill-down picker samples the top ``limit``)."""
    clause, params = where(filters, SESSION_SCOPE)
    sql = LIST_SESSIONS_SQL.format(where=clause)
    return [r["session_id"] for r in rows(narrowed(con, filters), sql, {**params, "limit": limit})]


def time_span(con) -> dict:
    """First span start, last span end (epoch ns) and span count of the whole store, from the shaped
    data where there is some (DuckDB: the files' facets; ClickHouse: kvtrace's materialized tables),
    else from the spans."""
    if not getattr(con, "is_clickhouse", False):
        return one(con, TIME_SPAN_LOOKUP_SQL)
    shaped = con.time_span()  # from kvtrace's materialized tables where the table has them
    return shaped if shaped is not None else one(con, TIME_SPAN_SQL)


def spans_of_session(con, session_id: str, limit: int = 5000, clip_ns: int | None = None) -> list[dict]:
    """Every span of the session's traces, start order, with ``lane`` and offsets from the first
    span in ms (``start_ms``/``end_ms``).  ``clip_ns``: spans ending later (retention held past the
    session) are cut there and marked ``clipped``."""
    con = narrowed(con, Filters(session_id=session_id))
    out = rows(con, SESSION_SPANS_SQL, {"session_id": session_id, "limit": limit})
    if not out:
        return out
    t0 = min(r["start_ns"] for r in out)
    for r in out:
        r["lane"] = LANES.get(r["name"], "other")
        end = r["end_ns"]
        r["clipped"] = clip_ns is not None and end > clip_ns
        if r["clipped"]:
            end = max(clip_ns, r["start_ns"])
        r["start_ms"] = (r["start_ns"] - t0) / 1e6
        r["end_ms"] = (end - t0) / 1e6
    return out


def facets(con, filters: Filters | None = None) -> dict:
    """Values for the filter widgets: services, substrates, time range, span count; of the spans
    that start in ``filters``' time range (its other fields are ignored), else of all."""
    clause, params = where(filters, FACETS_SCOPE)
    clickhouse = getattr(con, "is_clickhouse", False)
    if params and clickhouse:  # the same rows, read by Timestamp bounds
        con = con.bounded(params.get("start_ns", 0), params.get("end_ns", 2**63 - 1))
    if not params and not clickhouse:  # the whole store: merged from the files' facets
        out = one(con, lookup.STORE_FACETS_SQL)
    else:
        spans = f"(SELECT * FROM spans {clause}) AS s" if clause else "spans"
        out = one(con, FACETS_SQL.format(spans=spans), params)
    out["services"] = out.get("services") or []
    out["substrates"] = out.get("substrates") or []
    return out


def clocks(con, substrates: tuple[str, ...]) -> list[str]:
    """The clocks (``sc.CLOCKS``) the store's simulated workers ran on, sorted; spans written before
    kvtrace named the clock count as wall.  ``substrates``: the store's (its facets'); without the
    simulator there this reads nothing, so a fleet of real engines pays no scan for it."""
    if sc.SUBSTRATE_SIM not in substrates:
        return []
    found = {r["clock"] for r in rows(con, CLOCKS_SQL)}
    return sorted({c if c in sc.CLOCKS else sc.CLOCK_WALL for c in found})
