"""Spans for one event-loop thread at a fraction of the SDK's cost, exported by the SDK's processors.

The OpenTelemetry SDK's ``Tracer.start_span`` / ``Span`` spend most of their time on machinery a
hot single-threaded caller (the proxy makes three spans per request) does not need: a sampler
call and result object per span, a lock per call, and a recursive validation of every attribute
value (``isinstance`` against the ``Sequence``/``Mapping`` ABCs).  :func:`tracer` returns a
:class:`FastTracer` whose spans keep plain dicts and lists and, when they end, hand the same
``ReadableSpan`` the SDK would make to the provider's span processors (``on_start`` and
``on_end`` are called as the SDK calls them), so exporters see no difference.

It is used only where the provider's behaviour is fully reproduced: an SDK ``TracerProvider``
with the default sampler (``ParentBased(ALWAYS_ON)``: a span is sampled unless its parent is not),
the default attribute-value length (no truncation), no SDK self-metrics and the tracer enabled;
otherwise :func:`tracer` returns the SDK's own tracer.  Values of the common types (str, bool,
int, float, tuples of those) are stored as given; anything else goes through the SDK's own
attribute cleaning.  At most ``max_span_attributes`` attributes, ``max_events`` events and
``max_event_attributes`` attributes per event are kept (the newest, counted as dropped), as by the
SDK.  Links are kept as given (the proxy makes none).  ``KVTRACE_PROXY_FASTSPANS=0`` gives the
proxy the SDK's own tracer; ``tests/test_proxy_fastspans.py`` checks both export the same spans
for the same proxy requests.  Spans are not thread-safe: use one from one thread (the proxy's loop).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from time import time_ns

from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes, _clean_attribute_value
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider, sampling
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

log = logging.getLogger(__name__)
_SIMPLE = frozenset((str, bool, int, float))
_UNSET = Status(StatusCode.UNSET)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SAMPLED_RANDOM = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


def _clean(attributes) -> dict:
    """``attributes`` as a dict of exportable values (the SDK's cleaning for uncommon types)."""
    out = dict(attributes)
    for key, value in out.items():
        kind = type(value)
        if kind in _SIMPLE or kind is tuple and all(type(v) in _SIMPLE for v in value):
            continue
        out[key] = _clean_attribute_value(value, None)
    return out


def tracer(provider, name: str, version: str | None = None) -> trace_api.Tracer:
    """A :class:`FastTracer` for ``provider`` when it reproduces the provider exactly (module doc),
    else ``provider.get_tracer(name, version)``."""
    inner = provider.get_tracer(name, version)
    if not isinstance(provider, TracerProvider) or getattr(provider, "_meter_provider", None) is not None:
        return inner
    limits = getattr(inner, "_span_limits", None)
    default_sampler = provider.sampler is sampling.DEFAULT_ON or (
        type(provider.sampler) is sampling.ParentBased and vars(provider.sampler) == vars(sampling.DEFAULT_ON)
    )
    enabled = getattr(inner, "_is_enabled", lambda: False)()
    if (
        not default_sampler
        or limits is None
        or limits.max_span_attribute_length is not None
        or limits.max_attribute_length is not None
        or not enabled
    ):
        return inner
    try:
        return FastTracer(inner)
    except AttributeError:  # an SDK whose tracer no longer has the fields reproduced here
        log.warning("kvtrace.telemetry.fastspans: this OpenTelemetry SDK's tracer differs; using it as is")
        return inner


class FastTracer(trace_api.Tracer):
    """The subset of an SDK ``Tracer`` a hot caller needs, without its per-span machinery."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.processor = inner.span_processor
        self.resource = inner.resource
        self.scope = inner._instrumentation_scope
        self.limits = inner._span_limits
        self.id_generator = inner.id_generator

    def start_span(
        self,
        name: str,
        context=None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes=None,
        links: Sequence | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace_api.Span:
        parent: SpanContext | None = trace_api.get_current_span(context).get_span_context()
        ids = self.id_generator
        if parent is None or not parent.is_valid:
            parent = None
            flags = _SAMPLED_RANDOM if ids.is_trace_id_random() else _SAMPLED
            ctx = SpanContext(ids.generate_trace_id(), ids.generate_span_id(), False, flags)
        else:
            sampled = parent.trace_flags.sampled
            flags = TraceFlags(
                (TraceFlags.SAMPLED if sampled else 0)
                | (TraceFlags.RANDOM_TRACE_ID if parent.trace_flags.random_trace_id else 0)
            )
            ctx = SpanContext(parent.trace_id, ids.generate_span_id(), False, flags, parent.trace_state)
            if not sampled:
                return trace_api.NonRecordingSpan(ctx)
        span = FastSpan(
            self, name, ctx, parent, kind, attributes, links, start_time, record_exception, set_status_on_exception
        )
        self.processor.on_start(span, parent_context=context)
        return span

    # a plain contextmanager: the SDK's own decorator (``_agnosticcontextmanager``) is private
    @contextmanager
    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context=None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes=None,
        links: Sequence | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace_api.Span]:
        span = self.start_span(
            name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception
        )
        with trace_api.use_span(
            span,
            end_on_exit=end_on_exit,
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        ) as current:
            yield current


class FastSpan(trace_api.Span):
    """A recording span of :class:`FastTracer`; ends into an SDK ``ReadableSpan``."""

    __slots__ = (
        "_tracer",
        "_name",
        "_context",
        "_parent",
        "_kind",
        "_attributes",
        "_events",
        "_links",
        "_status",
        "_start_time",
        "_end_time",
        "_record_exception",
        "_set_status_on_exception",
    )

    def __init__(
        self,
        tracer_: FastTracer,
        name,
        context,
        parent,
        kind,
        attributes,
        links,
        start_time,
        record_exception,
        set_status_on_exception,
    ) -> None:
        self._tracer, self._name, self._context, self._parent, self._kind = tracer_, name, context, parent, kind
        self._attributes: dict = {}
        self._events: list = []
        self._links = tuple(links or ())
        self._status = _UNSET
        self._start_time = start_time if start_time is not None else time_ns()
        self._end_time: int | None = None
        self._record_exception, self._set_status_on_exception = record_exception, set_status_on_exception
        if attributes:
            self.set_attributes(attributes)

    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return self._end_time is None

    def _ended(self, what: str) -> bool:
        if self._end_time is None:
            return False
        log.warning("Tried calling %s on an ended span.", what)
        return True

    def set_attributes(self, attributes) -> None:
        if self._ended("set_attributes"):
            return
        self._attributes.update(_clean(attributes))

    def set_attribute(self, key: str, value) -> None:
        self.set_attributes({key: value})

    def add_event(self, name: str, attributes=None, timestamp: int | None = None) -> None:
        if self._ended("add_event"):
            return
        attributes = _clean(attributes) if attributes else {}
        limit = self._tracer.limits.max_event_attributes
        if limit is not None and len(attributes) > limit:  # the SDK keeps the newest
            attributes = BoundedAttributes(limit, attributes, immutable=True)
        self._events.append(Event(name, attributes, timestamp or time_ns()))

    def update_name(self, name: str) -> None:
        if not self._ended("update_name"):
            self._name = name

    def set_status(self, status, description: str | None = None) -> None:
        if self._ended("set_status") or self._status.status_code is StatusCode.OK:
            return
        if isinstance(status, Status):
            if status.status_code is not StatusCode.UNSET:
                self._status = status
        elif status is not StatusCode.UNSET:
            self._status = Status(status, description)

    def record_exception(
        self, exception: BaseException, attributes=None, timestamp: int | None = None, escaped: bool = False
    ) -> None:
        # the SDK's event, via add_event: SdkSpan's method needs nothing else of its span
        SdkSpan.record_exception(self, exception, attributes, timestamp, escaped)  # type: ignore[arg-type]

    def __exit__(self, exc_type, exc_val, exc_tb) -> None:
        if exc_val is not None and self.is_recording():
            if self._record_exception:
                self.record_exception(exc_val, escaped=True)
            if self._set_status_on_exception:
                self.set_status(Status(StatusCode.ERROR, f"{type(exc_val).__name__}: {exc_val}"))
        self.end()

    def end(self, end_time: int | None = None) -> None:
        if self._end_time is not None:
            log.warning("Calling end() on an ended span.")
            return
        self._end_time = end_time if end_time is not None else time_ns()
        tracer_ = self._tracer
        limits = tracer_.limits
        attributes: Mapping = self._attributes
        if len(attributes) > limits.max_span_attributes:  # the SDK keeps the newest
            attributes = BoundedAttributes(limits.max_span_attributes, attributes, immutable=True)
        events: Sequence[Event] = self._events
        events = BoundedList.from_seq(limits.max_events, events) if len(events) > limits.max_events else tuple(events)
        tracer_.processor.on_end(
            ReadableSpan(
                name=self._name,
                context=self._context,
                parent=self._parent,
                resource=tracer_.resource,
                attributes=attributes,
                events=events,
                links=self._links,
                kind=self._kind,
                status=self._status,
                start_time=self._start_time,
                end_time=self._end_time,
                instrumentation_scope=tracer_.scope,
            )
        )
