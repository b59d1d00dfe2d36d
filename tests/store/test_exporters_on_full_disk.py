"""The Parquet exporters on a full disk: the host keeps going, the loss is counted as
``kvtrace_dropped_spans{reason=write_failed}``, logged once per episode, and writing resumes by
itself when space returns.

Both exporters (in-process :class:`ParquetSpanExporter` and :class:`WriterProcessExporter`) run
under :func:`kvtrace.telemetry.configure` as the proxy, the simulator and the connector use them.
A 3 MiB tmpfs mounted in the test is the real full disk (skipped with the reason when mounting is
refused); a file standing where a partition directory must go (an OSError from the filesystem,
no mount needed) and an injected ENOSPC on ``write_atomic`` always run.
"""

from __future__ import annotations

import errno
import logging
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from opentelemetry.sdk.trace.export import SpanExportResult

from kvtrace import semconv as sc
from kvtrace import telemetry
from kvtrace.store import files, writer
from kvtrace.store.exporter import ParquetSpanExporter

from support.disk import fill


def turn_indexes(traces) -> list[int]:
    """``TURN_INDEX`` of every stored row (duplicates kept), sorted."""
    out: list[int] = []
    for path in files.list_files(traces) if os.path.isdir(traces) else []:
        attrs = pq.read_table(path, columns=["SpanAttributesInt"], partitioning=None).column(0).to_pylist()
        out += [dict(a)[sc.TURN_INDEX] for a in attrs]
    return sorted(out)


class Host:
    """A provider configured as a kvtrace process's, exporting only when flushed."""

    def __init__(self, traces, writer_process: bool, monkeypatch) -> None:
        monkeypatch.setenv("KVTRACE_BATCH_DELAY_MS", "600000")
        monkeypatch.setenv("KVTRACE_MIN_FREE_MIB", "0")  # a 3 MiB disk: the default keeps 64 MiB free
        self.provider = telemetry.configure(
            "full-disk", traces_dir=traces, otlp=False, handle_sigterm=False, writer_process=writer_process
        )
        (processor,) = self.provider._active_span_processor._span_processors
        self.exporter = processor.span_exporter
        self.tracer = self.provider.get_tracer("t")

    def emit(self, first: int, n: int) -> bool:
        """End ``n`` spans (turn indexes first..first+n-1) and flush them; never raises."""
        for i in range(first, first + n):
            self.tracer.start_span(sc.SPAN_AGENT_TURN, attributes={sc.TURN_INDEX: i}).end()
        return self.provider.force_flush(120_000)


def dropped(reason: str) -> int:
    return telemetry.dropped_spans().get(reason, 0)


@pytest.mark.parametrize("writer_process", [False, True], ids=["in-process", "writer-process"])
def test_a_full_tmpfs_drops_counted_spans_and_resumes_when_space_returns(small_disk, monkeypatch, writer_process):
    traces = small_disk / "t"
    host = Host(traces, writer_process, monkeypatch)
    assert host.emit(0, 10)
    ballast = fill(small_disk)
    before = (dropped(sc.DROP_WRITE_FAILED), dropped(sc.DROP_EXPORT_FAILED))
    for batch in range(3):  # each flush is one failed export; nothing raises into the host
        host.emit(100 + 10 * batch, 10)
    assert (dropped(sc.DROP_WRITE_FAILED), dropped(sc.DROP_EXPORT_FAILED)) == (before[0] + 30, before[1])
    assert host.exporter.failure_reason == sc.DROP_WRITE_FAILED
    pid = getattr(host.exporter, "writer_pid", None)
    os.unlink(ballast)
    assert host.emit(200, 5)
    assert getattr(host.exporter, "writer_pid", None) == pid  # the writer process was never replaced
    host.provider.shutdown()
    assert turn_indexes(traces) == list(range(10)) + list(range(200, 205))
    assert not [n for _, _, names in os.walk(traces) for n in names if n.startswith(".")]  # no tmp left


@pytest.mark.parametrize("writer_process", [False, True], ids=["in-process", "writer-process"])
def test_an_unwritable_partition_counts_write_failed_and_logs_once_per_episode(
    tmp_path, monkeypatch, caplog, writer_process
):
    traces = tmp_path / "t"
    host = Host(traces, writer_process, monkeypatch)
    part = traces / writer.partition_dir(time.time_ns() // writer.HOUR_NS)
    part.parent.mkdir(parents=True)
    part.write_text("a file where the hour's directory must go")
    before = dropped(sc.DROP_WRITE_FAILED)
    with caplog.at_level(logging.WARNING, logger="kvtrace.store.exporter"):
        for batch in range(3):
            host.emit(10 * batch, 4)
        assert dropped(sc.DROP_WRITE_FAILED) == before + 12
        part.unlink()
        assert host.emit(50, 2)
    if not writer_process:  # the writer process logs to its own stderr, the same two lines
        assert [(r.levelno, "dropping spans until a write succeeds" in r.getMessage()) for r in caplog.records] == [
            (logging.ERROR, True),
            (logging.WARNING, False),
        ]
        assert "works again after 3 failed batches (12 spans dropped)" in caplog.records[1].getMessage()
    host.provider.shutdown()
    assert turn_indexes(traces) == [50, 51]


def _two_hour_table() -> pa.Table:
    """Four spans named n0..n3, two in one hour partition and two in the next."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from kvtrace.collect.otlp_convert import request_to_table

    hour = 1_700_000_000_000_000_000 // writer.HOUR_NS * writer.HOUR_NS
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    for i, start in enumerate((hour, hour + 1, hour + writer.HOUR_NS, hour + writer.HOUR_NS + 1)):
        span = ss.spans.add(name=f"n{i}", start_time_unix_nano=start, end_time_unix_nano=start + 1000)
        span.trace_id, span.span_id = (i + 1).to_bytes(16, "big"), (i + 1).to_bytes(8, "big")
    table, rejected, _ = request_to_table(req)
    assert rejected == 0 and len(writer.split_by_partition(table)) == 2
    return table


def test_a_batch_over_two_partitions_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """ENOSPC on the second partition's file: the first's is removed too, so the collector's retry
    of the whole batch stores every span once."""
    real = writer.write_atomic
    calls: list[str] = []

    def second_fails(rows, directory, name, **kw):
        calls.append(directory)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(rows, directory, name, **kw)

    monkeypatch.setattr(writer, "write_atomic", second_fails)
    exporter = ParquetSpanExporter(tmp_path)
    table = _two_hour_table()
    assert exporter.export_table(table) is SpanExportResult.FAILURE
    assert len(calls) == 2 and files.list_files(tmp_path) == []
    assert (exporter.failure_reason, exporter.failed_spans, exporter.spans_written) == (sc.DROP_WRITE_FAILED, 4, 0)
    assert exporter.export_table(table) is SpanExportResult.SUCCESS
    exporter.shutdown()
    names = [pq.read_table(p, partitioning=None)["SpanName"].to_pylist() for p in files.list_files(tmp_path)]
    assert sorted(sum(names, [])) == ["n0", "n1", "n2", "n3"]


def test_merges_failing_on_a_nearly_full_disk_are_logged_once_and_keep_the_batch_files(tmp_path, monkeypatch, caplog):
    """Batches still fit but segments do not: every export tries the roll; one warning per episode,
    every span stays readable in its batch file, and the roll succeeds once space returns."""
    real, full = writer.merge, [True]

    def merge(*args, **kwargs):
        if full[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, **kwargs)

    monkeypatch.setattr(writer, "merge", merge)
    exporter = ParquetSpanExporter(tmp_path, roll_bytes=1, grace_seconds=0)
    table = _two_hour_table()
    with caplog.at_level(logging.WARNING, logger="kvtrace.store.exporter"):
        for _ in range(3):
            assert exporter.export_table(table) is SpanExportResult.SUCCESS
        messages = [r.getMessage() for r in caplog.records]
        assert messages == [
            f"kvtrace: rolling Parquet files in {tmp_path} failed: [Errno 28] No space left on device "
            "(batch files kept; retried on later exports)"
        ]
        assert len(files.list_files(tmp_path)) == 6  # 3 batches x 2 partitions, none merged
        full[0] = False
        assert exporter.export_table(table) is SpanExportResult.SUCCESS
    assert len(caplog.records) == 1
    exporter.shutdown()
    names = [pq.read_table(p, partitioning=None)["SpanName"].to_pylist() for p in files.list_files(tmp_path)]
    assert len(names) == 2 and sorted(sum(names, [])) == sorted(["n0", "n1", "n2", "n3"] * 4)  # one segment each


def test_a_batch_that_would_not_fit_above_the_reserve_is_dropped_before_any_write(tmp_path, monkeypatch):
    """The admission (#42): with less free space than the reserve plus the batch's estimate, the
    batch is counted as write_failed and nothing is written (no write is even tried); once the
    disk reports room again the next batch is written."""
    from types import SimpleNamespace

    from kvtrace.store.diskspace import DiskSpace

    free = {"blocks": 256}  # 1 MiB of 4 KiB blocks
    space = DiskSpace(
        tmp_path,
        min_free_bytes=1 << 20,
        refresh_s=3600,
        statvfs=lambda _path: SimpleNamespace(f_bavail=free["blocks"], f_frsize=4096),
    )
    calls: list[str] = []
    real = writer.write_atomic
    monkeypatch.setattr(writer, "write_atomic", lambda rows, d, n, **kw: calls.append(d) or real(rows, d, n, **kw))
    exporter = ParquetSpanExporter(tmp_path, space=space)
    table = _two_hour_table()
    assert exporter.export_table(table) is SpanExportResult.FAILURE
    assert (exporter.failure_reason, exporter.failed_spans, exporter.spans_written) == (sc.DROP_WRITE_FAILED, 4, 0)
    assert calls == [] and files.list_files(tmp_path) == []
    assert space.health()["refusals"] == 1 and space.health()["reserved_bytes"] == 0
    free["blocks"] = 1024  # 4 MiB: room above the reserve; the refusal re-reads the disk at once
    assert exporter.export_table(table) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert len(calls) == 2 and space.health()["reserved_bytes"] == 0
    names = [pq.read_table(p, partitioning=None)["SpanName"].to_pylist() for p in files.list_files(tmp_path)]
    assert sorted(sum(names, [])) == ["n0", "n1", "n2", "n3"]
