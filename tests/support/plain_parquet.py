"""What readers other than kvtrace's see in a trace directory: a plain recursive glob.

:func:`counts` reads ``DIR`` with DuckDB ``read_parquet('DIR/**/*.parquet')``, pyarrow's
``dataset(DIR)`` and chDB's ``file('DIR/**/*.parquet', Parquet)`` and returns each one's
(rows, distinct span ids).  A directory at rest must give ``(n, n)`` for all three.
"""

from __future__ import annotations

import os

import duckdb
import pyarrow.compute as pc
import pyarrow.dataset as ds


def counts(directory) -> dict[str, tuple[int, int]]:
    root = os.path.abspath(os.fspath(directory))
    pattern = os.path.join(root, "**", "*.parquet")
    out = {}
    con = duckdb.connect()
    out["duckdb"] = con.execute(
        "SELECT count(*), count(DISTINCT SpanId) FROM read_parquet($p)", {"p": pattern}
    ).fetchone()
    ids = ds.dataset(root, format="parquet").to_table(columns=["SpanId"])["SpanId"]
    out["pyarrow"] = (len(ids), len(pc.unique(ids)))
    import chdb

    from kvtrace.store.sql import CLICKHOUSE, literal

    text = (
        chdb.query(f"SELECT count(), uniqExact(SpanId) FROM file({literal(pattern, CLICKHOUSE)}, Parquet)", "CSV")
        .bytes()
        .decode()
    )
    rows, distinct = (int(v) for v in text.strip().split(","))
    out["chdb"] = (rows, distinct)
    return out


def exact(directory, n: int) -> bool:
    """Every plain reader counts ``n`` rows, ``n`` distinct spans."""
    return set(counts(directory).values()) == {(n, n)}
