"""Running named queries: Arrow results, lists of dicts, one-row summaries.

Every query goes through :func:`kvtrace.store.reader.query`, which re-lists the trace directory
and retries when a file the connection listed has been swept meanwhile.
"""

from __future__ import annotations

import pyarrow as pa

from kvtrace.analysis.filters import SESSION_SCOPE, Filters, where
from kvtrace.analysis.pushdown import narrowed
from kvtrace.store.reader import query


def table(con, sql: str, params: dict | None = None) -> pa.Table:
    """Run ``sql`` with bound ``params`` and return the result as an Arrow table."""
    return query(con, sql, params)


def rows(con, sql: str, params: dict | None = None) -> list[dict]:
    return table(con, sql, params).to_pylist()


def one(con, sql: str, params: dict | None = None) -> dict:
    """The single row of an aggregate query (``{}`` if it returned none)."""
    out = rows(con, sql, params)
    return out[0] if out else {}


def filtered(con, sql: str, filters: Filters | None, scope: dict[str, str], **params) -> pa.Table:
    """``sql`` with its ``{where}`` filled from ``filters`` (the fragments of ``scope``), run with the
    filters' parameters and ``params``."""
    clause, bound = where(filters, scope)
    if scope is SESSION_SCOPE:
        con = narrowed(con, filters)
    return table(con, sql.format(where=clause), {**bound, **params})
