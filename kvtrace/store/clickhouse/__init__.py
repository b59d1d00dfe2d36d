"""The ClickHouse path: every kvtrace view over the OTel Collector exporter's ``otel_traces`` table.

- :mod:`.ddl`: the exporter's table (its DDL), kvtrace's recommended additions, loading Parquet files;
- :mod:`.dialect`: kvtrace's DuckDB SQL transpiled to ClickHouse (SQLGlot plus kvtrace's rules);
- :mod:`.backend`: a server through clickhouse-connect (``http(s)://...``) or chDB in process
  (``chdb:PATH``);
- :mod:`.store`: :class:`~.store.ClickHouseStore`, the views as CTEs over the table, time bounds;
- :mod:`.load`: a trace directory into the table as the exporter would write it.

``kvtrace query|report|dashboard --clickhouse URL [--table otel_traces]`` open it through
:func:`kvtrace.store.open_store`; docs/clickhouse.md has the design and the figures.  Needs the
``clickhouse`` extra (``pip install 'kvtrace[clickhouse]'``: sqlglot, chdb, clickhouse-connect).
"""

from __future__ import annotations

from kvtrace.store.clickhouse.ddl import INSERT_PARQUET, TABLE, TRACES_TABLE_DDL, insert_parquet, render

CHDB_PREFIX = "chdb:"
"""``--clickhouse chdb:PATH``: chDB in process on the database directory ``PATH``."""


class ClickHouseError(Exception):
    """A ClickHouse source failed: not reachable, a statement refused, SQL not transpilable (one line)."""


__all__ = ["CHDB_PREFIX", "INSERT_PARQUET", "TABLE", "TRACES_TABLE_DDL", "ClickHouseError", "insert_parquet", "render"]
