"""The session-scoped named queries (sessions page, drill-down, latency), the KV reuse and retention
pages' (reuse, per instance, continuity, retention) and how two of their answers compare: what the
filter pushdown tests (DuckDB and ClickHouse) run on both sides."""

from __future__ import annotations

import math

from kvtrace.analysis import continuity, instances, latency, retention, reuse, sessions

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

REUSE_QUERIES = {
    "requests": lambda c, f: reuse.requests(c, f).to_pylist(),
    "summary": reuse.summary,
    "decision_mix": lambda c, f: reuse.decision_mix(c, f).to_pylist(),
    "verification": lambda c, f: reuse.verification(c, f).to_pylist(),
    "mismatches": lambda c, f: reuse.mismatches(c, f, limit=1000).to_pylist(),
    "offer_mix": lambda c, f: reuse.offer_mix(c, f).to_pylist(),
    "tokens_by_source": lambda c, f: reuse.tokens_by_source(c, f).to_pylist(),
    "per_instance": lambda c, f: instances.per_instance(c, f).to_pylist(),
    "continuity": lambda c, f: continuity.summary(c, f).to_pylist(),
    "breaks": lambda c, f: continuity.breaks(c, f).to_pylist(),
    "retention_series": lambda c, f: retention.series(c, f, max_points=50).to_pylist(),
    "retention_summary": retention.summary,
    "retention_totals": retention.totals,
    "expiries": lambda c, f: retention.expiries(c, f).to_pylist(),
}
"""The KV reuse and retention pages' questions, ``name -> fn(con, filters)``."""


def same_answer(a, b) -> bool:
    """Two answers equal: floats to 1e-9 relative (summation order), everything else exactly."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_answer(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_answer(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and b is not None:
        return math.isclose(a, b, rel_tol=REL)
    return a == b
