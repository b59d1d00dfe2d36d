"""The collector's bounded span queue and its writer thread.

The OTLP receivers (:mod:`~kvtrace.collect.grpc_server`, :mod:`~kvtrace.collect.http_server`)
convert each request to an Arrow table and :meth:`SpanQueue.offer` it; the request is answered
"accepted" once the table is queued.  A single writer thread concatenates whatever is queued
(group batching: under load one Parquet file holds many requests) and writes it through a
:class:`~kvtrace.collect.sink.TableSink` (atomic files, so no reader ever sees a partial one).

The queue is bounded in spans.  When an offer would exceed the bound, ``offer`` returns False and
the receiver answers "retry later" (gRPC UNAVAILABLE + RetryInfo, HTTP 503 + Retry-After), as
the OTLP specification asks of an overloaded server.  A failed write keeps its rows queued and is
retried after a back-off, so a full disk turns into back-pressure rather than loss.
:meth:`SpanQueue.close` stops accepting, drains everything queued and returns.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass

import pyarrow as pa

log = logging.getLogger(__name__)


@dataclass
class QueueStats:
    accepted_spans: int = 0
    written_spans: int = 0
    refused_requests: int = 0
    write_failures: int = 0
    lost_spans: int = 0


class SpanQueue:
    """Bounded (in spans) queue of SCHEMA tables drained by one writer thread into ``sink``."""

    def __init__(
        self,
        sink,
        *,
        max_spans: int,
        max_batch_spans: int = 65536,
        batch_delay_s: float = 0.2,
        retry_delay_s: float = 1.0,
        close_retries: int = 3,
    ) -> None:
        if max_spans < 1:
            raise ValueError("max_spans must be >= 1")
        self.sink = sink
        self.max_spans = max_spans
        self.max_batch_spans = max_batch_spans
        self.batch_delay_s = batch_delay_s
        self.retry_delay_s = retry_delay_s
        self.close_retries = close_retries
        self.stats = QueueStats()
        self._items: deque[pa.Table] = deque()
        self._queued = 0  # spans queued or being written
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="kvtrace-collect-writer", daemon=True)
        self._thread.start()

    @property
    def queued_spans(self) -> int:
        return self._queued

    def offer(self, table: pa.Table) -> bool:
        """Queue ``table``; False when closed or when it would overflow the bound (retry later).

        A table larger than the whole bound is still taken when the queue is empty, so one
        oversized request cannot be refused forever."""
        n = table.num_rows
        with self._cond:
            if self._closed or (self._queued and self._queued + n > self.max_spans):
                self.stats.refused_requests += 1
                return False
            if n:
                self._items.append(table)
                self._queued += n
                self.stats.accepted_spans += n
                self._cond.notify_all()
        return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything offered so far is written (or given up); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._queued == 0, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Refuse new offers, drain the queue, stop the writer; idempotent. False on timeout."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- writer thread -------------------------------------------------------------------
    def _take(self) -> list[pa.Table] | None:
        with self._cond:
            self._cond.wait_for(lambda: self._items or self._closed)
            if not self._items:
                return None  # closed and drained
            if not self._closed and self.batch_delay_s > 0:
                self._cond.wait_for(lambda: self._closed or self._queued >= self.max_batch_spans,
                                    self.batch_delay_s)
            batch, spans = [], 0
            while self._items and (not batch or spans + self._items[0].num_rows <= self.max_batch_spans):
                table = self._items.popleft()
                batch.append(table)
                spans += table.num_rows
            return batch

    def _run(self) -> None:
        failures = 0
        while True:
            batch = self._take()
            if batch is None:
                return
            n = sum(t.num_rows for t in batch)
            try:
                self.sink.write_table(pa.concat_tables(batch))
            except Exception as exc:
                failures += 1
                self.stats.write_failures += 1
                log.error("kvtrace collect: writing %d spans failed (%s); will retry", n, exc,
                          exc_info=failures == 1)
                if self._closed and failures > self.close_retries:
                    self._done(n, lost=True)
                    continue
                with self._cond:
                    self._items.extendleft(reversed(batch))
                    self._cond.wait_for(lambda: self._closed, self.retry_delay_s)
                continue
            failures = 0
            self._done(n, lost=False)

    def _done(self, n: int, *, lost: bool) -> None:
        with self._cond:
            self._queued -= n
            if lost:
                self.stats.lost_spans += n
                log.error("kvtrace collect: gave up on %d spans at shutdown", n)
            else:
                self.stats.written_spans += n
            self._cond.notify_all()
