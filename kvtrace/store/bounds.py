"""Reading one session's part of a DuckDB store: ``Timestamp`` bounds, pushed into the Parquet scan.

The raw relation every view reads (:data:`kvtrace.store.views.spans.RAW`) carries :data:`FILTER`:
spans starting outside ``[getvariable('kvtrace_lo'), getvariable('kvtrace_hi')]``.  Unset (every
connection :func:`kvtrace.store.connect` opens) the filter folds to true and the plan has none; on a
:func:`bounded` cursor the two variables are constants, which DuckDB pushes into the scan, so row
groups outside them are skipped by their statistics.  Variables belong to one connection, so a
bounded cursor changes nothing for the others (the dashboard runs each query on its own cursor).

:func:`session_bounds` gives a session's bounds as :mod:`kvtrace.analysis.pushdown` needs them:
the first start and last end of every trace holding a span that names it (any convention's session
attribute), because a session is a property of whole traces and its spans start inside them;
:func:`window_bounds` those of every session whose traces overlap a time range; :func:`requests_bounds`
those of every request whose spans overlap given bounds (the KV reuse questions join a request's
spans by its id, :func:`kvtrace.analysis.pushdown.request_scoped`).  They read the files' lookups
(:mod:`kvtrace.store.lookup`), not the raw spans.
"""

from __future__ import annotations

from kvtrace.store import lookup, narrow

LO, HI = "kvtrace_lo", "kvtrace_hi"


def _within(column: str, value: str = "{}") -> str:
    """`` WHERE`` ``column`` is within the bounds that are set (``value``: how a bound is cast to it)."""
    lo, hi = (value.format(f"getvariable('{name}')") for name in (LO, HI))
    return (
        f" WHERE (getvariable('{LO}') IS NULL OR {column} >= {lo})"
        f" AND (getvariable('{HI}') IS NULL OR {column} <= {hi})"
    )


FILTER = _within("Timestamp")
"""Appended to the raw relation's ``SELECT ... FROM read_parquet(...)``."""
INDEX_FILTER = _within("start_ns", "epoch_ns({}::TIMESTAMPTZ_NS)")
"""The same bounds on the rows of per-file scan indexes (:mod:`kvtrace.store.scan_index`), whose
``start_ns`` is ``epoch_ns(Timestamp)``."""


def _pair(con, sql: str, params: dict) -> tuple[int, int] | None:
    [(lo, hi)] = con.execute(sql, params).fetchall()  # all: DuckDB 2 refuses other work on a
    # connection whose result was not read to the end
    return None if lo is None else (int(lo), int(hi))


def session_bounds(con, session_id: str) -> tuple[int, int] | None:
    """``[first start, last end]`` (epoch ns) of the traces naming ``session_id``; None if none does.
    Read from the files' lookups (:mod:`kvtrace.store.lookup`, loaded in memory when the files were bound)."""
    return _pair(con, lookup.SESSION_BOUNDS_SQL, {"sid": session_id})


def window_bounds(con, start_ns: int | None, end_ns: int | None) -> tuple[int, int] | None:
    """``[first start, last end]`` of the traces of every session whose traces overlap
    ``[start_ns, end_ns]`` (either None: unbounded); None if no session does.  From the lookups:
    every trace part of the store, three narrow columns, no raw span."""
    lo = -(2**63) if start_ns is None else int(start_ns)
    hi = 2**63 - 1 if end_ns is None else int(end_ns)
    return _pair(con, lookup.WINDOW_BOUNDS_SQL, {"lo": lo, "hi": hi})


def store_bounds(con) -> tuple[int, int] | None:
    """``[first start, last end]`` of every span of the store (its files' facets); None if it has none."""
    return _pair(con, f"SELECT min(start_ns), max(end_ns) FROM {lookup.FACETS}", {})


def requests_bounds(con, lo_ns: int, hi_ns: int) -> tuple[int, int] | None:
    """``[first start, last end]`` of the spans of every request (``gen_ai.request.id``) whose spans
    overlap ``[lo_ns, hi_ns]``, and of every retention span naming no request that does; None if none
    does.  From the requests lookup."""
    return _pair(con, lookup.REQUESTS_BOUNDS_SQL, {"lo": int(lo_ns), "hi": int(hi_ns)})


def bounded(con, lo_ns: int, hi_ns: int):
    """A cursor of ``con`` whose views read only spans starting in ``[lo_ns, hi_ns]``, from the files
    whose range overlaps it (:mod:`kvtrace.store.narrow`)."""
    cur = con.cursor()
    for name, value in ((LO, lo_ns), (HI, hi_ns)):
        cur.execute(f"SET VARIABLE {name} = make_timestamp_ns($v::BIGINT)::TIMESTAMPTZ_NS", {"v": int(value)})
    narrow.narrow(cur, lo_ns, hi_ns)
    return cur
