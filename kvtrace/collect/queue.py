"""The collector's bounded span queue and its writer thread.

The OTLP receivers (:mod:`~kvtrace.collect.grpc_server`, :mod:`~kvtrace.collect.http_server`)
convert each request to an Arrow table and :meth:`SpanQueue.offer` it.  A single writer thread
concatenates whatever is queued (group batching: under load one Parquet file holds many
requests) and writes it through a :class:`~kvtrace.collect.sink.TableSink` (atomic files, so no
reader ever sees a partial one).

When is a request acknowledged?

- default: once its table is queued.  The writer waits up to ``batch_delay_s`` for company, then
  writes; a crash of the process (SIGKILL, OOM kill) loses what is queued or being written at
  that moment.
- durable (``offer(table, durable=True)``, ``kvtrace collect --durable-ack``): ``offer`` returns
  a future that the writer resolves once the batch holding the table is in an fsynced file (the
  receiver answers only then), or fails when the write fails (the receiver answers "retry
  later"; the rows are dropped, the sender resends them).  The writer starts as soon as anything
  is queued (no ``batch_delay_s``): requests arriving while a file is written share the next one.

Nothing is queued that the disk cannot take: ``offer`` reserves the table's estimated bytes (as
they will be written: the compression ratio the sink has seen so far) in the sink's
:class:`~kvtrace.store.diskspace.DiskSpace` (the disk's free space less ``--min-free-mib``, less
what is already reserved), and refuses ("retry later") when they do not fit; the reservation is
held until the table is written (or given up).  So a full disk is met by refusals before any
span is acknowledged, in both modes, and the queue never holds acknowledged spans it cannot
store, unless someone else fills the disk between two readings (below).

When a write fails (a full disk, an I/O error) the queue is *unwritable* until a write succeeds
again: every offer is refused ("retry later"), so nothing more is acknowledged than the memory
already holding it, and nothing acknowledged is dropped: the failed batch's acknowledged rows are
queued again and retried after a back-off that doubles from ``retry_delay_s`` up to
``max_retry_delay_s``.  In durable mode the failed rows are the senders' to resend, so the queue is
empty; once the back-off has passed one offer is let through as the probe (the others are still
refused while it is written).  The first failure and the recovery are logged once per episode;
:attr:`QueueStats` counts the refusals.  :meth:`close` keeps retrying a failing write for
``close_timeout_s``, and only then gives up on what is queued (logged, counted as lost).

The queue is bounded in spans and in bytes (Arrow buffer sizes).  When an offer would exceed
either bound, ``offer`` refuses and the receiver answers "retry later" (gRPC UNAVAILABLE +
RetryInfo, HTTP 503 + Retry-After), as the OTLP specification asks of an overloaded server.
:meth:`SpanQueue.close` stops accepting, drains everything queued and returns.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.compute as pc

from kvtrace.store.diskspace import DiskSpace
from kvtrace.store.writer import HOUR_NS

log = logging.getLogger(__name__)


@dataclass
class QueueStats:
    accepted_spans: int = 0
    written_spans: int = 0
    refused_requests: int = 0  # every refusal: queue full, closing, unwritable
    refused_spans: int = 0
    unwritable_refused_requests: int = 0  # refused because writes were failing (part of the above)
    unwritable_refused_spans: int = 0
    write_failures: int = 0
    unwritable_episodes: int = 0  # runs of failed writes ended by a success (or still going)
    lost_spans: int = 0  # acknowledged spans given up on at close (the disk never took them)
    failed_durable_spans: int = 0  # durable offers whose write failed (senders told to retry)
    disk_refused_requests: int = 0  # refused: would not fit in the free disk space (part of refused_*)
    disk_refused_spans: int = 0


@dataclass(frozen=True)
class Refused:
    """What :meth:`SpanQueue.offer` returns for a refused table (falsy): why, and when to retry."""

    reason: str
    retry_after_s: int = 1

    def __bool__(self) -> bool:
        return False


@dataclass
class _Item:
    table: pa.Table
    nbytes: int
    done: Future | None
    reserved: int = 0  # bytes of the sink's DiskSpace held until the item is written or given up


def _partitions(table: pa.Table) -> int:
    """Most hour partitions (one batch file each) ``table``'s spans can fall into."""
    lo, hi = pc.min_max(table["Timestamp"]).values()
    return int(hi.cast(pa.int64()).as_py() // HOUR_NS - lo.cast(pa.int64()).as_py() // HOUR_NS) + 1


class SpanQueue:
    """Bounded (in spans and bytes) queue of SCHEMA tables drained by one writer thread into ``sink``."""

    def __init__(
        self,
        sink,
        *,
        max_spans: int,
        max_bytes: int = 256 << 20,
        max_batch_spans: int = 65536,
        max_batch_bytes: int = 64 << 20,
        batch_delay_s: float = 0.2,
        retry_delay_s: float = 0.25,
        max_retry_delay_s: float = 5.0,
        close_timeout_s: float = 30.0,
    ) -> None:
        if max_spans < 1 or max_bytes < 1:
            raise ValueError("max_spans and max_bytes must be >= 1")
        self.sink = sink
        self.max_spans, self.max_bytes = max_spans, max_bytes
        self.max_batch_spans, self.max_batch_bytes = max_batch_spans, max_batch_bytes
        self.batch_delay_s = batch_delay_s
        self.retry_delay_s, self.max_retry_delay_s = retry_delay_s, max_retry_delay_s
        self.close_timeout_s = close_timeout_s
        self.stats = QueueStats()
        self.space: DiskSpace | None = getattr(sink, "space", None)  # the sink's disk admission
        self.write_error: str | None = None  # set while writes fail (the queue refuses offers)
        self._failing_since = 0.0
        self._backoff = 0.0
        self._retry_at = 0.0
        self._close_deadline = math.inf
        self._items: deque[_Item] = deque()
        self._queued = 0  # spans queued or being written
        self._queued_bytes = 0
        self._durable = 0  # durable items queued: the writer does not wait for company
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="kvtrace-collect-writer", daemon=True)
        self._thread.start()

    @property
    def queued_spans(self) -> int:
        return self._queued

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    def retry_after_s(self) -> int:
        """Whole seconds a refused sender should wait: the back-off left while unwritable, else 1."""
        if self.write_error is None:
            return 1
        return max(1, min(math.ceil(self._retry_at - time.monotonic()), math.ceil(self.max_retry_delay_s)))

    def health(self) -> dict:
        """What ``GET /health`` reports: ``writing`` (or ``unwritable`` and why), queue and counters."""
        with self._cond:
            return {
                "status": "ok" if self.write_error is None else "unwritable",
                "write_error": self.write_error,
                "queued_spans": self._queued,
                "queued_bytes": self._queued_bytes,
                **asdict(self.stats),
                "disk": self.space.health() if self.space is not None else None,
            }

    def offer(self, table: pa.Table, *, durable: bool = False):
        """Queue ``table``.  Returns a (falsy) :class:`Refused` when closed, unwritable (module
        doc), when it would overflow a bound or not fit on the disk (retry later); otherwise True,
        or with ``durable`` a Future resolved once the table is in an fsynced file (exception:
        the write failed).

        A table larger than a whole bound is still taken when the queue is empty, so one
        oversized request cannot be refused forever (the disk's free space has no such exception)."""
        n, nbytes = table.num_rows, table.nbytes
        need = 0
        if self.space is not None and n and not self._closed:  # closed: refused, no schema check
            need = self.space.estimate(nbytes, _partitions(table))
        with self._cond:
            refused = self._refusal(n, nbytes, need)
            if refused is not None:
                self.stats.refused_requests += 1
                self.stats.refused_spans += n
                return refused
            done = Future() if durable else None
            if not n:
                if done is not None:
                    done.set_result(True)
                return done or True
            self._items.append(_Item(table, nbytes, done, need))
            self._queued += n
            self._queued_bytes += nbytes
            self._durable += durable
            self.stats.accepted_spans += n
            self._cond.notify_all()
        return done or True

    def _refusal(self, n: int, nbytes: int, need: int) -> Refused | None:
        """Why a table of ``n`` spans, ``nbytes`` Arrow bytes, ``need`` disk bytes cannot be queued
        now (None: it can, and its disk bytes are reserved); caller holds the lock."""
        if self._closed:
            return Refused("the collector is shutting down")
        if self._queued and (self._queued + n > self.max_spans or self._queued_bytes + nbytes > self.max_bytes):
            return Refused(f"queue full ({self._queued} spans, {self._queued_bytes} bytes queued)")
        if self.write_error is not None and (self._queued or time.monotonic() < self._retry_at):
            self.stats.unwritable_refused_requests += 1
            self.stats.unwritable_refused_spans += n
            return Refused(
                f"cannot write to the trace directory ({self.write_error}); no new spans are accepted until a "
                "write succeeds",
                self.retry_after_s(),
            )
        if need and self.space is not None and not self.space.reserve(need):
            self.stats.disk_refused_requests += 1
            self.stats.disk_refused_spans += n
            # spans being written give back what their estimate held beyond their files: soon
            return Refused(f"{self.space.describe()}", 1 if self._queued else math.ceil(self.max_retry_delay_s))
        return None

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything offered so far is written (or given up); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._queued == 0, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Refuse new offers, drain the queue (retrying a failing write for ``close_timeout_s``),
        stop the writer; idempotent. False on timeout."""
        with self._cond:
            if not self._closed:
                self._closed = True
                self._close_deadline = time.monotonic() + self.close_timeout_s
            self._cond.notify_all()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- writer thread -------------------------------------------------------------------
    def _take(self) -> list[_Item] | None:
        with self._cond:
            self._cond.wait_for(lambda: self._items or self._closed)
            if not self._items:
                return None  # closed and drained
            # while unwritable nothing new comes: no point waiting for company
            if not self._closed and self.batch_delay_s > 0 and not self._durable and self.write_error is None:
                self._cond.wait_for(
                    lambda: (
                        self._closed
                        or self._durable
                        or self._queued >= self.max_batch_spans
                        or self._queued_bytes >= self.max_batch_bytes
                    ),
                    self.batch_delay_s,
                )
            batch, spans, nbytes = [], 0, 0
            while self._items and (
                not batch
                or (
                    spans + self._items[0].table.num_rows <= self.max_batch_spans
                    and nbytes + self._items[0].nbytes <= self.max_batch_bytes
                )
            ):
                item = self._items.popleft()
                batch.append(item)
                spans += item.table.num_rows
                nbytes += item.nbytes
                self._durable -= item.done is not None
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            try:
                self.sink.write_table(pa.concat_tables([item.table for item in batch]))
            except Exception as exc:
                self._failed(batch, exc)
                continue
            self._done(batch, lost=False)

    def _failed(self, batch: list[_Item], exc: Exception) -> None:
        """Durable items are failed (their senders retry); the rest (acknowledged) are requeued
        and retried after the back-off, or given up on once closing and ``close_timeout_s`` spent."""
        n = sum(item.table.num_rows for item in batch)
        with self._cond:
            self.stats.write_failures += 1
            first = self.write_error is None
            self.write_error = str(exc) or type(exc).__name__
            if first:
                self._failing_since = time.monotonic()
                self.stats.unwritable_episodes += 1
                self._backoff = self.retry_delay_s
            else:
                self._backoff = min(self._backoff * 2, self.max_retry_delay_s)
            self._retry_at = time.monotonic() + self._backoff
        if first:  # once per episode, not per retry or per refused request
            log.error(
                "kvtrace collect: writing %d spans failed (%s); refusing new requests (retry later) until a "
                "write succeeds; the %d acknowledged spans queued are kept and retried",
                n,
                exc,
                self._queued - sum(item.table.num_rows for item in batch if item.done is not None),
                exc_info=True,
            )
        durable = [item for item in batch if item.done is not None]
        keep = [item for item in batch if item.done is None]
        if durable:
            self._done(durable, lost=False, error=exc)
        if not keep:
            return
        if self._closed and time.monotonic() >= self._close_deadline:
            self._done(keep, lost=True)
            return
        with self._cond:
            self._items.extendleft(reversed(keep))
            self._cond.wait_for(lambda: time.monotonic() >= min(self._retry_at, self._close_deadline), self._backoff)

    def _recovered(self) -> None:
        """The first write to succeed after failures ends the episode (caller holds the lock)."""
        if self.write_error is None:
            return
        log.warning(
            "kvtrace collect: writing again after %.1f s unwritable (%s); %d requests (%d spans) refused so far",
            time.monotonic() - self._failing_since,
            self.write_error,
            self.stats.unwritable_refused_requests,
            self.stats.unwritable_refused_spans,
        )
        self.write_error = None
        self._backoff = self._retry_at = 0.0

    def _done(self, batch: list[_Item], *, lost: bool, error: Exception | None = None) -> None:
        n = sum(item.table.num_rows for item in batch)
        with self._cond:
            self._queued -= n
            self._queued_bytes -= sum(item.nbytes for item in batch)
            if self.space is not None:  # written: the sink counted its files; else dropped
                self.space.release(sum(item.reserved for item in batch))
            if lost:
                self.stats.lost_spans += n
                log.error(
                    "kvtrace collect: gave up on %d acknowledged spans at shutdown: writes still failing after "
                    "%.0f s (%s)",
                    n,
                    self.close_timeout_s,
                    self.write_error,
                )
            elif error is not None:
                self.stats.failed_durable_spans += n
            else:
                self.stats.written_spans += n
                self._recovered()
            self._cond.notify_all()
        for item in batch:
            if item.done is not None:
                if error is None:
                    item.done.set_result(True)
                else:
                    item.done.set_exception(error)
