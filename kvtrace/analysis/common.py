"""Running named queries: Arrow results, lists of dicts, one-row summaries."""

from __future__ import annotations

import pyarrow as pa


def table(con, sql: str, params: dict | None = None) -> pa.Table:
    """Run ``sql`` with bound ``params`` and return the result as an Arrow table."""
    return con.sql(sql, params=params or None).to_arrow_table()


def rows(con, sql: str, params: dict | None = None) -> list[dict]:
    return table(con, sql, params).to_pylist()


def one(con, sql: str, params: dict | None = None) -> dict:
    """The single row of an aggregate query (``{}`` if it returned none)."""
    out = rows(con, sql, params)
    return out[0] if out else {}
