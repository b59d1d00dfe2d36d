"""Rewriting a sidecar of a trace file (scan index, lookup, partial) with one column set to a value,
to show what a reader reads from it.  Through DuckDB, which wrote it: sidecars use Parquet's version 2
encodings, which pyarrow before 17 cannot always read (``BYTE_STREAM_SPLIT`` pages of nulls)."""

from __future__ import annotations

import os

import duckdb

from kvtrace.store.lookup import COPY_OPTIONS
from kvtrace.store.sql import literal


def set_column(path: str, column: str, value: str) -> None:
    """Rewrite sidecar ``path`` in place with every row's ``column`` (a VARCHAR) set to ``value``."""
    tmp = f"{path}.rewrite"
    con = duckdb.connect()
    try:
        con.execute(
            f"COPY (SELECT * REPLACE ({literal(value)}::VARCHAR AS {column}) FROM read_parquet({literal(path)})) "
            f"TO {literal(tmp)} {COPY_OPTIONS}"
        )
    finally:
        con.close()
    os.replace(tmp, path)
