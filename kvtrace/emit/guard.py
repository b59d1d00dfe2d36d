"""What every recorder entry point stands on: :func:`never_raise` (telemetry never raises into vLLM
or the simulator) and :func:`parent_span_context` (the trace an engine span joins: the proxy's
``kvtrace.traceparent`` inside ``kv_transfer_params``, else the request's ``traceparent`` header)."""

from __future__ import annotations

import functools
import logging

from opentelemetry import trace
from opentelemetry.trace import SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kvtrace import semconv as sc

log = logging.getLogger(__name__)
_propagator = TraceContextTextMapPropagator()


def never_raise(default=None):
    """Telemetry never raises into its host: log the first failure of each method, return default."""

    def wrap(fn):
        logged = False

        @functools.wraps(fn)
        def inner(*args, **kwargs):
            nonlocal logged
            try:
                return fn(*args, **kwargs)
            except Exception:
                if not logged:
                    logged = True
                    log.exception("kvtrace: %s failed; telemetry continues without it", fn.__name__)
                return default() if callable(default) else default

        return inner

    return wrap


@functools.lru_cache(maxsize=1024)
def _parse_traceparent(value: str) -> SpanContext | None:
    """W3C ``traceparent`` -> remote SpanContext (None if invalid), parsed once per value."""
    ctx = _propagator.extract({"traceparent": value})
    span_context = trace.get_current_span(ctx).get_span_context()
    return span_context if span_context.is_valid else None


def parent_span_context(kv_params: dict | None, headers: dict | None = None) -> SpanContext | None:
    """The parent for engine spans: the ``kvtrace.traceparent`` the proxy put inside
    ``kv_transfer_params``, else the request's own ``traceparent`` header, else None."""
    entry = (kv_params or {}).get(sc.KV_PARAMS_KEY) or {}
    value = None
    if isinstance(entry, dict) and entry.get(sc.CTX_TRACEPARENT):
        value = entry[sc.CTX_TRACEPARENT]
    elif headers:
        value = next((v for k, v in headers.items() if str(k).lower() == "traceparent"), None)
    return _parse_traceparent(str(value)) if value else None
