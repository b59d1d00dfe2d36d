"""What the breakdown made of a store's agent spans: ``kvtrace doctor``'s named queries.

:func:`doctor` says, per convention, which agent-side spans were seen and the role each was given,
which were seen but not placed (an attribute of a convention with a value the mapping of
:mod:`kvtrace.semconv.conventions` does not know), which were placed but belong to no session (no
session id in their trace and no proxy request to lend one), how the LLM calls found their proxy
requests, and which sessions are flagged.
"""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.analysis.common import rows
from kvtrace.store.sql import literal, str_attr

_KVTRACE = literal(sc.CONV_KVTRACE)
_VALUE = " ".join(
    f"WHEN {str_attr(a)} IS NOT NULL THEN {literal(a)} || '=' || {str_attr(a)}" for a in sc.CLASSIFYING_ATTRIBUTES
)

SEEN_SQL = """
SELECT convention, role, count(*) AS spans, count(session_id) AS with_own_session_id
FROM (SELECT convention, role, session_id FROM kvtrace_agent_spans
      UNION ALL SELECT convention, role, session_id FROM kvtrace_foreign_spans)
WHERE role IS NOT NULL GROUP BY convention, role ORDER BY convention, role
"""

# the unplaced spans with the attribute that made them agent-side and its value
UNPLACED_SQL = f"""
WITH u AS (SELECT trace_id, span_id FROM kvtrace_foreign_spans WHERE role IS NULL)
SELECT s.name, CASE {_VALUE} END AS attribute, count(*) AS spans, count(DISTINCT s.trace_id) AS traces
FROM spans s SEMI JOIN u ON u.trace_id = s.trace_id AND u.span_id = s.span_id
GROUP BY ALL ORDER BY spans DESC, s.name LIMIT $limit
"""

NO_SESSION_SQL = """
SELECT convention, role, count(*) AS spans, count(DISTINCT trace_id) AS traces
FROM kvtrace_foreign_spans a
WHERE role IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM trace_sessions t WHERE t.trace_id = a.trace_id)
GROUP BY convention, role ORDER BY convention, role
"""

JOINS_SQL = """
SELECT convention, join_kind, count(*) AS llm_calls, count(outcome) AS with_kv_decision
FROM agent_llm_calls GROUP BY convention, join_kind ORDER BY convention, join_kind
"""

FLAGGED_SQL = """
SELECT session_id, unplaced_spans, turns, wall_ms FROM session_breakdown WHERE unplaced_spans > 0
ORDER BY unplaced_spans DESC, session_id LIMIT $limit
"""

SECTIONS = (
    ("seen", "Agent-side spans placed, by convention and role", SEEN_SQL),
    ("unplaced", "Seen but not placed (the session is flagged)", UNPLACED_SQL),
    ("no_session", "Placed, but in no session (no session id in the trace, no proxy request)", NO_SESSION_SQL),
    ("joins", "LLM calls and their proxy requests", JOINS_SQL),
    ("flagged", "Sessions flagged", FLAGGED_SQL),
)


def doctor(con, limit: int = 50) -> list[tuple[str, str, list[dict]]]:
    """``(key, title, rows)`` of each section of :data:`SECTIONS`."""
    return [(key, title, rows(con, sql, {"limit": limit} if "$limit" in sql else None)) for key, title, sql in SECTIONS]
