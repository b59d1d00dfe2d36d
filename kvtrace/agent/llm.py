"""One traced LLM call: the ``kvtrace.agent.llm_call`` CLIENT span and its measurements.

Created by ``Agent.llm_call()`` (manual use with any HTTP client) and by the ``openai`` wrapper
(:mod:`kvtrace.agent.openai_wrap`).  The caller reports what it sees -- :meth:`LLMCall.observe`
for each streamed piece, :meth:`LLMCall.finish` at the end (usage, ``kv_transfer``, finish
reasons) or :meth:`LLMCall.fail` -- and the call turns it into span attributes and an
:class:`LLMResult` (TTFT, TPOT, latency, tokens, reuse outcome).  Every method is idempotent
after the span has ended and never raises into the caller.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from kvtrace import semconv as sc
from kvtrace.agent import context as actx
from kvtrace.agent.scopes import record_error, reset_var

log = logging.getLogger(__name__)

# error.type of a stream the caller stopped reading before the end
ERROR_STREAM_INTERRUPTED = sc.ERROR_STREAM_INTERRUPTED


@dataclass
class LLMResult:
    """What one LLM call measured (times in ms; None when not observed)."""

    session_id: str | None
    turn: int | None
    trace_id: str
    stream: bool
    start_ns: int
    latency_ms: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None  # gen_ai.usage.cache_read.input_tokens (part of input_tokens)
    chunks: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    kv_transfer: dict | None = None
    error: str | None = None
    interrupted: bool = False
    text: str = ""

    @property
    def outcome(self) -> str | None:
        """P's reuse decision from ``kv_transfer`` (pulled, below_threshold, ...), or None."""
        kvt = self.kv_transfer or {}
        return kvt.get(sc.KVT_DECISION)

    @property
    def pulled_tokens(self) -> int | None:
        kvt = self.kv_transfer or {}
        value = kvt.get(sc.KVT_PULLED_TOKENS)
        return int(value) if isinstance(value, (int, float)) else None


def _ms(ns: int) -> float:
    return ns / 1e6


class LLMCall:
    """The span and clock of one request.  Enter it (``with``) to make the span current while
    you send the request, or call :meth:`start` and :meth:`activate` yourself."""

    def __init__(
        self,
        agent,
        *,
        model: str | None = None,
        operation: str = sc.OP_CHAT,
        stream: bool = False,
        max_tokens: int | None = None,
        request_id: str | None = None,
        server_address: str | None = None,
        server_port: int | None = None,
        input_messages: Any = None,
    ) -> None:
        self.agent = agent
        self.request_id = request_id
        self._attrs: dict[str, Any] = {
            sc.GEN_AI_OPERATION_NAME: operation,
            sc.GEN_AI_PROVIDER_NAME: sc.PROVIDER_VLLM,
            sc.OPENINFERENCE_SPAN_KIND: sc.OI_LLM,
            sc.REQUEST_STREAM: bool(stream),
        }
        session, turn = actx.current_session(), actx.current_turn()
        self.session = session
        if model:
            self._attrs[sc.GEN_AI_REQUEST_MODEL] = model
        if max_tokens is not None:
            self._attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] = int(max_tokens)
        if session is not None:
            self._attrs[sc.SESSION_ID] = session.session_id
            self._attrs[sc.GEN_AI_CONVERSATION_ID] = session.session_id
        if turn is not None:
            self._attrs[sc.TURN_INDEX] = turn.index
        if request_id:
            self._attrs[sc.GEN_AI_REQUEST_ID] = request_id
        if server_address:
            self._attrs[sc.SERVER_ADDRESS] = server_address
        if server_port is not None:
            self._attrs[sc.SERVER_PORT] = int(server_port)
        if input_messages is not None and agent.capture_content:
            self._attrs[sc.GEN_AI_INPUT_MESSAGES] = _to_json(input_messages)
        self.span: trace.Span | None = None
        self.result: LLMResult | None = None
        self._first_ns: int | None = None
        self._last_ns: int | None = None
        self._text: list[str] = []
        self._ended = False
        self._tokens: list[object] = []

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> LLMCall:
        """Start the span (child of the current context) and the clock."""
        self.span = self.agent.tracer.start_span(sc.SPAN_AGENT_LLM_CALL, kind=SpanKind.CLIENT, attributes=self._attrs)
        ctx = self.span.get_span_context()
        self.result = LLMResult(
            session_id=self.session.session_id if self.session else None,
            turn=self._attrs.get(sc.TURN_INDEX),
            trace_id=format(ctx.trace_id, "032x"),
            stream=bool(self._attrs[sc.REQUEST_STREAM]),
            start_ns=time.time_ns(),
        )
        self._t0 = time.perf_counter_ns()
        return self

    def context(self) -> otel_context.Context:
        """The current context with this call's span as the active span."""
        return trace.set_span_in_context(self.span) if self.span is not None else otel_context.get_current()

    def headers(self) -> dict[str, str]:
        """``request_headers()`` for this call (its span is the traceparent)."""
        token = actx._call.set(self)
        try:
            return actx.request_headers(self.context())
        finally:
            actx._call.reset(token)

    def extra_body(self) -> dict[str, str]:
        return actx.extra_body()

    def __enter__(self) -> LLMCall:
        if self.span is None:
            self.start()
        self._tokens.append(otel_context.attach(self.context()))
        self._tokens.append(actx._call.set(self))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        call_token = self._tokens.pop() if self._tokens else None
        reset_var(actx._call, call_token)
        for token in self._tokens:
            try:
                otel_context.detach(token)  # type: ignore[arg-type]
            except Exception:
                log.debug("kvtrace: context detach failed", exc_info=True)
        self._tokens.clear()
        if exc is not None:
            self.fail(exc)
        else:
            self.finish()

    async def __aenter__(self) -> LLMCall:
        return self.__enter__()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        self.__exit__(exc_type, exc, tb)

    # -- observations ------------------------------------------------------------------
    def observe(self, text: str | None = None, *, content: bool = True) -> None:
        """A streamed piece arrived; ``content`` = it carries generated output (counts for TTFT)."""
        if self._ended or not content:
            return
        now = time.perf_counter_ns()
        if self._first_ns is None:
            self._first_ns = now
        self._last_ns = now
        if self.result is not None:
            self.result.chunks += 1
        if text:
            self._text.append(text)

    def first_token(self) -> None:
        """Manual use: mark the first token now."""
        self.observe(content=True)

    def finish(
        self,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        kv_transfer: dict | None = None,
        finish_reasons: list[str] | None = None,
        output_text: str | None = None,
        interrupted: bool = False,
        cached_tokens: int | None = None,
    ) -> LLMResult | None:
        """End the span with what was measured.  ``interrupted``: the caller stopped reading.
        ``cached_tokens``: the usage's ``prompt_tokens_details.cached_tokens``; the ``kv_transfer``
        object's local hit + pulled tokens take precedence (P's view, where D's usage is not)."""
        if self._ended:
            return self.result
        self._ended = True
        try:
            return self._finish(
                input_tokens, output_tokens, kv_transfer, finish_reasons, output_text, interrupted, cached_tokens
            )
        except Exception:
            log.exception("kvtrace: finishing an llm_call span failed")
            return self.result
        finally:
            if self.span is not None:
                self.span.end()

    def fail(self, exc: BaseException, **measured) -> LLMResult | None:
        """End the span as failed (status ERROR, ``error.type``), keeping what was measured."""
        if self._ended:
            return self.result
        if self.span is not None:
            record_error(self.span, exc)
        if self.result is not None:
            self.result.error = type(exc).__qualname__
        return self.finish(**measured)

    def _finish(
        self, input_tokens, output_tokens, kv_transfer, finish_reasons, output_text, interrupted, cached_tokens=None
    ):
        result, span = self.result, self.span
        if result is None or span is None:
            return None
        end = time.perf_counter_ns()
        result.latency_ms = _ms(end - self._t0)
        text = output_text if output_text is not None else "".join(self._text)
        result.text = text
        if output_tokens is None and result.stream and result.chunks:
            output_tokens = result.chunks
        attrs: dict[str, Any] = {sc.REQUEST_LATENCY_MS: result.latency_ms}
        if self._first_ns is not None:
            result.ttft_ms = _ms(self._first_ns - self._t0)
            attrs[sc.LLM_TTFT_MS] = result.ttft_ms
            attrs[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = result.ttft_ms / 1000.0  # the GenAI unit: s
            if output_tokens and output_tokens > 1 and self._last_ns is not None:
                result.tpot_ms = _ms(self._last_ns - self._first_ns) / (output_tokens - 1)
                attrs[sc.LLM_TPOT_MS] = result.tpot_ms
        if input_tokens is not None:
            result.input_tokens = int(input_tokens)
            attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] = result.input_tokens
        if output_tokens is not None:
            result.output_tokens = int(output_tokens)
            attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = result.output_tokens
        if finish_reasons:
            result.finish_reasons = [str(r) for r in finish_reasons]
            attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = result.finish_reasons
        if isinstance(cached_tokens, int) and not isinstance(cached_tokens, bool):
            attrs[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = int(cached_tokens)
        if isinstance(kv_transfer, dict):
            result.kv_transfer = kv_transfer
            attrs.update(kv_attributes(kv_transfer))
            if self.session is not None:
                self.session.last_kv_transfer = kv_transfer
        result.cached_tokens = attrs.get(sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS)
        if self.agent.capture_content and text:
            attrs[sc.GEN_AI_OUTPUT_MESSAGES] = _to_json([{"role": "assistant", "content": text}])
        if interrupted and result.error is None:
            result.interrupted = True
            result.error = ERROR_STREAM_INTERRUPTED
            record_error(span, _Interrupted("stream closed before the end"), ERROR_STREAM_INTERRUPTED)
        span.set_attributes(attrs)
        actx._last_result.set(result)
        return result


class _Interrupted(Exception):
    pass


def kv_attributes(kvt: dict) -> dict[str, Any]:
    """llm_call span attributes from a proxy ``kv_transfer`` object."""
    out: dict[str, Any] = {}
    decision = kvt.get(sc.KVT_DECISION)
    if isinstance(decision, str):
        out[sc.KV_OUTCOME] = decision
    pulled = kvt.get(sc.KVT_PULLED_TOKENS)
    if isinstance(pulled, (int, float)) and not isinstance(pulled, bool):
        out[sc.KV_PULLED_TOKENS] = int(pulled)
    request_id = kvt.get(sc.KVT_REQUEST_ID)
    if isinstance(request_id, str) and request_id:
        out[sc.GEN_AI_REQUEST_ID] = request_id
    local = kvt.get(sc.KVT_LOCAL_HIT_TOKENS)
    if _count(local) is not None and _count(pulled) is not None:  # P's view: local prefix hit + pulled from D
        out[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = _count(local) + _count(pulled)
    return out


def _count(v: object) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _to_json(value: Any) -> str:
    try:
        return json.dumps(value, default=str, ensure_ascii=False)
    except Exception:
        return str(value)
