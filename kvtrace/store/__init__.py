"""kvtrace.store: the Parquet trace store, its views, and the one way to read it.

Writing: the schema (the OTel Collector ClickHouse exporter's ``otel_traces`` columns plus typed
attribute maps, :mod:`.schema`), span-to-Arrow conversion (:mod:`.convert`), the ``SpanExporter``
that writes atomic batch files and rolled segments (:mod:`.exporter`, :mod:`.writer`,
:mod:`.files`) and clean-up of what stopped writers left (:mod:`.compact`).  Reading:
:func:`connect` (:mod:`.reader`) opens one run of a trace directory (:mod:`.runs`) with every view
of the registry (:mod:`.views`, documented in docs/query.md), the breakdown's scan read from per-file
indexes where built (:mod:`.scan_index`); ``kvtrace query`` (:mod:`.cli`).
All SQL quoting goes through :mod:`.sql`; the ClickHouse statements live in :mod:`.clickhouse`.
"""

from __future__ import annotations


def connect(directory, *, allow_empty: bool = False, con=None, read_only: bool = False, scan_index: bool = True):
    """A DuckDB connection over one run of ``directory`` with every kvtrace view defined
    (see :func:`kvtrace.store.reader.connect`; imports DuckDB only when called)."""
    from kvtrace.store.reader import connect as _connect

    return _connect(directory, allow_empty=allow_empty, con=con, read_only=read_only, scan_index=scan_index)
