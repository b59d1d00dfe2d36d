"""Reuse per instance of a P/D fleet: where the proxy's routing sent the turns (``requests``:
``prefill_endpoint`` / ``decode_endpoint`` and why, ``prefill_route`` / ``decode_route``) and what
each instance reused (its own decisions in ``kv_decisions``, joined on the request: P's ``d2p`` for a
prefill endpoint, D's ``p2d`` for a decode endpoint).  One row per role and endpoint."""

from __future__ import annotations

import pyarrow as pa

from kvtrace import semconv as sc
from kvtrace.analysis.common import table
from kvtrace.analysis.filters import ROW_SCOPE, Filters, where
from kvtrace.store.sql import literal

ROLES = ((sc.ROLE_PREFILL, "prefill", sc.DIRECTION_D2P), (sc.ROLE_DECODE, "decode", sc.DIRECTION_P2D))


def _one_role(role: str, column: str, direction: str) -> str:
    reasons = ", ".join(f"count(*) FILTER (WHERE r.{column}_route = {literal(x)}) AS {x}" for x in sc.ROUTE_REASONS)
    return f"""
    SELECT {literal(role)} AS role, r.{column}_endpoint AS endpoint, count(*) AS requests, {reasons},
           count(*) FILTER (WHERE d.outcome = {literal(sc.OUTCOME_PULLED)}) AS pulled,
           coalesce(sum(d.local_hit_tokens), 0)::BIGINT AS local_hit_tokens,
           coalesce(sum(d.pulled_tokens), 0)::BIGINT AS pulled_tokens,
           coalesce(sum(d.recomputed_tokens), 0)::BIGINT AS recomputed_tokens,
           avg(r.ttft_ms) AS mean_ttft_ms
    FROM requests r
    LEFT JOIN (SELECT * FROM kv_decisions WHERE direction = {literal(direction)}) d USING (request_id)
    WHERE r.{column}_endpoint IS NOT NULL {{where}}
    GROUP BY r.{column}_endpoint
    """


_SCOPE = {k: f"r.{v}" for k, v in ROW_SCOPE.items()}  # the requests' columns (r), not the decisions'
PER_INSTANCE_SQL = (
    "SELECT * FROM ("
    + " UNION ALL ".join(_one_role(*r) for r in ROLES)
    + f") ORDER BY role = {literal(sc.ROLE_DECODE)}, endpoint"
)


def per_instance(con, filters: Filters | None = None) -> pa.Table:
    """Per role and endpoint: requests, how many each route reason sent (``sc.ROUTE_REASONS``
    columns), pulls, local hit, pulled and recomputed tokens, mean proxy TTFT (ms); of the requests
    ``filters`` selects (their start, session, service, substrate)."""
    clause, params = where(filters, _SCOPE, prefix="AND")
    return table(con, PER_INSTANCE_SQL.format(where=clause), params)


def is_fleet(rows: list[dict]) -> bool:
    """More than one instance of a role served requests."""
    return any(sum(r["role"] == role for r in rows) > 1 for role, _, _ in ROLES)
