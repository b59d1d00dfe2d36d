"""Writing already-converted Arrow tables into a trace directory, the way kvtrace's exporter does.

``kvtrace collect`` converts OTLP requests to tables itself (:mod:`kvtrace.collect.otlp_convert`);
:class:`TableSink` is :class:`kvtrace.store.exporter.ParquetSpanExporter` (same file names, Hive
partitions, atomic tmp-then-rename writes, rolling and sweeping) with a raising table entry point,
so the collector's writer thread keeps the rows and retries when a write fails.  Its
:attr:`~kvtrace.store.exporter.ParquetSpanExporter.space` is the one the collector's queue admits
requests against (:class:`kvtrace.store.diskspace.DiskSpace`).
"""

from __future__ import annotations

import pyarrow as pa
from opentelemetry.sdk.trace.export import SpanExportResult

from kvtrace.store.exporter import ParquetSpanExporter


class TableSink(ParquetSpanExporter):
    """A ParquetSpanExporter that also takes SCHEMA tables (called by the collector's writer thread)."""

    def write_table(self, table: pa.Table) -> None:
        """Write ``table`` durably (one file per partition), then roll if due; raise on failure.
        Its disk space is already reserved in :attr:`space`: the queue admitted it."""
        if self._closed:
            raise RuntimeError("sink already shut down")
        if self.export_table(table, reserved=True) is not SpanExportResult.SUCCESS:
            # the exporter's own error (e.g. ENOSPC), so the collector can tell senders why
            raise self.last_error or OSError(f"writing {table.num_rows} spans to {self.directory} failed")
