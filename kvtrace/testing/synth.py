"""Hand-built trace stores with exact timestamps, written through the real span pipeline.

:class:`SpanBuilder` makes spans with the OpenTelemetry SDK at given times (ms offsets from a
base), one TracerProvider per (service, resource) as real components do, and writes them with
:func:`kvtrace.store.convert.spans_to_table` into the store's Parquet layout.  The analysis tests
use it to build traces with known answers; :meth:`SpanBuilder.call` builds the whole span tree of
one LLM call (agent → proxy → P/D engines → decisions, transfers, retention) for dashboard tests.

This module keeps the core and the agent-side helpers; the proxy- and engine-side builders are a
mixin in :mod:`kvtrace.testing.synth_engine`, and whole stores (:func:`sample_store`,
:func:`write_table`, :func:`tile`) are in :mod:`kvtrace.testing.stores`, to keep each module
short.  What callers import from those two (the service names, the store functions) is
re-exported here, where tests, benchmarks and scripts have always imported it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from kvtrace import semconv as sc

# re-exported (``X as X``): callers import these from kvtrace.testing.synth, where they were defined
from kvtrace.testing.stores import SAMPLE_PAUSE_MS as SAMPLE_PAUSE_MS
from kvtrace.testing.stores import TILED_IDS as TILED_IDS
from kvtrace.testing.stores import sample_store as sample_store
from kvtrace.testing.stores import tile as tile
from kvtrace.testing.stores import write_table as write_table
from kvtrace.testing.synth_engine import PROXY as PROXY
from kvtrace.testing.synth_engine import SIM_D as SIM_D
from kvtrace.testing.synth_engine import SIM_P as SIM_P
from kvtrace.testing.synth_engine import EngineSpans

BASE_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
AGENT = "kvtrace-agent"
_KIND = {k.name: k for k in SpanKind}


@dataclass
class Call:
    """Spans of one LLM call made by :meth:`SpanBuilder.call`."""

    llm: object
    request: object
    retention: object | None


class SpanBuilder(EngineSpans):
    """Spans at exact times.  ``ms(x)`` = ``base_ns + x`` ms; pass offsets in ms everywhere."""

    def __init__(self, base_ns: int = BASE_NS) -> None:
        self.base_ns = base_ns
        self.exporter = InMemorySpanExporter()
        self._providers: dict[tuple, TracerProvider] = {}
        self._seq = 1

    def ns(self, ms: float) -> int:
        return self.base_ns + int(round(ms * 1_000_000))

    def _tracer(self, service: str, resource: dict | None):
        key = (service, tuple(sorted((resource or {}).items())))
        provider = self._providers.get(key)
        if provider is None:
            attrs = {sc.SERVICE_NAME: service, **(resource or {})}
            provider = TracerProvider(resource=Resource(attrs))
            provider.add_span_processor(SimpleSpanProcessor(self.exporter))
            self._providers[key] = provider
        return provider.get_tracer("kvtrace.synth")

    def span(
        self,
        name: str,
        start_ms: float,
        end_ms: float,
        *,
        parent=None,
        service: str = AGENT,
        kind: str = "INTERNAL",
        attrs: dict | None = None,
        events: dict[str, float] | None = None,
        resource: dict | None = None,
        error: bool = False,
        ok: bool = False,
    ):
        """A finished span; ``parent`` None starts a new trace.  ``events``: name → time (ms).
        ``kind``: a :class:`~opentelemetry.trace.SpanKind` name; ``error`` / ``ok``: its status."""
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        span = self._tracer(service, resource).start_span(
            name, context=ctx, kind=_KIND[kind], attributes=attrs or {}, start_time=self.ns(start_ms)
        )
        for ev, at in (events or {}).items():
            span.add_event(ev, timestamp=self.ns(at))
        if error:
            span.set_status(trace.Status(trace.StatusCode.ERROR, "error"))
        elif ok:
            span.set_status(trace.Status(trace.StatusCode.OK))
        span.end(end_time=self.ns(end_ms))
        return span

    # ------------------------------------------------------------------ agent-side helpers
    def session(self, session_id: str, start_ms: float, end_ms: float, *, parent=None, scenario: str = "test"):
        return self.span(
            sc.SPAN_AGENT_SESSION,
            start_ms,
            end_ms,
            parent=parent,
            attrs={
                sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
                sc.GEN_AI_AGENT_NAME: scenario,
                sc.SESSION_ID: session_id,
                sc.GEN_AI_CONVERSATION_ID: session_id,
                sc.AGENT_SCENARIO: scenario,
            },
        )

    def turn(self, session_id: str, turn: int, start_ms: float, end_ms: float, *, parent=None):
        return self.span(
            sc.SPAN_AGENT_TURN, start_ms, end_ms, parent=parent, attrs={sc.SESSION_ID: session_id, sc.TURN_INDEX: turn}
        )

    def llm_call(
        self,
        session_id: str,
        turn: int | None,
        start_ms: float,
        end_ms: float,
        ttft_ms: float | None,
        *,
        parent=None,
        request_id: str | None = None,
        input_tokens: int = 100,
        output_tokens: int = 10,
        outcome: str | None = None,
    ):
        attrs = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
            sc.GEN_AI_REQUEST_MODEL: "qwen3-32b",
            sc.SESSION_ID: session_id,
            sc.GEN_AI_CONVERSATION_ID: session_id,
            sc.GEN_AI_USAGE_INPUT_TOKENS: input_tokens,
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: output_tokens,
        }
        if turn is not None:
            attrs[sc.TURN_INDEX] = turn
        if ttft_ms is not None:
            attrs[sc.LLM_TTFT_MS] = float(ttft_ms)
        if request_id:
            attrs[sc.GEN_AI_REQUEST_ID] = request_id
        if outcome:
            attrs[sc.KV_OUTCOME] = outcome
        return self.span(sc.SPAN_AGENT_LLM_CALL, start_ms, end_ms, parent=parent, kind="CLIENT", attrs=attrs)

    def tool(
        self, session_id: str, turn: int | None, start_ms: float, end_ms: float, *, parent=None, name: str = "run_tests"
    ):
        attrs = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
            sc.GEN_AI_TOOL_NAME: name,
            sc.GEN_AI_TOOL_CALL_ID: f"call-{start_ms}",
            sc.SESSION_ID: session_id,
        }
        if turn is not None:
            attrs[sc.TURN_INDEX] = turn
        return self.span(sc.SPAN_AGENT_TOOL_CALL, start_ms, end_ms, parent=parent, attrs=attrs)

    def app_work(
        self, session_id: str, turn: int | None, start_ms: float, end_ms: float, *, parent=None, name: str = "plan"
    ):
        attrs = {sc.AGENT_WORK_NAME: name, sc.SESSION_ID: session_id}
        if turn is not None:
            attrs[sc.TURN_INDEX] = turn
        return self.span(sc.SPAN_AGENT_APP_WORK, start_ms, end_ms, parent=parent, attrs=attrs)

    def user_pause(
        self,
        session_id: str,
        turn: int | None,
        start_ms: float,
        end_ms: float,
        *,
        parent=None,
        reason: str | None = "think",
    ):
        attrs = {sc.SESSION_ID: session_id, **({sc.AGENT_PAUSE_REASON: reason} if reason else {})}
        if turn is not None:
            attrs[sc.TURN_INDEX] = turn
        return self.span(sc.SPAN_AGENT_USER_PAUSE, start_ms, end_ms, parent=parent, attrs=attrs)

    def call(
        self,
        session_id: str,
        turn: int,
        request_id: str,
        start_ms: float,
        *,
        parent=None,
        prompt: int = 1000,
        local_hit: int = 0,
        remote: int = 0,
        pulled: int = 0,
        outcome: str | None = None,
        prefill_ms: float = 100.0,
        xfer_ms: float = 0.0,
        decode_ms: float = 200.0,
        output_tokens: int = 20,
        retention_end_ms: float | None = None,
        retention_outcome: str = sc.RETENTION_READ,
        p_engine: str = "sim-p0",
        d_engine: str = "sim-d0",
        request_attrs: dict | None = None,
        decision_attrs: dict | None = None,
    ) -> Call:
        """One LLM call's full tree.  Times: P's prefill (including ``xfer_ms`` of pulling) takes
        ``prefill_ms``, then D pulls P's blocks (5 ms), first token, decode for ``decode_ms``.
        ``request_attrs`` / ``decision_attrs``: more attributes of the proxy's request span / P's decision."""
        ttft = prefill_ms + 10.0
        end = start_ms + ttft + decode_ms
        llm, req = self._client_spans(
            session_id,
            turn,
            request_id,
            start_ms,
            end,
            ttft,
            parent=parent,
            prompt=prompt,
            remote=remote,
            pulled=pulled,
            outcome=outcome,
            output_tokens=output_tokens,
            request_attrs=request_attrs,
        )
        ident = {sc.GEN_AI_REQUEST_ID: request_id, sc.SESSION_ID: session_id, sc.TURN_INDEX: turn}
        t = start_ms + 1
        self._prefill_leg(
            req,
            ident,
            t,
            prefill_ms=prefill_ms,
            xfer_ms=xfer_ms,
            prompt=prompt,
            local_hit=local_hit,
            remote=remote,
            pulled=pulled,
            outcome=outcome,
            p_engine=p_engine,
            d_engine=d_engine,
            decision_attrs=decision_attrs,
        )
        ret = self._decode_leg(
            req,
            ident,
            t + prefill_ms,
            end,
            prompt=prompt,
            output_tokens=output_tokens,
            p_engine=p_engine,
            d_engine=d_engine,
            retention_end_ms=retention_end_ms,
            retention_outcome=retention_outcome,
        )
        return Call(llm, req, ret)

    def _client_spans(
        self,
        session_id: str,
        turn: int,
        request_id: str,
        start_ms: float,
        end: float,
        ttft: float,
        *,
        parent,
        prompt: int,
        remote: int,
        pulled: int,
        outcome: str | None,
        output_tokens: int,
        request_attrs: dict | None,
    ):
        """:meth:`call`'s agent LLM-call span and, under it, the proxy's request span (a little inside
        the call, as a server's span is inside its client's)."""
        llm = self.llm_call(
            session_id,
            turn,
            start_ms,
            end + 1,
            ttft + 1,
            parent=parent,
            request_id=request_id,
            input_tokens=prompt,
            output_tokens=output_tokens,
            outcome=outcome,
        )
        req = self.request(
            session_id,
            turn,
            request_id,
            start_ms + 0.5,
            end + 0.5,
            ttft,
            parent=llm,
            offered=remote > 0,
            offer_reason=sc.OFFER_OFFERED if remote else sc.OFFER_NO_ENTRY,
            outcome=outcome,
            pulled=pulled,
            input_tokens=prompt,
            output_tokens=output_tokens,
            extra=request_attrs,
        )
        return llm, req

    def write(self, directory: str | os.PathLike, writer: str = "synth") -> int:
        """Write every finished span into ``directory`` (Hive date/hour partitions); returns the count."""
        from kvtrace.store.convert import spans_to_table

        spans = list(self.exporter.get_finished_spans())
        if spans:
            self._seq += len(write_table(spans_to_table(spans), directory, writer, self._seq))
        self.exporter.clear()
        return len(spans)
