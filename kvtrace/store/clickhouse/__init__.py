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

__all__ = ["INSERT_PARQUET", "TABLE", "TRACES_TABLE_DDL", "insert_parquet", "render"]
