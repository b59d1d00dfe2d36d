"""Dashboard / report filters, turned into WHERE clauses from fixed SQL fragments.

Every query module maps each filter to a constant fragment with a named parameter (``$start_ns``,
``$session_id``, ...); :func:`where` keeps the fragments of the filters that are set and returns
the clause with exactly the parameters it uses (DuckDB rejects unused ones).  No value is ever
formatted into SQL.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Filters:
    """What the user narrowed the data to.  ``None`` = no restriction.

    Time bounds are epoch ns and select rows overlapping ``[start_ns, end_ns]``.
    """

    start_ns: int | None = None
    end_ns: int | None = None
    session_id: str | None = None
    service: str | None = None
    substrate: str | None = None

    def active(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}


NO_FILTERS = Filters()

# fragments for views with one row per session (or per turn): session_breakdown, turn windows
SESSION_SCOPE = {
    "start_ns": "end_ns >= $start_ns",
    "end_ns": "start_ns <= $end_ns",
    "session_id": "session_id = $session_id",
    "service": "session_id IN (SELECT session_id FROM spans WHERE service_name = $service)",
    "substrate": "session_id IN (SELECT session_id FROM spans WHERE substrate = $substrate)",
}

# fragments for views with a row's start_ns and session_id but no service / substrate columns
# (continuity, turn_gaps): those two filters select sessions
SESSION_ROW_SCOPE = {**SESSION_SCOPE, "start_ns": "start_ns >= $start_ns"}

# fragments for connector-side views with service_name and substrate columns (kv_decisions)
ROW_SCOPE = {
    "start_ns": "start_ns >= $start_ns",
    "end_ns": "start_ns <= $end_ns",
    "session_id": "session_id = $session_id",
    "service": "service_name = $service",
    "substrate": "substrate = $substrate",
}

# fragments for views with substrate but no service_name (kv_transfers, kv_retention, engine_requests)
ROW_SCOPE_NO_SERVICE = {
    **ROW_SCOPE,
    "service": "session_id IN (SELECT session_id FROM spans WHERE service_name = $service)",
}

# kv_retention: rows overlapping the range
RETENTION_SCOPE = {**ROW_SCOPE_NO_SERVICE, "start_ns": "end_ns >= $start_ns"}


def where(filters: Filters | None, scope: dict[str, str], prefix: str = "WHERE") -> tuple[str, dict]:
    """(``"WHERE a AND b"`` or ``""``, params) for the filters that are set and have a fragment."""
    active = (filters or NO_FILTERS).active()
    parts = [scope[k] for k in active if k in scope]
    params = {k: v for k, v in active.items() if k in scope}
    if not parts:
        return "", {}
    return f"{prefix} " + " AND ".join(parts), params
