"""Reading one session's part of a DuckDB store: ``Timestamp`` bounds, pushed into the Parquet scan.

The raw relation every view reads (:data:`kvtrace.store.views.spans.RAW`) carries :data:`FILTER`:
spans starting outside ``[getvariable('kvtrace_lo'), getvariable('kvtrace_hi')]``.  Unset (every
connection :func:`kvtrace.store.connect` opens) the filter folds to true and the plan has none; on a
:func:`bounded` cursor the two variables are constants, which DuckDB pushes into the scan, so row
groups outside them are skipped by their statistics.  Variables belong to one connection, so a
bounded cursor changes nothing for the others (the dashboard runs each query on its own cursor).

:func:`session_bounds` gives a session's bounds as :mod:`kvtrace.analysis.pushdown` needs them:
the first start and last end of every trace holding a span that names it (any convention's session
attribute), because a session is a property of whole traces and its spans start inside them.
"""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.store.sql import str_attr

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

_NAMES = " OR ".join(f"{str_attr(a)} = $sid" for a in sc.SESSION_ATTRIBUTES)
SESSION_BOUNDS_SQL = f"""
SELECT min(epoch_ns(Timestamp)) AS lo, max(epoch_ns(Timestamp) + Duration) AS hi
FROM kvtrace_raw WHERE TraceId IN (SELECT TraceId FROM kvtrace_raw WHERE {_NAMES})
"""


def session_bounds(con, session_id: str) -> tuple[int, int] | None:
    """``[first start, last end]`` (epoch ns) of the traces naming ``session_id``; None if none does."""
    [(lo, hi)] = con.execute(SESSION_BOUNDS_SQL, {"sid": session_id}).fetchall()  # all: DuckDB 2 refuses
    # other work on a connection whose result was not read to the end
    return None if lo is None else (int(lo), int(hi))


def bounded(con, lo_ns: int, hi_ns: int):
    """A cursor of ``con`` whose views read only spans starting in ``[lo_ns, hi_ns]``."""
    cur = con.cursor()
    for name, value in ((LO, lo_ns), (HI, hi_ns)):
        cur.execute(f"SET VARIABLE {name} = make_timestamp_ns($v::BIGINT)::TIMESTAMPTZ_NS", {"v": int(value)})
    return cur
