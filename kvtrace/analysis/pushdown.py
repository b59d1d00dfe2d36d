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

:func:`request_scoped` does the same for the KV reuse and retention questions (:mod:`.reuse`,
:mod:`.instances`, :mod:`.continuity`, :mod:`.retention`), on DuckDB: their rows are decisions,
transfers, prefills and proxy requests selected by their own start (or session), or retentions
overlapping the range, joined to other spans of the same request by its id (or as children of its
request span), and to the whole of its session (the continuity view's agent).  Their
bounds are the hull of the range itself, every session whose traces overlap it
(:func:`kvtrace.store.bounds.window_bounds`) and every request whose spans overlap it
(:func:`kvtrace.store.bounds.requests_bounds`), so every span a selected row joins starts inside.
The prefill rates that price recompute are the whole store's, read from the files' lookups, whatever
the bounds (:mod:`.reuse`).  ``tests/analysis/test_reuse_pushdown.py`` checks the answers against the
unbounded store's.  On ClickHouse the same bounds come from kvtrace's materialized tables
(:mod:`kvtrace.store.clickhouse.mviews`: windows, traces, requests), and the rates from its prefill
tables (``tests/store/clickhouse/test_reuse_pushdown_clickhouse.py``); a table without them is read
whole, as before.
"""

from __future__ import annotations

from kvtrace.analysis.filters import Filters
from kvtrace.store import bounds as duck_bounds
from kvtrace.store import lookup

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


def request_scoped(con, filters: Filters | None, *, by_session: bool = True):
    """``con``, reading only what the KV reuse questions of ``filters`` can select and join (module
    doc); ``by_session=False``: a session filter is not pushed down (the continuity view names a
    turn's agent from a session other than its own, which the session's bounds need not hold).  The
    bounds are found once per listing of the files (on ClickHouse: per state of its tables' parts,
    :func:`kvtrace.store.lookup.kept`), not per question."""
    if filters is None:
        return con
    if filters.session_id and not by_session:
        return con
    if not filters.session_id and filters.start_ns is None and filters.end_ns is None:
        return con
    clickhouse = getattr(con, "is_clickhouse", False)
    if clickhouse and (con.bounds is not None or not con.has_lookup):  # bounded already; or no requests table
        return con
    found = _ClickHouseBounds(con) if clickhouse else _DuckBounds(con)
    within = lookup.kept(con, ("request_scoped", filters), lambda: _request_bounds(found, filters))
    return con.bounded(*(within or EMPTY)) if clickhouse else duck_bounds.bounded(con, *(within or EMPTY))


class _DuckBounds:
    """The bounds a DuckDB store's lookups give (:mod:`kvtrace.store.bounds`)."""

    def __init__(self, con) -> None:
        self.con = con

    def session(self, session_id: str) -> tuple[int, int] | None:
        return duck_bounds.session_bounds(self.con, session_id)

    def window(self, start_ns: int | None, end_ns: int | None) -> tuple[int, int] | None:
        return duck_bounds.window_bounds(self.con, start_ns, end_ns)

    def store(self) -> tuple[int, int] | None:
        return duck_bounds.store_bounds(self.con)

    def requests(self, lo_ns: int, hi_ns: int) -> tuple[int, int] | None:
        return duck_bounds.requests_bounds(self.con, lo_ns, hi_ns)


class _ClickHouseBounds(_DuckBounds):
    """The same bounds from a ClickHouse table's materialized tables (:mod:`kvtrace.store.clickhouse.mviews`)."""

    def session(self, session_id: str) -> tuple[int, int] | None:
        return self.con.session_bounds(session_id)

    def window(self, start_ns: int | None, end_ns: int | None) -> tuple[int, int] | None:
        return self.con.window_bounds(start_ns, end_ns)

    def store(self) -> tuple[int, int] | None:
        span = self.con.time_span()
        return None if not span or span["start_ns"] is None else (span["start_ns"], span["end_ns"])

    def requests(self, lo_ns: int, hi_ns: int) -> tuple[int, int] | None:
        return self.con.requests_bounds(lo_ns, hi_ns)


def _request_bounds(found: _DuckBounds, filters: Filters) -> tuple[int, int] | None:
    """The hull of the session's (or the range's, :func:`_window`) bounds and of every request
    overlapping them; None if nothing is in them."""
    within = found.session(filters.session_id) if filters.session_id else _window(found, filters)
    return None if within is None else _hull(within, found.requests(*within))


def _window(found: _DuckBounds, filters: Filters) -> tuple[int, int] | None:
    """The range itself (an open end: the store's), and every session whose traces overlap it."""
    store = found.store()
    if store is None:
        return None
    start_ns, end_ns = filters.start_ns, filters.end_ns
    own = (store[0] if start_ns is None else int(start_ns), store[1] if end_ns is None else int(end_ns))
    return _hull(own, found.window(start_ns, end_ns))


def _hull(a: tuple[int, int], b: tuple[int, int] | None) -> tuple[int, int]:
    return a if b is None else (min(a[0], b[0]), max(a[1], b[1]))
