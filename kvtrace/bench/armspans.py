"""One span sink for every component of an in-process arm (:mod:`kvtrace.bench.inproc`): the
proxy, each simulated worker and the bench client keep their own TracerProvider (their own
resource: service name, engine id, role), but their spans go to one :class:`ArmSpans` processor
that exports them in large batches through one Parquet exporter, on the loop's thread.

Why: with a provider per component (``kvtrace.configure``), an 8P8D arm ran 18 batch processors,
each with a thread that woke every second of real time to write a small file per hour partition,
and rolled them every minute (reading them back): on the virtual clock, where simulated hours pass
in real minutes, the exporters took more CPU than the simulation.  The rows written are the
same; only the file layout differs (fewer, larger files).

Parquet only: where spans also go to OTLP (``KVTRACE_OTLP``, an ``OTEL_EXPORTER_OTLP_*ENDPOINT``),
:func:`sink` gives the per-component layout instead (:class:`PerComponent`), which exports there too.

Seeded ids: :func:`kvtrace.configure` draws two ``uuid4`` per component on the loop's thread (the
resource's instance id, then the exporter's writer id), and on the virtual clock those draws are
seeded (:func:`kvtrace.sim.virtual.clocks`).  :meth:`ArmSpans.provider` draws the same two, in
the same order, so every later id, hence every span, is the one the per-component layout makes.
"""

from __future__ import annotations

import math
import uuid

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult

from kvtrace import semconv as sc
from kvtrace import settings, telemetry
from kvtrace.telemetry.ids import UnseededIdGenerator

CHUNK = 65536  # spans per export: a few files per partition per arm, merged once at close


def sink(directory: str) -> ArmSpans | PerComponent:
    """The arm's span sink: :class:`ArmSpans`, or :class:`PerComponent` when OTLP export is on."""
    return PerComponent(directory) if telemetry._otlp_wanted(None) else ArmSpans(directory)


class PerComponent:
    """``kvtrace.configure`` per component, each with its own exporters (the served layout)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def provider(self, service_name: str, resource_attributes: dict | None = None) -> TracerProvider:
        return telemetry.configure(
            service_name, traces_dir=self.directory, resource_attributes=resource_attributes, handle_sigterm=False
        )

    def close(self) -> None:
        return None  # each provider flushed its exporters at its shutdown


class ArmSpans(SpanProcessor):
    """Collects the ended spans of every provider made by :meth:`provider`; :meth:`close` (once
    the arm is over) exports what is left and closes the exporter (one merge per partition)."""

    def __init__(self, directory: str, chunk: int = CHUNK) -> None:
        self.directory, self.chunk = directory, chunk
        self._spans: list[ReadableSpan] = []
        self._exporter = None
        self._closed = False

    def provider(self, service_name: str, resource_attributes: dict | None = None) -> TracerProvider:
        """A provider like ``kvtrace.configure(service_name, traces_dir=..., resource_attributes=...)``
        makes, exporting through this sink (the signature of SimCluster's ``tracer_provider_factory``)."""
        resource = telemetry.make_resource(service_name, resource_attributes)  # draw 1: the instance id
        provider = TracerProvider(resource=resource, id_generator=UnseededIdGenerator())
        if self._exporter is None:  # draw 2: the exporter's writer id (one exporter, made by the first)
            from kvtrace.store.exporter import ParquetSpanExporter

            # rolled once, at close: its batches are large and the loop's clock is virtual
            self._exporter = ParquetSpanExporter(self.directory, roll_seconds=math.inf, roll_bytes=1 << 62)
        else:
            uuid.uuid4()  # the writer id this component's own exporter would have drawn
        if not settings.DISABLE.get():
            provider.add_span_processor(self)
        return provider

    # -- SpanProcessor
    def on_start(self, span, parent_context=None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:  # as the BatchSpanProcessor: unsampled spans are not exported
            return
        spans = self._spans
        spans.append(span)
        if len(spans) >= self.chunk:
            self._export()

    def shutdown(self) -> None:
        """A provider's shutdown: the others may still make spans; :meth:`close` ends the sink."""
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._export()
        return True

    def close(self) -> None:
        """Export every span collected and close the exporter (idempotent)."""
        if self._closed:
            return
        self._export()
        self._closed = True
        if self._exporter is not None:
            self._exporter.shutdown()

    def _export(self) -> None:
        spans, self._spans = self._spans, []
        if not spans or self._exporter is None:
            return
        if self._closed:
            telemetry.count_dropped(sc.DROP_EXPORT_FAILED, len(spans))
            return
        if self._exporter.export(spans) is not SpanExportResult.SUCCESS:
            reason = self._exporter.failure_reason
            telemetry.count_dropped(reason if reason in sc.DROP_REASONS else sc.DROP_EXPORT_FAILED, len(spans))
