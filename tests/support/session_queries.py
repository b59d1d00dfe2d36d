"""The session-scoped named queries (sessions page, drill-down, latency) and how two of their
answers compare: what the filter pushdown tests (DuckDB and ClickHouse) run on both sides."""

from __future__ import annotations

import math

from kvtrace.analysis import latency, sessions

REL = 1e-9

SESSION_QUERIES = {
    "totals": sessions.totals,
    "breakdown": lambda c, f: sessions.breakdown(c, f).to_pylist(),
    "overview": lambda c, f: (lambda o: {**o, "rows": o["rows"].to_pylist()})(sessions.overview(c, f)),
    "turns": lambda c, f: sessions.turns(c, f).to_pylist(),
    "list_sessions": sessions.list_sessions,
    "by_turn": lambda c, f: latency.by_turn(c, f).to_pylist(),
    "call_values": lambda c, f: sorted(latency.call_values(c, f).to_pylist(), key=repr),
    "turn_values": lambda c, f: sorted(latency.turn_values(c, f).to_pylist(), key=repr),
}
"""``name -> fn(con, filters)``."""


def same_answer(a, b) -> bool:
    """Two answers equal: floats to 1e-9 relative (summation order), everything else exactly."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_answer(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_answer(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and b is not None:
        return math.isclose(a, b, rel_tol=REL)
    return a == b
