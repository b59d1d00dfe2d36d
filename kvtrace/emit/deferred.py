"""How :class:`~kvtrace.emit.recorder.KVRecorder`'s span operations reach the OpenTelemetry SDK.

The recorder describes its spans as four operations on opaque handles (``start``, ``finish``,
``abort``, ``event``), each with an explicit timestamp taken by the recorder.  Two appliers:

- :class:`SyncSpans` calls the SDK right away, on the caller's thread.  The simulator uses it:
  its tests read the spans as soon as a request is done.
- :class:`DeferredSpans` is for the real vLLM connector, whose calls run inside vLLM's scheduler
  hooks, where an SDK span start or end is a cost every scheduler step pays (figures:
  docs/benchmarks.md, ``benchmarks/connector``).  On the caller's thread it only pre-assigns the
  span id (and the trace id of a root span) and appends the operation to a deque: no lock, no
  thread wake-up (waking a waiting thread per operation would cost about as much as the span).
  A daemon thread wakes every :data:`INTERVAL_S` (or once :data:`BATCH` operations wait) and
  replays them through a :class:`SyncSpans`, so both modes make the same spans.  The SDK takes
  the pre-assigned ids from :class:`_PresetIds`, installed as the ``id_generator`` of the
  applier's own copy of the SDK tracer, so trace ids (the summary's ``trace_id``) and parent
  links are known before the span exists.

The SDK work itself still runs in the same process (and under the same GIL); it just no longer
runs inside the hook.  :meth:`DeferredSpans.flush` waits until everything queued so far is
applied; it runs on ``KVRecorder.shutdown`` (which then stops the thread), at interpreter exit,
and from :func:`kvtrace.telemetry.shutdown_all` (SIGTERM) before the exporters are flushed.
Errors while applying are logged once per operation kind, never raised.
"""

from __future__ import annotations

import atexit
import copy
import logging
import threading
import weakref
from collections import deque
from typing import Any, TypeGuard

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode

from kvtrace import telemetry
from kvtrace.telemetry import ids

log = logging.getLogger(__name__)
INTERVAL_S = 0.1  # how stale a span may get before the thread applies it (exporters batch ~1 s)
BATCH = 1024  # operations waiting that wake the thread early
MAX_PENDING = 200_000  # beyond this (the SDK cannot keep up) operations are dropped, with a warning
# what an applier's ``start`` returns and its other operations take: a :class:`_Handle`
# (:class:`DeferredSpans`) or the SDK span itself (:class:`SyncSpans`), opaque to the recorder
SpanHandle = Any


def _context(parent):
    """OTel context for ``parent``: a span, a (remote) SpanContext, or None (the current one)."""
    if parent is None:
        return None
    if isinstance(parent, SpanContext):  # what the W3C propagator's extract() returns
        return trace.set_span_in_context(NonRecordingSpan(parent), otel_context.Context())
    return trace.set_span_in_context(parent)


class SyncSpans:
    """Applies span operations immediately; handles are the SDK spans themselves."""

    deferred = False

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    def start(self, name: str, parent, attributes: dict, start_ns: int, kind: SpanKind = SpanKind.INTERNAL):
        """Start a span under ``parent`` (a handle, a remote SpanContext or None)."""
        return self.tracer.start_span(
            name, context=_context(parent), kind=kind, attributes=attributes, start_time=start_ns
        )

    @staticmethod
    def trace_id(span) -> int:
        return span.get_span_context().trace_id

    @staticmethod
    def finish(span, attributes: dict | None, error: str | None, end_ns: int) -> None:
        """Set ``attributes``, an ERROR status described by ``error`` when given, and end."""
        if attributes:
            span.set_attributes(attributes)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end_ns)

    @staticmethod
    def abort(span, error: str, end_ns: int) -> None:
        """End ``span`` with an ERROR status unless it already ended (or never recorded)."""
        if span.is_recording():
            span.set_status(Status(StatusCode.ERROR, error))
            span.end(end_time=end_ns)

    @staticmethod
    def event(span, name: str, attributes: dict, ts: int) -> None:
        span.add_event(name, attributes=attributes, timestamp=ts)

    def flush(self, timeout: float | None = None) -> bool:
        return True

    close = flush


class _PresetIds(IdGenerator):
    """The ids :class:`DeferredSpans` assigned, handed to the SDK once each; else ``inner``'s."""

    def __init__(self, inner: IdGenerator) -> None:
        self.inner = inner
        self.local = threading.local()

    def preset(self, trace_id: int | None, span_id: int | None) -> None:
        self.local.trace_id, self.local.span_id = trace_id, span_id

    def generate_span_id(self) -> int:
        span_id = getattr(self.local, "span_id", None)
        if span_id is None:
            return self.inner.generate_span_id()
        self.local.span_id = None
        return span_id

    def generate_trace_id(self) -> int:
        trace_id = getattr(self.local, "trace_id", None)
        if trace_id is None:
            return self.inner.generate_trace_id()
        self.local.trace_id = None
        return trace_id

    def is_trace_id_random(self) -> bool:
        return self.inner.is_trace_id_random()


class _Handle:
    """A span that will exist: its pre-assigned ids, and the SDK span once applied."""

    __slots__ = ("trace_id", "span_id", "span")

    def __init__(self, trace_id: int, span_id: int) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.span = None


# unseeded: vLLM seeds the module-level ``random`` (kvtrace.telemetry.ids)
_bits, _random_id = ids.getrandbits, ids.random_id


_open: weakref.WeakSet[DeferredSpans] = weakref.WeakSet()


def flush_all(timeout: float = 5.0) -> None:
    """Apply everything every open :class:`DeferredSpans` has queued (exit / SIGTERM)."""
    for sink in list(_open):
        sink.flush(timeout)


def _flush_at_exit(ref: weakref.ref[DeferredSpans]) -> None:
    sink = ref()
    if sink is not None:
        sink.flush(5.0)


telemetry.register_pre_shutdown(flush_all)


class DeferredSpans:
    """Queues span operations; a daemon thread applies them with explicit times and ids.

    Only for SDK tracers (:func:`supports`); the ids of the spans it makes are its own choice.
    """

    deferred = True

    def __init__(self, tracer: SdkTracer) -> None:
        own = copy.copy(tracer)  # the cached tracer is shared: only this copy takes preset ids
        self._ids = own.id_generator = _PresetIds(tracer.id_generator)
        self._apply = SyncSpans(own)
        self._ops: deque = deque()
        self._wake = threading.Event()
        self._closed = False
        self._failed: set[str] = set()
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="kvtrace-spans", daemon=True)
        self._thread.start()
        _open.add(self)
        # atexit runs last-registered first: this runs before the exit hook of the provider
        # that made ``tracer`` (registered when it was built, i.e. earlier)
        atexit.register(_flush_at_exit, weakref.ref(self))

    @staticmethod
    def supports(tracer) -> TypeGuard[SdkTracer]:
        return isinstance(tracer, SdkTracer)

    # ---------------------------------------------------------------- caller's thread: O(1)
    def start(self, name: str, parent, attributes: dict, start_ns: int, kind: SpanKind = SpanKind.INTERNAL) -> _Handle:
        # a child (parent: a _Handle or a remote SpanContext) joins its parent's trace
        trace_id = parent.trace_id if parent is not None else (_bits(128) or _random_id(128))
        handle = _Handle(trace_id, _bits(64) or _random_id(64))
        self._put((self._do_start, handle, name, parent, attributes, start_ns, kind))
        return handle

    @staticmethod
    def trace_id(handle: _Handle) -> int:
        return handle.trace_id

    def finish(self, handle: _Handle, attributes: dict | None, error: str | None, end_ns: int) -> None:
        self._put((self._do, SyncSpans.finish, handle, attributes, error, end_ns))

    def abort(self, handle: _Handle, error: str, end_ns: int) -> None:
        self._put((self._do, SyncSpans.abort, handle, error, end_ns))

    def event(self, handle: _Handle, name: str, attributes: dict, ts: int) -> None:
        self._put((self._do, SyncSpans.event, handle, name, attributes, ts))

    def _put(self, op: tuple) -> None:
        """Queue ``op`` = (function, *args) for the thread."""
        ops = self._ops
        if self._closed or len(ops) >= BATCH:
            if self._closed or len(ops) >= MAX_PENDING:
                self._drop()
                return
            if not self._wake.is_set():
                self._wake.set()
        ops.append(op)

    def _drop(self) -> None:
        if not self.dropped:
            log.warning("kvtrace: span operations dropped (%s)", "recorder closed" if self._closed else "backlog full")
        self.dropped += 1

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every operation queued before this call is applied; False on timeout."""
        if self._closed or threading.current_thread() is self._thread:
            return True
        done = threading.Event()
        self._ops.append((done.set,))
        self._wake.set()
        return done.wait(timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Flush, then stop the thread; later operations are dropped."""
        drained = self.flush(timeout)
        self._closed = True
        self._wake.set()
        _open.discard(self)
        return drained

    # ---------------------------------------------------------------- the applier thread
    def _run(self) -> None:
        ops, wake = self._ops, self._wake
        while not self._closed:
            wake.wait(INTERVAL_S)
            wake.clear()
            while ops:
                op = ops.popleft()
                try:
                    op[0](*op[1:])
                except Exception:
                    self._log_failure(op)

    def _log_failure(self, op: tuple) -> None:
        name = getattr(op[1], "__name__", None) if len(op) > 1 else None
        name = str(name or getattr(op[0], "__name__", "op"))
        if name not in self._failed:
            self._failed.add(name)
            log.exception("kvtrace: applying span %s failed; telemetry continues without it", name)

    def _do_start(self, handle: _Handle, name, parent, attributes, start_ns, kind) -> None:
        if isinstance(parent, _Handle):
            parent = parent.span
            if parent is None:  # the parent's own start failed (logged): nothing to hang under
                return
        self._ids.preset(handle.trace_id, handle.span_id)
        try:
            handle.span = self._apply.start(name, parent, attributes, start_ns, kind)
        finally:
            self._ids.preset(None, None)

    @staticmethod
    def _do(op, handle: _Handle, *args) -> None:
        if handle.span is not None:
            op(handle.span, *args)
