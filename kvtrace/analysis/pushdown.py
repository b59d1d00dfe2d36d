"""Session-scoped filters pushed down to ClickHouse, exactly.

On a fleet's ``otel_traces`` table, the dashboard must not scan days of spans to show one session
or one hour.  :func:`narrowed` turns the filters of a session-scoped query (``SESSION_SCOPE``:
session id, time range; :mod:`.sessions`, :mod:`.latency`) into time bounds on the table's
``Timestamp`` (its partition key, and in its sort key after service and span name), found by one
small query first:

- a **session id**: the first start and last end of the spans carrying it (a bloom filter skip
  index finds them; ``SessionId`` with kvtrace's recommended DDL);
- a **time range**: the sessions whose session (or request) spans overlap it, and the first start
  and last end of those spans.

Every span a session-scoped query reads belongs to a selected session, and a session's spans start
inside its window (children start after their parents), so reading only the bounds gives the same
rows as reading everything.  ``tests/store/clickhouse/test_filter_pushdown.py`` checks the results against DuckDB
and that fewer rows are read.  DuckDB connections (and filters without a session or time
restriction) are returned as they are.
"""

from __future__ import annotations

from kvtrace.analysis.filters import Filters

EMPTY = (1, 0)
"""Bounds no span falls in (no session matched)."""


def narrowed(con, filters: Filters | None):
    """``con``, reading only what ``filters`` (session-scoped) can select (module doc)."""
    if not getattr(con, "is_clickhouse", False) or filters is None or con.bounds is not None:
        return con
    if filters.session_id:
        bounds = con.session_bounds(filters.session_id)
    elif filters.start_ns is not None or filters.end_ns is not None:
        bounds = con.window_bounds(filters.start_ns, filters.end_ns)
    else:
        return con
    return con.bounded(*(bounds or EMPTY))
