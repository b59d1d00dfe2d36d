"""Spans of one proxied request: the SERVER span and its P-leg / D-leg CLIENT spans.

:class:`RequestTrace` is created by the handler in :mod:`kvtrace.proxy.app` for every
completion request.  It continues the client's ``traceparent`` (W3C trace context) and reads
``session.id`` from W3C baggage; each leg gets a CLIENT span whose context travels to the worker
as the ``traceparent`` header and inside ``kv_transfer_params["kvtrace"]`` (``sc.CTX_*``) so the
connector / simulator parents its engine spans on it.  Telemetry never changes the request: every
method here is cheap and does not raise on a broken exporter (the SDK isolates exporters).

Every attribute value passes :func:`clean` on its way into a span: text that UTF-8 cannot carry
(an unpaired surrogate, e.g. from a worker's JSON or a header's undecodable bytes) gets U+FFFD in
its place and text is cut at :data:`MAX_TEXT` characters, so no value the proxy sets can fail an
exporter.  ASCII text of normal length (nearly all) costs one ``isascii`` and one ``len``.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import baggage, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kvtrace import semconv as sc
from kvtrace import settings
from kvtrace.telemetry import fastspans

_incoming = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
_outgoing = TraceContextTextMapPropagator()


MAX_TEXT = 4096  # characters of one attribute string


def _text(v: str) -> str:
    if not v.isascii():
        try:
            v.encode()
        except UnicodeEncodeError:  # unpaired surrogates -> U+FFFD (valid pairs are joined)
            v = v.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return v[:MAX_TEXT] if len(v) > MAX_TEXT else v


def clean(attrs: dict) -> dict:
    """``attrs`` with every string (and string in a sequence) safe for any exporter; in place."""
    for k, v in attrs.items():
        if type(v) is str:
            if len(v) > MAX_TEXT or not v.isascii():
                attrs[k] = _text(v)
        elif isinstance(v, (tuple, list)):
            attrs[k] = tuple(_text(x) if isinstance(x, str) else x for x in v)
    return attrs


def tracer(provider: trace.TracerProvider | None, fast: bool | None = None) -> trace.Tracer:
    """The proxy's tracer: :mod:`kvtrace.telemetry.fastspans`' where the provider allows it, unless ``fast``
    (else ``KVTRACE_PROXY_FASTSPANS``) is false, then the SDK's own."""
    provider = provider or trace.get_tracer_provider()
    if settings.PROXY_FASTSPANS.get(fast):
        return fastspans.tracer(provider, "kvtrace.proxy")
    return provider.get_tracer("kvtrace.proxy")


class RequestTrace:
    """The SERVER span of one request plus helpers for its legs and events."""

    def __init__(self, tracer_: trace.Tracer, headers, method: str, path: str, metrics=None) -> None:
        self.tracer = tracer_
        self.metrics = metrics  # kvtrace.proxy.metrics.ProxyMetrics: counts the request once, at finish
        self.offer_reason: str | None = None
        self.t0 = time.perf_counter()
        self.ctx_in = _incoming.extract(headers)
        self.span: Span = tracer_.start_span(
            sc.SPAN_PROXY_REQUEST,
            context=self.ctx_in,
            kind=SpanKind.SERVER,
            attributes={sc.HTTP_REQUEST_METHOD: method, sc.URL_PATH: path},
        )
        self.ctx = trace.set_span_in_context(self.span)
        self.identity: dict = {}
        self.ttft_ms: float | None = None
        self._trace_id: str | None = None

    @property
    def trace_id(self) -> str:
        if self._trace_id is None:
            self._trace_id = format(self.span.get_span_context().trace_id, "032x")
        return self._trace_id

    def baggage_session(self) -> str | None:
        value = baggage.get_baggage(sc.BAGGAGE_SESSION_ID, self.ctx_in)
        return str(value) if value else None

    def set_identity(
        self, request_id: str, session_id: str | None, turn: int | None, extra: dict | None = None
    ) -> None:
        """Record who the request is (copied onto each leg span); ``extra`` attributes are set in the same call."""
        ident: dict[str, Any] = {sc.GEN_AI_REQUEST_ID: request_id}
        if session_id:
            ident[sc.SESSION_ID] = session_id
            ident[sc.GEN_AI_CONVERSATION_ID] = session_id
        if turn is not None:
            ident[sc.TURN_INDEX] = turn
        self.identity = clean(ident)
        if extra:
            self.offer_reason = extra.get(sc.PROXY_OFFER_REASON)
        self.span.set_attributes(clean({**ident, **extra}) if extra else ident)

    def leg(self, name: str, host: str, port: int, **attrs) -> tuple[Span, str]:
        """Start a CLIENT span for a leg; returns it and the traceparent to send."""
        span = self.tracer.start_span(
            name,
            context=self.ctx,
            kind=SpanKind.CLIENT,
            attributes={**self.identity, sc.SERVER_ADDRESS: host, sc.SERVER_PORT: port, **clean(attrs)},
        )
        carrier: dict = {}
        _outgoing.inject(carrier, context=trace.set_span_in_context(span))
        return span, carrier.get("traceparent", "")

    def first_token(self) -> None:
        if self.ttft_ms is None:
            self.ttft_ms = round((time.perf_counter() - self.t0) * 1000.0, 3)
            self.span.add_event(sc.EVENT_FIRST_TOKEN)

    def upstream_error(self, error_type: str, host: str, port: int) -> None:
        self.span.add_event(
            sc.EVENT_UPSTREAM_ERROR, clean({sc.ERROR_TYPE: error_type, sc.SERVER_ADDRESS: host, sc.SERVER_PORT: port})
        )

    def finish(self, status: int, error_type: str | None = None, **attrs) -> None:
        """End the SERVER span with the client-facing status (and count the request, once)."""
        span = self.span
        latency_ms = round((time.perf_counter() - self.t0) * 1000.0, 3)
        if self.metrics is not None:
            metrics, self.metrics = self.metrics, None
            metrics.request_finished(status, self.offer_reason, attrs.get(sc.KV_OUTCOME), self.ttft_ms, latency_ms)
        if not span.is_recording():
            return
        attrs[sc.HTTP_RESPONSE_STATUS_CODE] = status
        attrs[sc.REQUEST_LATENCY_MS] = latency_ms
        if self.ttft_ms is not None:
            attrs[sc.REQUEST_TTFT_MS] = self.ttft_ms
        _end(span, attrs, error_type)


def end_leg(span: Span, status: int | None, error_type: str | None = None, **attrs) -> None:
    """End a leg's CLIENT span."""
    if not span.is_recording():
        return
    if status is not None:
        attrs[sc.HTTP_RESPONSE_STATUS_CODE] = status
    _end(span, attrs, error_type)


def _end(span: Span, attrs: dict, error_type: str | None) -> None:
    """Set the final attributes (None values skipped) and the error, in one call each, and end ``span``."""
    final = {k: v for k, v in attrs.items() if v is not None}
    if error_type:
        final[sc.ERROR_TYPE] = error_type
        span.set_attributes(clean(final))
        span.set_status(Status(StatusCode.ERROR, final[sc.ERROR_TYPE]))
    else:
        span.set_attributes(clean(final))
    span.end()
