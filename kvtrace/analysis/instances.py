"""Reuse per instance of a P/D fleet: where the proxy's routing sent the turns (``requests``:
``prefill_endpoint`` / ``decode_endpoint`` and why, ``prefill_route`` / ``decode_route``) and what
each instance reused (its own decisions in ``kv_decisions``, joined on the request: P's ``d2p`` for a
prefill endpoint, D's ``p2d`` for a decode endpoint), and the legs the proxy sent each (``proxy_legs``:
failed, unreachable), so a worker that only failed has a row too.  One row per role and endpoint."""

from __future__ import annotations

import pyarrow as pa

from kvtrace import semconv as sc
from kvtrace.analysis.common import table
from kvtrace.analysis.filters import ROW_SCOPE, Filters, where
from kvtrace.analysis.pushdown import request_scoped
from kvtrace.store.sql import literal

ROLES = ((sc.ROLE_PREFILL, "prefill", sc.DIRECTION_D2P), (sc.ROLE_DECODE, "decode", sc.DIRECTION_P2D))


def _one_role(role: str, column: str, direction: str) -> str:
    """One role's rows: the requests each endpoint served (with what it reused) beside the legs the
    proxy sent it, so a worker that only failed (a dead one: no request ends there) has its row."""
    reasons = ", ".join(f"count(*) FILTER (WHERE r.{column}_route = {literal(x)}) AS {x}" for x in sc.ROUTE_REASONS)
    zeroed = ", ".join(f"coalesce(q.{x}, 0) AS {x}" for x in sc.ROUTE_REASONS)
    return f"""
    SELECT {literal(role)} AS role, endpoint, coalesce(q.requests, 0) AS requests, {zeroed},
           coalesce(q.pulled, 0) AS pulled, coalesce(q.local_hit_tokens, 0)::BIGINT AS local_hit_tokens,
           coalesce(q.pulled_tokens, 0)::BIGINT AS pulled_tokens,
           coalesce(q.recomputed_tokens, 0)::BIGINT AS recomputed_tokens, q.mean_ttft_ms,
           l.legs, l.failed_legs, l.unreachable_legs, l.failed_leg_ms
    FROM (
        SELECT r.{column}_endpoint AS endpoint, count(*) AS requests, {reasons},
               count(*) FILTER (WHERE d.outcome = {literal(sc.OUTCOME_PULLED)}) AS pulled,
               sum(d.local_hit_tokens) AS local_hit_tokens, sum(d.pulled_tokens) AS pulled_tokens,
               sum(d.recomputed_tokens) AS recomputed_tokens, avg(r.ttft_ms) AS mean_ttft_ms
        FROM requests r
        LEFT JOIN (SELECT * FROM kv_decisions WHERE direction = {literal(direction)}) d USING (request_id)
        WHERE r.{column}_endpoint IS NOT NULL {{where}}
        GROUP BY r.{column}_endpoint
    ) q
    FULL OUTER JOIN (
        SELECT endpoint, legs, failed_legs, unreachable_legs, failed_leg_ms FROM legs WHERE role = {literal(role)}
    ) l USING (endpoint)
    """


# each worker's legs, both roles in one pass over the leg spans
_LEGS = """
    SELECT g.role, g.endpoint, count(*) AS legs, count(*) FILTER (WHERE g.error_type IS NOT NULL) AS failed_legs,
           count(*) FILTER (WHERE g.unreachable) AS unreachable_legs,
           sum(g.duration_ms) FILTER (WHERE g.error_type IS NOT NULL) AS failed_leg_ms
    FROM proxy_legs g
    WHERE g.endpoint IS NOT NULL {legs_where}
    GROUP BY g.role, g.endpoint
"""


_SCOPE = {k: f"r.{v}" for k, v in ROW_SCOPE.items()}  # the requests' columns (r), not the decisions'
PER_INSTANCE_SQL = (
    f"WITH legs AS ({_LEGS}) SELECT * FROM ("
    + " UNION ALL ".join(_one_role(*r) for r in ROLES)
    + f") ORDER BY role = {literal(sc.ROLE_DECODE)}, endpoint"
)


def per_instance(con, filters: Filters | None = None) -> pa.Table:
    """Per role and endpoint: requests, how many each route reason sent (``sc.ROUTE_REASONS``
    columns), pulls, local hit, pulled and recomputed tokens, mean proxy TTFT (ms), and the legs the
    proxy sent it: all, failed, unreachable (the worker never got them) and the ms the failed ones
    took (NULL where the traces do not name a leg's worker); of the requests ``filters`` selects
    (their start, session, service, substrate)."""
    clause, params = where(filters, _SCOPE, prefix="AND")
    # a leg is in scope when its request is: the request span it is a child of passes the same filters
    requests, _ = where(filters, ROW_SCOPE)
    legs_clause = f"AND (g.trace_id, g.parent_span_id) IN (SELECT trace_id, span_id FROM requests {requests})"
    sql = PER_INSTANCE_SQL.format(where=clause, legs_where=legs_clause if requests else "")
    return table(request_scoped(con, filters), sql, params)


def is_fleet(rows: list[dict]) -> bool:
    """More than one instance of a role served requests."""
    return any(sum(r["role"] == role for r in rows) > 1 for role, _, _ in ROLES)
