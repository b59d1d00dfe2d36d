"""Session-scoped filters pushed down to the store's scan (ClickHouse; DuckDB for a session id), exactly.

On a fleet's ``otel_traces`` table, the dashboard must not scan days of spans to show one session
or one hour.  :func:`narrowed` turns the filters of a session-scoped query (``SESSION_SCOPE``:
session id, time range; :mod:`.sessions`, :mod:`.latency`) into time bounds on the table's
``Timestamp`` (its partition key, and in its sort key after service and span name), found by one
small query first:

- a **session id**: the first start and last end of the traces holding a span that names it (any
  convention's attribute; bloom filter skip indexes find them; ``SessionId`` with kvtrace's
  recommended DDL);
- a **time range**: the sessions whose window (read from session, request and root spans) overlaps
  it, and the first start and last end of their traces.

Every span a session-scoped query reads belongs to a selected session, which is a property of whole
traces, and a session's spans start inside its traces' window (children start after their parents),
so reading only the bounds gives the same rows as reading everything.
``tests/store/clickhouse/test_filter_pushdown.py`` (and ``..._conventions.py``) check the results
against DuckDB and that fewer rows are read.

On DuckDB both are pushed down the same way (:mod:`kvtrace.store.bounds`: the same trace bounds,
read from the files' lookups, :mod:`kvtrace.store.lookup`, then a cursor whose raw relation and scan
indexes carry them as variables DuckDB pushes into the Parquet scans, so files and row groups
outside are skipped; ``tests/analysis/test_session_pushdown.py``, ``test_fleet_scale_answers.py``):
a day's question reads that day's sessions, whatever the history kept.
"""

from __future__ import annotations

from kvtrace.analysis.filters import Filters
from kvtrace.store import bounds as duck_bounds

EMPTY = (1, 0)
"""Bounds no span falls in (no session matched)."""


def narrowed(con, filters: Filters | None):
    """``con``, reading only what ``filters`` (session-scoped) can select (module doc)."""
    if filters is None:
        return con
    if not getattr(con, "is_clickhouse", False):  # DuckDB: bounds from the files' lookups
        if filters.session_id:
            return duck_bounds.bounded(con, *(duck_bounds.session_bounds(con, filters.session_id) or EMPTY))
        if filters.start_ns is None and filters.end_ns is None:
            return con
        return duck_bounds.bounded(con, *(duck_bounds.window_bounds(con, filters.start_ns, filters.end_ns) or EMPTY))
    if con.bounds is not None:
        return con
    if filters.session_id:  # bounds, and the session's traces only where the table has kvtrace's lookup
        return con.session_scope(filters.session_id)
    if filters.start_ns is not None or filters.end_ns is not None:
        bounds = con.window_bounds(filters.start_ns, filters.end_ns)
    else:
        return con
    return con.bounded(*(bounds or EMPTY))
