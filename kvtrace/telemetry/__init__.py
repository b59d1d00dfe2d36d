"""kvtrace.telemetry: the OpenTelemetry and Prometheus plumbing every component shares.  This module
is ``kvtrace.configure``: one TracerProvider per component, exporting to Parquet and/or OTLP;
:mod:`.fastspans` makes spans for one event-loop thread at a fraction of the SDK's cost;
:mod:`.exposition` renders a Prometheus registry for ``GET /metrics``.

Each kvtrace component (proxy, simulator worker, connector, agent, bench) calls
:func:`configure` with its own ``service_name`` and passes the returned provider to the code
that makes spans, so several components can share one process without sharing a resource.

Spans the process loses are counted (:func:`dropped_spans`): a batch processor whose queue is
full drops the span it is handed, and a failed export loses its batch (``write_failed`` when the
Parquet trace directory refused it, e.g. a full disk: the process keeps serving and the next batch
is tried as usual; ``export_failed`` otherwise).  The proxy and the
simulator expose the counts as ``kvtrace_dropped_spans`` (:mod:`kvtrace.telemetry.exposition`).
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import socket
import threading
import uuid
import weakref

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from kvtrace import semconv, settings
from kvtrace.telemetry.ids import UnseededIdGenerator

log = logging.getLogger(__name__)

_OTLP_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_providers: weakref.WeakSet[TracerProvider] = weakref.WeakSet()
_sigterm_lock = threading.Lock()
_sigterm_installed = False
_pre_shutdown: list = []
_dropped: collections.Counter = collections.Counter()
_dropped_lock = threading.Lock()


def count_dropped(reason: str, n: int = 1) -> None:
    """Count ``n`` spans lost for ``reason`` (one of :data:`kvtrace.semconv.DROP_REASONS`)."""
    with _dropped_lock:
        _dropped[reason] += n


def dropped_spans() -> dict[str, int]:
    """Spans this process lost so far, by reason."""
    with _dropped_lock:
        return dict(_dropped)


class _CountingBatchSpanProcessor(BatchSpanProcessor):
    """A BatchSpanProcessor that counts the spans it drops because its queue is full and, through
    :class:`_CountingExporter`, those of failed exports; ``span_exporter`` is still the exporter given."""

    def __init__(self, exporter: SpanExporter, **kwargs) -> None:
        super().__init__(_CountingExporter(exporter), **kwargs)
        self._given_exporter = exporter

    @property
    def span_exporter(self) -> SpanExporter:
        return self._given_exporter

    def on_end(self, span) -> None:
        # the SDK keeps the queue private (BatchProcessor._queue since 1.33, .queue before)
        queue = getattr(getattr(self, "_batch_processor", None), "_queue", None) or getattr(self, "queue", None)
        if (
            queue is not None
            and queue.maxlen is not None
            and len(queue) >= queue.maxlen
            and span.context.trace_flags.sampled
        ):
            count_dropped(semconv.DROP_QUEUE_FULL)
        super().on_end(span)


class _CountingExporter(SpanExporter):
    """Forwards to ``inner``; counts the spans of batches it failed to export."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans):
        try:
            result = self.inner.export(spans)
        except Exception:
            count_dropped(semconv.DROP_EXPORT_FAILED, len(spans))
            raise
        if result is not SpanExportResult.SUCCESS:
            # the Parquet exporters say why (write_failed: the disk refused it); others are export_failed
            reason = getattr(self.inner, "failure_reason", None)
            count_dropped(reason if reason in semconv.DROP_REASONS else semconv.DROP_EXPORT_FAILED, len(spans))
        return result

    def shutdown(self) -> None:
        return self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        flush = getattr(self.inner, "force_flush", None)
        return flush(timeout_millis) if flush is not None else True


def otlp_exporter(protocol: str | None = None) -> SpanExporter:
    """The SDK's OTLP span exporter for ``protocol`` (``grpc`` or ``http/protobuf``).

    Endpoint, headers, timeout and compression come from the standard ``OTEL_EXPORTER_OTLP_*``
    variables, read by the exporter itself.
    """
    protocol = (
        protocol
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if protocol in ("http/protobuf", "http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as OTLPHttpSpanExporter

        return OTLPHttpSpanExporter()
    raise ValueError(f"unsupported OTLP protocol {protocol!r} (grpc or http/protobuf)")


def parquet_exporter(directory: str | os.PathLike, writer_process: bool | None = None) -> SpanExporter:
    """The Parquet exporter for ``directory``: through a writer process
    (:class:`~kvtrace.store.writer_process.WriterProcessExporter`) when ``writer_process`` (else
    ``KVTRACE_WRITER_PROCESS``, else off) is true, else in this process
    (:class:`~kvtrace.store.exporter.ParquetSpanExporter`)."""
    if settings.WRITER_PROCESS.get(writer_process):
        from kvtrace.store.writer_process import WriterProcessExporter

        return WriterProcessExporter(directory)
    from kvtrace.store.exporter import ParquetSpanExporter

    return ParquetSpanExporter(directory)


def _otlp_wanted(otlp: bool | str | None) -> bool:
    mode = settings.OTLP.get(otlp)
    if mode in (True, "on", "1", "true"):
        return True
    if mode in (False, "off", "0", "false"):
        return False
    return any(os.environ.get(v) for v in _OTLP_ENDPOINT_VARS)


def make_resource(service_name: str, attributes: dict | None = None) -> Resource:
    """Resource with service.name (KVTRACE_SERVICE_NAME / OTEL_SERVICE_NAME win), instance id, host."""
    name = settings.SERVICE_NAME.get() or os.environ.get("OTEL_SERVICE_NAME") or service_name
    attrs = {
        semconv.SERVICE_INSTANCE_ID: uuid.uuid4().hex,
        semconv.HOST_NAME: socket.gethostname(),
        **(attributes or {}),
    }
    # Resource.create merges OTEL_RESOURCE_ATTRIBUTES; explicit attributes win over it.
    base = Resource.create({})
    return base.merge(Resource({**attrs, semconv.SERVICE_NAME: name}))


def configure(
    service_name: str,
    *,
    traces_dir: str | os.PathLike | None = None,
    otlp: bool | str | None = None,
    resource_attributes: dict | None = None,
    exporters: list[SpanExporter] | None = None,
    set_global: bool = False,
    handle_sigterm: bool = True,
    writer_process: bool | None = None,
    batch_delay_ms: int | None = None,
) -> TracerProvider:
    """Build a TracerProvider for one component.

    - ``traces_dir`` (else ``KVTRACE_TRACES_DIR``): Parquet export into that directory
      (:func:`parquet_exporter`: in a writer process when ``writer_process``, else
      ``KVTRACE_WRITER_PROCESS``, is true; off by default, on by default in ``kvtrace proxy``).
    - ``otlp`` (else ``KVTRACE_OTLP``; ``auto`` = when an ``OTEL_EXPORTER_OTLP_*ENDPOINT`` is
      set): OTLP export beside Parquet.
    - ``exporters``: extra exporters (tests pass an in-memory one).
    - ``batch_delay_ms`` (else ``KVTRACE_BATCH_DELAY_MS``): how long ended spans wait in memory
      before they are exported, which is what a SIGKILL of the process loses.

    Every exporter runs under its own ``BatchSpanProcessor``.  With ``handle_sigterm`` (main
    thread only) SIGTERM flushes every provider made here before the process exits.
    """
    provider = TracerProvider(
        resource=make_resource(service_name, resource_attributes), id_generator=UnseededIdGenerator()
    )
    if settings.DISABLE.get():
        return provider
    directory = settings.TRACES_DIR.get(traces_dir)
    chosen: list[SpanExporter] = list(exporters or [])
    if directory:
        chosen.append(parquet_exporter(directory, writer_process))
    if _otlp_wanted(otlp):
        chosen.append(otlp_exporter())
    delay, size = settings.BATCH_DELAY_MS.get(batch_delay_ms), settings.BATCH_SIZE.get()
    for exporter in chosen:
        provider.add_span_processor(
            _CountingBatchSpanProcessor(
                exporter, schedule_delay_millis=delay, max_export_batch_size=size, max_queue_size=4 * size
            )
        )
    _providers.add(provider)
    if set_global:
        trace.set_tracer_provider(provider)
    if handle_sigterm:
        _install_sigterm_flush()
    return provider


def check_traces_dir(traces_dir: str | os.PathLike | None = None) -> str | None:
    """The directory :func:`configure` would write Parquet traces to (``traces_dir``, else
    ``KVTRACE_TRACES_DIR``; None when there is none or tracing is disabled), created and proven
    writable first.  Commands call it before they start work, so an unwritable ``--traces`` ends
    them at once with one line; raises :class:`kvtrace.store.access.NotWritable` (an ``OSError``)."""
    directory = settings.TRACES_DIR.get(traces_dir)
    if not directory or settings.DISABLE.get():
        return None
    from kvtrace.store.access import ensure_writable

    return ensure_writable(directory)


def register_pre_shutdown(fn) -> None:
    """Have :func:`shutdown_all` call ``fn()`` before it flushes the providers, e.g. so
    :mod:`kvtrace.emit.deferred` can apply the span operations it still has queued."""
    if fn not in _pre_shutdown:
        _pre_shutdown.append(fn)


def shutdown_all() -> None:
    """Flush and shut down every provider made by :func:`configure` (idempotent)."""
    for fn in list(_pre_shutdown):
        try:
            fn()
        except Exception:  # telemetry must never raise into the host
            log.exception("kvtrace: pre-shutdown hook failed")
    for provider in list(_providers):
        try:
            provider.shutdown()
        except Exception:  # telemetry must never raise into the host
            log.exception("kvtrace: provider shutdown failed")


def _install_sigterm_flush() -> None:
    global _sigterm_installed
    with _sigterm_lock:
        if _sigterm_installed or threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)

        def _on_sigterm(signum, frame):
            shutdown_all()
            if callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN):
                previous(signum, frame)
            else:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        try:
            signal.signal(signal.SIGTERM, _on_sigterm)
            _sigterm_installed = True
        except ValueError:  # not the main thread of the main interpreter
            pass
