"""Per-task agent state: the current session, turn and LLM call, held in ``contextvars``.

:mod:`kvtrace.agent.api` sets these when a ``session()`` / ``turn()`` / ``llm_call()`` scope is
entered and resets them on exit, so every asyncio task (which copies the context when it is
created) and every thread sees its own values: parallel tool calls started with
``asyncio.gather`` inside a turn all see that turn.  Nothing here is process-global state a test
would have to reset.

:func:`request_headers` and :func:`extra_body` are what an HTTP client sends so the proxy joins
the request to the agent's trace and conversation (``traceparent`` header, ``X-Session-ID``
header, W3C ``baggage`` with ``session.id``, body ``conversation_id``).
"""

from __future__ import annotations

import itertools
import threading
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kvtrace import semconv as sc

_tracecontext = TraceContextTextMapPropagator()
_baggage = W3CBaggagePropagator()


@dataclass
class SessionState:
    """One open session.  ``next_turn`` hands out turn indexes (thread-safe)."""

    session_id: str
    agent: Any  # kvtrace.agent.api.Agent
    agent_name: str
    scenario: str | None = None
    span: Any = None
    last_kv_transfer: dict | None = None
    _counter: Any = field(default_factory=itertools.count, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def next_turn(self) -> int:
        with self._lock:
            return next(self._counter)

    def reserve_turn(self, index: int) -> None:
        """An explicit ``turn(index)`` moves the auto-increment past ``index``."""
        with self._lock:
            peek = next(self._counter)
            self._counter = itertools.count(max(peek, index + 1))


@dataclass
class TurnState:
    index: int
    span: Any = None


_session: ContextVar[SessionState | None] = ContextVar("kvtrace_agent_session", default=None)
_turn: ContextVar[TurnState | None] = ContextVar("kvtrace_agent_turn", default=None)
_call: ContextVar[Any] = ContextVar("kvtrace_agent_llm_call", default=None)
_last_result: ContextVar[Any] = ContextVar("kvtrace_agent_last_result", default=None)


def current_session() -> SessionState | None:
    """The session open in this task, or None."""
    return _session.get()


def current_turn() -> TurnState | None:
    """The turn open in this task, or None."""
    return _turn.get()


def current_session_id(ctx: otel_context.Context | None = None) -> str | None:
    """Session id of the open session, else the ``session.id`` baggage entry, else None."""
    state = _session.get()
    if state is not None:
        return state.session_id
    value = baggage.get_baggage(sc.BAGGAGE_SESSION_ID, ctx)
    return str(value) if value else None


def last_result():
    """:class:`~kvtrace.agent.llm.LLMResult` of the last traced LLM call finished in this
    task (or in the open session, from any task), or None."""
    return _last_result.get()


def last_kv_transfer() -> dict | None:
    """The ``kv_transfer`` object the proxy returned for the last traced LLM call of this task
    (or of the open session), or None when the endpoint sent none."""
    result = _last_result.get()
    if result is not None:
        return result.kv_transfer
    state = _session.get()
    return state.last_kv_transfer if state is not None else None


def request_headers(ctx: otel_context.Context | None = None) -> dict[str, str]:
    """Headers that join an HTTP request to the current trace and session.

    ``traceparent`` (and ``tracestate``) of the current span -- inside ``llm_call()`` that is the
    LLM-call span; ``baggage`` (carries ``session.id`` inside a session); ``X-Session-ID`` inside
    a session; ``X-Request-Id`` when the open LLM call was given a request id.
    """
    carrier: dict[str, str] = {}
    _tracecontext.inject(carrier, ctx)
    _baggage.inject(carrier, ctx)
    sid = current_session_id(ctx)
    if sid:
        carrier[sc.HEADER_SESSION_ID] = sid
    call = _call.get()
    if call is not None and call.request_id:
        carrier[sc.HEADER_REQUEST_ID] = call.request_id
    return carrier


def extra_body() -> dict[str, str]:
    """Body fields for the proxy: ``{"conversation_id": session_id}`` inside a session, else {}."""
    sid = current_session_id()
    return {sc.BODY_CONVERSATION_ID: sid} if sid else {}
