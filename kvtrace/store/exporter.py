"""``ParquetSpanExporter``: the OTel SpanExporter that writes a kvtrace trace directory.

Installed by :func:`kvtrace.configure` under a ``BatchSpanProcessor``.  Durability design:

- every ``export()`` call writes its batch as one complete zstd Parquet file per Hive partition
  (``date=YYYY-MM-DD/hour=HH`` of the span start, UTC), via a dot-tmp name and an atomic rename
  to ``<writer>-b<seq>.parquet``; ``writer`` = host-pid-random, so any number of processes can
  write one directory.  When ``export`` returns SUCCESS the spans are in a complete file: a
  crash of the process loses at most the batch in flight, and SIGTERM (which flushes the
  processor) loses nothing exported.  The file is in the OS's page cache, not necessarily on
  disk: an OS crash or power loss can still lose the last seconds of files unless
  ``fsync=True`` (file data and directory entries are fsynced before ``export`` returns;
  ``kvtrace collect --durable-ack`` uses it).
- rolling: once a partition's own batch files reach ``roll_bytes`` or ``roll_seconds`` of age,
  they are merged into ``<writer>-s<first>-<last>.parquet`` (same atomic write).  The batch files
  it supersedes are hidden from kvtrace's reader by :func:`kvtrace.store.files.list_files` at once
  and deleted ``grace_seconds`` later (``KVTRACE_ROLL_GRACE_SECONDS``, default 5 s; a timer does it
  when no export comes), so a reader holding an older listing can finish.  That grace is the only
  time a plain ``**/*.parquet`` glob sees a span twice.  Merge or clean-up failures are logged;
  the batch files stay valid.
- at rest, plain Parquet: :meth:`shutdown` (also on SIGTERM, via :func:`kvtrace.configure`)
  rolls what is pending and deletes every superseded batch file in the partitions it wrote, at
  once.  What a killed writer left (superseded batch files, abandoned ``.tmp`` files) is swept from
  the whole directory by the next exporter's first export, or by ``kvtrace compact``.  A batch
  file is only ever deleted once a complete segment holding its spans exists.

Errors are returned as ``SpanExportResult.FAILURE`` with :attr:`ParquetSpanExporter.failure_reason`
(``write_failed`` when the directory refused the write: a full disk, an I/O error; else
``export_failed``), which :mod:`kvtrace.telemetry` counts as ``kvtrace_dropped_spans{reason}``;
nothing is ever raised into the SDK or the host process.  A batch is first admitted against
the disk's free space (:class:`~kvtrace.store.diskspace.DiskSpace`: statvfs less
``KVTRACE_MIN_FREE_MIB``, less what is admitted and not written yet): one that would not fit is
dropped the same way, ``write_failed``, without touching the disk, so spans never take the last
free bytes the host (or ``kvtrace collect``) needs; a roll likewise waits until its segment fits.
A failed export leaves nothing behind (a batch spanning two hour partitions is written whole or
not at all) and is logged once per
episode: at the first failure, and once more when a write succeeds again (with the count dropped
meanwhile), so a full disk is two lines, not one per batch.  One bad value never fails a batch:
text Arrow cannot store is escaped (:mod:`kvtrace.store.sanitise`), and should a batch still not
convert as a whole, it is converted span by span and only the spans that fail are dropped (both
logged, rate-limited).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from kvtrace import semconv as sc
from kvtrace import settings
from kvtrace.store import files, spancols, writer
from kvtrace.store.convert import columns_to_table, spans_to_table
from kvtrace.store.diskspace import DiskSpace, NoSpace
from kvtrace.store.sanitise import DROPPED_SPANS

log = logging.getLogger(__name__)

TMP_MAX_AGE_S = 3600.0
"""Abandoned ``.tmp`` files (from a writer that crashed mid-write) are swept after this."""


@dataclass
class _Pending:
    """One partition's batch files written since its last roll."""

    since: float
    seqs: list[int] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    size: int = 0


def writer_id() -> str:
    """``host-pid-random``: unique per process (and per exporter), safe in a file name."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class ParquetSpanExporter(SpanExporter):
    """Write exported spans into a Hive-partitioned Parquet trace directory (see module doc)."""

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        roll_bytes: int | None = None,
        roll_seconds: float | None = None,
        grace_seconds: float | None = None,
        fsync: bool = False,
        min_free_bytes: int | None = None,
        space: DiskSpace | None = None,
    ) -> None:
        self.directory = os.fspath(directory)
        self.fsync = fsync
        if min_free_bytes is None:
            min_free_bytes = int(settings.MIN_FREE_MIB.get()) << 20
        self.space = space or DiskSpace(
            self.directory, min_free_bytes=min_free_bytes, refresh_s=int(settings.DISK_REFRESH_MS.get()) / 1000
        )
        self.roll_bytes = int(settings.ROLL_BYTES.get(roll_bytes))
        self.roll_seconds = float(settings.ROLL_SECONDS.get(roll_seconds))
        self.grace_seconds = float(settings.ROLL_GRACE_SECONDS.get(grace_seconds))
        self._lock = threading.Lock()
        self._closed = False
        self._failures = 0  # failed exports in a row (the episode logged once)
        self._roll_failing = False
        self._episode_spans = 0
        self.spans_written = 0
        self.failed_spans = 0  # spans of failed exports, ever
        self.failure_reason: str | None = None  # a DROP_* reason of the last failed export
        self.last_error: Exception | None = None  # and its exception
        self._reset_writer()

    def _reset_writer(self) -> None:
        """New identity; also after a fork, so parent and child never share file names."""
        self._pid = os.getpid()
        self.writer = writer_id()
        self._seq = 0
        self._pending: dict[str, _Pending] = {}
        self._sweep_due: list[tuple[float, str]] = []  # (when, partition dir), one per merge
        self._dirs: set[str] = set()  # partition dirs written
        self._timer: threading.Timer | None = None
        self._swept_tree = False

    # -- SpanExporter interface ------------------------------------------------------------
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Write ``spans`` durably (one file per partition), then roll/sweep if due."""
        if not spans:
            return SpanExportResult.FAILURE if self._closed else SpanExportResult.SUCCESS
        return self._export(len(spans), lambda: _to_table(spans))

    def export_table(self, table: pa.Table, *, reserved: bool = False) -> SpanExportResult:
        """Like :meth:`export`, for rows already in :data:`kvtrace.store.schema.SCHEMA`
        (``kvtrace collect`` converts OTLP requests itself).  ``reserved``: the caller already
        holds :attr:`space` for the table (the collector's queue admitted it), so it is written
        without being admitted again."""
        if table.num_rows == 0:
            return SpanExportResult.FAILURE if self._closed else SpanExportResult.SUCCESS
        return self._export(table.num_rows, lambda: table, reserved=reserved)

    def _export(self, count: int, make_table, *, reserved: bool = False) -> SpanExportResult:
        if self._closed:
            log.warning("kvtrace: Parquet exporter already shut down; dropping %d spans", count)
            self.failure_reason, self.last_error = sc.DROP_EXPORT_FAILED, None
            return SpanExportResult.FAILURE
        with self._lock:
            if os.getpid() != self._pid:
                self._reset_writer()
            try:
                table = make_table()
            except Exception as exc:
                return self._failed(count, exc, sc.DROP_EXPORT_FAILED)
            try:
                parts = writer.split_by_partition(table)
                need = 0 if reserved else self.space.estimate(table.nbytes, len(parts))
                if need and not self.space.reserve(need):
                    raise NoSpace(errno.ENOSPC, self.space.describe())
                try:
                    self._write_table(table, parts)
                finally:
                    self.space.release(need)
            except Exception as exc:
                return self._failed(count, exc, sc.DROP_WRITE_FAILED if isinstance(exc, OSError) else None)
            self._recovered()
            self._maintain(force=False)
        return SpanExportResult.SUCCESS

    def _failed(self, count: int, exc: Exception, reason: str | None) -> SpanExportResult:
        """Count and report a failed export: one log line per episode (a run of failures ended
        by a success), not per batch: a full disk fails every batch until space returns."""
        self.failure_reason = reason or sc.DROP_EXPORT_FAILED
        self.last_error = exc
        self.failed_spans += count
        self._failures += 1
        if self._failures == 1:
            self._episode_spans = 0
            log.error(
                "kvtrace: Parquet export of %d spans to %s failed: %s; dropping spans until a write succeeds "
                "(counted as kvtrace_dropped_spans{reason=%s})",
                count,
                self.directory,
                exc,
                self.failure_reason,
                exc_info=True,
            )
        self._episode_spans += count
        return SpanExportResult.FAILURE

    def _recovered(self) -> None:
        if self._failures:
            log.warning(
                "kvtrace: Parquet export to %s works again after %d failed batches (%d spans dropped)",
                self.directory,
                self._failures,
                self._episode_spans,
            )
            self._failures = 0

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered here: every successful export is already on disk."""
        return True

    def shutdown(self) -> None:
        """Roll every partition's pending batch files into segments and delete every batch file a
        segment supersedes in the partitions written (leaving plain Parquet); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if os.getpid() == self._pid:
                self._maintain(force=True)

    # -- internals -------------------------------------------------------------------------
    def _write_table(self, table: pa.Table, parts: list[tuple[str, pa.Table]]) -> None:
        """All of ``table`` (split in ``parts``) or none of it: should one partition's file fail
        (full disk), the files already written for the others are removed, so a caller that
        retries (``kvtrace collect``) never stores a span twice."""
        written: list[tuple[str, int, str, int]] = []  # (partition, seq, path, bytes)
        try:
            for part, rows in parts:
                self._seq += 1
                directory = os.path.join(self.directory, part)
                name = files.batch_name(self.writer, self._seq)
                size = writer.write_atomic(rows, directory, name, fsync=self.fsync)
                written.append((part, self._seq, os.path.join(directory, name), size))
        except BaseException:
            for _, _, path, _ in written:
                writer.unlink_quietly(path)
            raise
        self.space.wrote(sum(w[3] for w in written), len(written), table.nbytes)
        for part, seq, path, size in written:
            pending = self._pending.setdefault(part, _Pending(since=time.monotonic()))
            pending.seqs.append(seq)
            pending.paths.append(path)
            pending.size += size
            self._dirs.add(os.path.dirname(path))
        self.spans_written += table.num_rows

    def _maintain(self, *, force: bool) -> None:
        """Roll due partitions and delete superseded files whose grace has passed (all of them when
        ``force``: shutdown); never raises."""
        try:
            if not self._swept_tree:  # a killed writer's leftovers, anywhere in the directory
                self._swept_tree = True
                files.sweep_tree(self.directory, superseded_age_s=self.grace_seconds, tmp_age_s=TMP_MAX_AGE_S)
            now = time.monotonic()
            for part in list(self._pending):
                pending = self._pending[part]
                if force or pending.size >= self.roll_bytes or now - pending.since >= self.roll_seconds:
                    self._roll(part, pending, force=force)
            if force:
                for directory in self._dirs:
                    files.sweep(directory, superseded_age_s=0.0, tmp_age_s=TMP_MAX_AGE_S)
                self._sweep_due = []
                return
            due = {d for when, d in self._sweep_due if now >= when}
            for directory in due:
                files.sweep(directory, superseded_age_s=self.grace_seconds, tmp_age_s=TMP_MAX_AGE_S)
            self._sweep_due = [(when, d) for when, d in self._sweep_due if now < when]
            if self._sweep_due:
                self._schedule(min(when for when, _ in self._sweep_due) - now)
        except Exception as exc:  # the batch files stay valid; retry on the next export
            if not self._roll_failing:  # once per episode: a nearly full disk fails every merge
                log.warning(
                    "kvtrace: rolling Parquet files in %s failed: %s (batch files kept; retried on later exports)",
                    self.directory,
                    exc,
                    exc_info=True,
                )
            self._roll_failing = True
            return
        self._roll_failing = False

    def _schedule(self, delay: float) -> None:
        """Run :meth:`_maintain` again after ``delay`` s even if no export comes (an idle writer's
        superseded files still go after their grace)."""
        if self._timer is not None and self._timer.is_alive():
            return
        self._timer = threading.Timer(max(delay, 0.0) + 0.01, self._on_timer)
        self._timer.daemon = True
        self._timer.start()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            if not self._closed and os.getpid() == self._pid:
                self._maintain(force=False)

    def _roll(self, part: str, pending: _Pending, *, force: bool) -> None:
        """Merge the partition's pending batch files (a lone file is already its own segment:
        it waits for company, or at shutdown simply stays)."""
        if len(pending.paths) < 2:
            if force:
                del self._pending[part]
            return
        directory = os.path.join(self.directory, part)
        name = files.segment_name(self.writer, pending.seqs[0], pending.seqs[-1])
        # a segment is at most its batch files' size, and they stay until the grace has passed:
        # merging into space admitted to spans not written yet could fail their write
        if not self.space.reserve(pending.size):
            raise NoSpace(errno.ENOSPC, f"no room to merge {pending.size} bytes: {self.space.describe()}")
        try:
            self.space.wrote(writer.merge(pending.paths, directory, name, fsync=self.fsync))
        finally:
            self.space.release(pending.size)
        del self._pending[part]
        self._sweep_due.append((time.monotonic() + self.grace_seconds, directory))


def _to_table(spans: Sequence[ReadableSpan]) -> pa.Table:
    """:func:`spans_to_table`, salvaging what converts (:func:`salvage_table`)."""
    return salvage_table(spans, spans_to_table, lambda s, lo, hi: s[lo:hi], len, lambda s: getattr(s[0], "name", "?"))


def columns_table(cols: spancols.SpanColumns) -> pa.Table:
    """:func:`~kvtrace.store.convert.columns_to_table`, salvaging what converts (the writer
    process of :mod:`kvtrace.store.writer_process` uses it)."""
    return salvage_table(cols, columns_to_table, spancols.cut, spancols.size, lambda c: c.names[0])


def salvage_table(batch, convert: Callable, cut: Callable, size: Callable, name: Callable) -> pa.Table:
    """``convert(batch)``; should the batch not convert as a whole, its halves (``cut(batch, lo,
    hi)``) are tried, recursively, so only the spans that fail on their own are dropped (and
    reported, naming the first by ``name(one_span_batch)``)."""
    try:
        return convert(batch)
    except Exception as exc:
        if size(batch) == 1:
            raise
        first = exc
    failed: list[str] = []

    def halves(part) -> list[pa.Table]:
        n = size(part)
        mid = n // 2
        out = []
        for lo, hi in ((0, mid), (mid, n)):
            piece = cut(part, lo, hi)
            try:
                out.append(convert(piece))
            except Exception as exc:
                if hi - lo == 1:
                    failed.append(f"span {name(piece)!r}: {type(exc).__name__}: {exc}")
                else:
                    out += halves(piece)
        return out

    tables = halves(batch)
    if not tables:
        raise first
    if failed:
        DROPPED_SPANS.note(len(failed), failed[0])
    return pa.concat_tables(tables)
