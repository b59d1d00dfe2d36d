"""``Collector``: OTLP gRPC + HTTP receivers feeding one bounded queue into a Parquet trace directory.

Used by ``kvtrace collect`` (:mod:`kvtrace.cli.collect`), the tests and the benchmark.  Lifecycle:
:meth:`Collector.start` checks the trace directory is writable (:func:`kvtrace.store.access.ensure_writable`)
and binds the listeners (port 0 = any free port; the bound ports are in ``grpc_port`` /
``http_port``); :meth:`Collector.stop` is the graceful shutdown: listeners stop accepting and
finish in-flight requests, the queue is drained into Parquet, the writer rolls its files;
idempotent.

Memory is bounded three ways: each request body (after decompression) by ``max_request_bytes``,
all requests being read or converted together by ``max_inflight_bytes``
(:mod:`kvtrace.collect.limits`), and converted spans waiting for the writer by
``max_queue_spans`` and ``max_queue_bytes`` (:mod:`kvtrace.collect.queue`).  ``durable_ack``:
requests are answered only once their spans are in an fsynced file.  A write that fails (full
disk) makes the queue refuse new requests until a write succeeds (:mod:`kvtrace.collect.queue`);
``drain_timeout_s`` bounds how long :meth:`Collector.stop` keeps retrying such a write.
Before that, a request whose spans would not fit in the disk's free space less ``min_free_bytes``
(default ``KVTRACE_MIN_FREE_MIB``) is refused ("retry later") and never acknowledged.
"""

from __future__ import annotations

import logging
import os

from kvtrace.collect import grpc_server
from kvtrace.collect.http_server import HTTPReceiver
from kvtrace.collect.limits import ByteBudget
from kvtrace.collect.queue import SpanQueue
from kvtrace.collect.sink import TableSink
from kvtrace.store.access import ensure_writable

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE_SPANS = 200_000
DEFAULT_MAX_QUEUE_BYTES = 256 << 20
DEFAULT_MAX_REQUEST_BYTES = 64 << 20
DEFAULT_MAX_INFLIGHT_BYTES = 256 << 20
DEFAULT_BATCH_DELAY_S = 0.2
DEFAULT_DRAIN_TIMEOUT_S = 30.0


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port); ValueError when malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{address!r} is not host:port")
    return host.strip("[]"), int(port)


class Collector:
    """OTLP trace receivers writing into ``traces_dir`` (see module doc)."""

    def __init__(
        self,
        traces_dir: str | os.PathLike,
        *,
        grpc_address: str | None = None,
        http_address: str | None = None,
        max_queue_spans: int = DEFAULT_MAX_QUEUE_SPANS,
        max_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
        batch_delay_s: float = DEFAULT_BATCH_DELAY_S,
        durable_ack: bool = False,
        drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
        min_free_bytes: int | None = None,
        grace_s: float = 5.0,
        sink=None,
    ) -> None:
        if not grpc_address and not http_address:
            raise ValueError("give at least one of grpc_address / http_address")
        self.traces_dir = os.fspath(traces_dir)
        self.grpc_address, self.http_address = grpc_address, http_address
        self.max_queue_spans, self.max_queue_bytes = max_queue_spans, max_queue_bytes
        self.max_request_bytes = max_request_bytes
        self.budget = ByteBudget(max_inflight_bytes)
        self.batch_delay_s = batch_delay_s
        self.durable_ack = durable_ack
        self.drain_timeout_s = drain_timeout_s
        self.min_free_bytes = min_free_bytes
        self.grace_s = grace_s
        self._sink = sink
        self.queue: SpanQueue | None = None
        self.grpc_port: int | None = None
        self.http_port: int | None = None
        self._grpc = None
        self._http: HTTPReceiver | None = None
        self._stopped = False

    def start(self) -> Collector:
        """Check the directory, start the writer and the listeners; OSError (one line) when the
        directory is not writable (:class:`kvtrace.store.access.NotWritable`) or a listener
        cannot bind."""
        ensure_writable(self.traces_dir)
        if self._sink is None:
            self._sink = TableSink(self.traces_dir, fsync=self.durable_ack, min_free_bytes=self.min_free_bytes)
        self.queue = SpanQueue(
            self._sink,
            max_spans=self.max_queue_spans,
            max_bytes=self.max_queue_bytes,
            batch_delay_s=self.batch_delay_s,
            close_timeout_s=self.drain_timeout_s,
        )
        limits = dict(budget=self.budget, durable=self.durable_ack)
        try:
            if self.grpc_address:
                self._grpc, self.grpc_port = grpc_server.start(
                    self.queue, self.grpc_address, max_message_bytes=self.max_request_bytes, **limits
                )
            if self.http_address:
                host, port = split_address(self.http_address)
                self._http = HTTPReceiver(
                    self.queue, host, port, grace_s=self.grace_s, max_body_bytes=self.max_request_bytes, **limits
                )
                self.http_port = self._http.start()
        except BaseException:
            self.stop()
            raise
        return self

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every span accepted so far is in a Parquet file."""
        return self.queue.flush(timeout) if self.queue else True

    def stop(self) -> None:
        """Graceful shutdown (see module doc); idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._http is not None:
            self._http.stop()
        if self._grpc is not None:
            self._grpc.stop(self.grace_s).wait(self.grace_s + 5)
        if self.queue is not None:
            self.queue.close()
        if self._sink is not None:
            self._sink.shutdown()
        if self.queue is not None:
            st = self.queue.stats
            log.info(
                "kvtrace collect: stopped; %d spans accepted, %d written, %d lost, %d requests refused "
                "(%d while the directory was unwritable)",
                st.accepted_spans,
                st.written_spans,
                st.lost_spans,
                st.refused_requests,
                st.unwritable_refused_requests,
            )

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
