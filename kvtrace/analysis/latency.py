"""Latency by turn index, and the per-call / per-turn values two runs are compared on.

Reuse pays off in later turns, so latency is grouped by the 0-based turn index:

- **TTFT** and call latency per LLM call: the agent's ``llm_call`` spans, else (sessions whose
  agent is not instrumented) the proxy's request spans;
- **completed-task latency**: the turn's wall time (agent turn span, else first request start →
  last request end of that turn; see ``kvtrace_turn_windows`` in :mod:`.breakdown`).

:func:`call_values` and :func:`turn_values` are what :mod:`kvtrace.analysis.compare` compares two
runs on (for example ``DIR/baseline`` and ``DIR/bidir`` written by ``kvtrace demo``).
"""

from __future__ import annotations

import pyarrow as pa

from kvtrace.analysis.common import filtered
from kvtrace.analysis.filters import SESSION_SCOPE, Filters

CALLS_SQL = """
WITH llm_sessions AS (SELECT DISTINCT session_id FROM llm_calls WHERE session_id IS NOT NULL)
SELECT session_id, turn, start_ns, end_ns, ttft_ms, duration_ms AS latency_ms FROM llm_calls
UNION ALL
SELECT session_id, turn, start_ns, end_ns, ttft_ms, latency_ms FROM requests
WHERE session_id IS NULL OR session_id NOT IN (SELECT session_id FROM llm_sessions)
"""

BY_TURN_SQL = f"""
WITH c AS (SELECT * FROM ({CALLS_SQL}) {{where}}),
calls AS (
    SELECT turn, count(*) AS calls,
           median(ttft_ms) AS ttft_p50_ms, quantile_cont(ttft_ms, 0.9) AS ttft_p90_ms,
           avg(ttft_ms) AS ttft_mean_ms,
           median(latency_ms) AS latency_p50_ms, avg(latency_ms) AS latency_mean_ms
    FROM c WHERE turn IS NOT NULL GROUP BY turn
),
w AS (SELECT * FROM kvtrace_turn_windows {{where}}),
tasks AS (
    SELECT turn, count(*) AS turns,
           median((end_ns - start_ns) / 1e6) AS task_p50_ms,
           quantile_cont((end_ns - start_ns) / 1e6, 0.9) AS task_p90_ms,
           avg((end_ns - start_ns) / 1e6) AS task_mean_ms
    FROM w GROUP BY turn
)
SELECT turn, coalesce(tasks.turns, 0) AS turns, coalesce(calls.calls, 0) AS calls,
       ttft_p50_ms, ttft_p90_ms, ttft_mean_ms, latency_p50_ms, latency_mean_ms,
       task_p50_ms, task_p90_ms, task_mean_ms
FROM calls FULL OUTER JOIN tasks USING (turn)
ORDER BY turn
"""

CALL_VALUES_SQL = f"SELECT turn, ttft_ms, latency_ms FROM ({CALLS_SQL}) {{where}}"
TURN_VALUES_SQL = "SELECT turn, (end_ns - start_ns) / 1e6 AS latency_ms FROM kvtrace_turn_windows {where}"


def by_turn(con, filters: Filters | None = None) -> pa.Table:
    """Per turn index: calls, TTFT p50/p90/mean, call latency p50/mean, turns and
    completed-task latency p50/p90/mean (ms)."""
    return filtered(con, BY_TURN_SQL, filters, SESSION_SCOPE)


def call_values(con, filters: Filters | None = None) -> pa.Table:
    """One row per LLM call (agent ``llm_call`` spans, else proxy requests): turn, ttft_ms, latency_ms."""
    return filtered(con, CALL_VALUES_SQL, filters, SESSION_SCOPE)


def turn_values(con, filters: Filters | None = None) -> pa.Table:
    """One row per turn window: turn, latency_ms (the completed task)."""
    return filtered(con, TURN_VALUES_SQL, filters, SESSION_SCOPE)
