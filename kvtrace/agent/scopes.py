"""Span scopes: one object that is a sync/async context manager *and* a decorator.

:class:`SpanScope` is what ``Agent.tool_call()``, ``Agent.app_work()``, ``Agent.turn()`` and
``Agent.session()`` return.  Entering starts a span as a child of the current OTel context and
makes it current (so tasks created inside inherit it); leaving records any exception (status
ERROR, ``error.type``) and ends it.  Used as a decorator it opens a fresh scope around every call
of a sync or async function.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from contextvars import Token
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from kvtrace import semconv as sc

log = logging.getLogger(__name__)


def record_error(span: Span, exc: BaseException, error_type: str | None = None) -> None:
    """Mark ``span`` failed: exception event, ERROR status, ``error.type``."""
    try:
        etype = error_type or type(exc).__qualname__
        span.record_exception(exc)
        span.set_attribute(sc.ERROR_TYPE, etype)
        span.set_status(Status(StatusCode.ERROR, f"{etype}: {exc}"[:256]))
    except Exception:  # telemetry never raises into the host
        log.exception("kvtrace: recording an error on a span failed")


class SpanScope:
    """A span around a block or a function call.

    ``make_attributes`` is called on entry (it reads the current session/turn), ``on_enter`` /
    ``on_exit`` let session and turn scopes set and reset their context variables.
    """

    def __init__(
        self,
        tracer: trace.Tracer,
        name: str,
        make_attributes: Callable[[], dict],
        kind: SpanKind = SpanKind.INTERNAL,
        *,
        on_enter: Callable[[SpanScope], Any] | None = None,
        on_exit: Callable[[SpanScope], None] | None = None,
        extra_context: Callable[[], otel_context.Context] | None = None,
    ) -> None:
        self._tracer = tracer
        self._name = name
        self._make_attributes = make_attributes
        self._kind = kind
        self._on_enter = on_enter
        self._on_exit = on_exit
        self._extra_context = extra_context
        self.span: Span | None = None
        self._tokens: list[object] = []
        self._value: Any = None
        self.factory: Callable[[], SpanScope] | None = None  # set when scopes carry per-use state

    # -- context manager ----------------------------------------------------------------
    def __enter__(self) -> Any:
        if self.span is not None:
            raise RuntimeError("a span scope cannot be entered twice; call the factory again")
        if self._extra_context is not None:
            self._tokens.append(otel_context.attach(self._extra_context()))
        attributes = self._make_attributes()
        self.span = self._tracer.start_span(self._name, kind=self._kind, attributes=attributes)
        self._tokens.append(otel_context.attach(trace.set_span_in_context(self.span)))
        self._value = self._on_enter(self) if self._on_enter else self.span
        return self._value

    def __exit__(self, exc_type, exc, tb) -> None:
        span = self.span
        try:
            if exc is not None and span is not None:
                record_error(span, exc)
            if self._on_exit is not None:
                self._on_exit(self)
        finally:
            for token in reversed(self._tokens):
                try:
                    otel_context.detach(token)  # type: ignore[arg-type]
                except Exception:
                    log.debug("kvtrace: context detach failed", exc_info=True)
            self._tokens.clear()
            if span is not None:
                span.end()

    async def __aenter__(self) -> Any:
        return self.__enter__()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self.__exit__(exc_type, exc, tb)

    # -- decorator ----------------------------------------------------------------------
    def fresh(self) -> SpanScope:
        """An unentered copy (a decorator opens one per call)."""
        if self.factory is not None:
            return self.factory()
        return SpanScope(
            self._tracer,
            self._name,
            self._make_attributes,
            self._kind,
            on_enter=self._on_enter,
            on_exit=self._on_exit,
            extra_context=self._extra_context,
        )

    def __call__(self, fn: Callable) -> Callable:
        return scoped(fn, self.fresh)


def scoped(fn: Callable, factory: Callable[[], Any]) -> Callable:
    """Wrap sync or async ``fn`` so that each call runs inside ``factory()``'s scope."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args, **kwargs):
            async with factory():
                return await fn(*args, **kwargs)

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with factory():
            return fn(*args, **kwargs)

    return wrapper


def set_var(var, value) -> Token:
    return var.set(value)


def reset_var(var, token: Token | None) -> None:
    if token is None:
        return
    try:
        var.reset(token)
    except ValueError:  # exited in another context (e.g. another task); leave it
        log.debug("kvtrace: context variable reset from another context", exc_info=True)
