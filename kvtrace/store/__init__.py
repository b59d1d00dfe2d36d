"""kvtrace.store: the Parquet trace store and every SQL view over it.

The schema (the OTel Collector ClickHouse exporter's ``otel_traces`` columns plus typed
attribute maps, :mod:`.schema`), span-to-Arrow conversion (:mod:`.convert`), the
``SpanExporter`` that writes atomic batch files and rolled segments (:mod:`.exporter`,
:mod:`.writer`, :mod:`.files`), the DuckDB views (:mod:`.views`) and ``kvtrace query``
(:mod:`.cli`).  Every reader of a trace directory opens it through this package.
"""
