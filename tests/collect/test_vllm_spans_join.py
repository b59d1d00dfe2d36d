"""vLLM's own llm_request spans, received by kvtrace collect, join kvtrace's requests in the
``vllm_requests`` view (by parent link to the proxy leg, else by request id)."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, set_span_in_context

from kvtrace import semconv as sc
from kvtrace.collect.server import Collector
from kvtrace.store import connect
from kvtrace.store.views import vllm


def _provider(port: int, service: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource({sc.SERVICE_NAME: service}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")))
    return provider


def _vllm_span(tracer, request_id: str, *, parent_span=None, prompt: int, completion: int, queue_s: float):
    ctx = set_span_in_context(parent_span) if parent_span is not None else None
    attrs = {
        sc.GEN_AI_REQUEST_ID: request_id,
        sc.GEN_AI_RESPONSE_MODEL: "qwen",
        sc.GEN_AI_USAGE_PROMPT_TOKENS: prompt,
        sc.GEN_AI_USAGE_COMPLETION_TOKENS: completion,
        sc.VLLM_LATENCY_TIME_IN_QUEUE: queue_s,
        sc.VLLM_LATENCY_TIME_TO_FIRST_TOKEN: 0.25,
        sc.VLLM_LATENCY_E2E: 1.5,
        sc.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: 0.125,
        sc.VLLM_LATENCY_TIME_IN_MODEL_DECODE: 1.0,
        sc.VLLM_LATENCY_TIME_IN_MODEL_INFERENCE: 1.125,
    }
    tracer.start_span(sc.SPAN_VLLM_LLM_REQUEST, context=ctx, kind=SpanKind.SERVER, attributes=attrs).end()


@pytest.fixture
def store(tmp_path):
    with Collector(tmp_path / "t", http_address="127.0.0.1:0") as c:
        proxy = _provider(c.http_port, "kvtrace-proxy")
        vllm = _provider(c.http_port, "vllm")
        pt, vt = proxy.get_tracer("kvtrace.proxy"), vllm.get_tracer("vllm")
        # request A: one trace, P and D legs; vLLM on P and D continue the legs' traceparent
        ident = {sc.GEN_AI_REQUEST_ID: "req-a", sc.SESSION_ID: "sess-1", sc.TURN_INDEX: 0}
        with pt.start_as_current_span(sc.SPAN_PROXY_REQUEST, kind=SpanKind.SERVER, attributes=ident) as req_a:
            with pt.start_as_current_span(sc.SPAN_PROXY_PREFILL, kind=SpanKind.CLIENT, attributes=ident) as p_leg:
                _vllm_span(vt, "cmpl-req-a-0", parent_span=p_leg, prompt=100, completion=1, queue_s=0.002)
            with pt.start_as_current_span(sc.SPAN_PROXY_DECODE, kind=SpanKind.CLIENT, attributes=ident) as d_leg:
                _vllm_span(vt, "cmpl-req-a-0", parent_span=d_leg, prompt=100, completion=20, queue_s=0.001)
        # request B (turn 1), same session; vLLM ran without trace context: joined by request id
        ident_b = {sc.GEN_AI_REQUEST_ID: "req-b", sc.SESSION_ID: "sess-1", sc.TURN_INDEX: 1}
        with pt.start_as_current_span(sc.SPAN_PROXY_REQUEST, kind=SpanKind.SERVER, attributes=ident_b) as req_b:
            pass
        _vllm_span(vt, "chatcmpl-req-b-9f1c", prompt=150, completion=7, queue_s=0.004)
        # a vLLM request no kvtrace request knows about
        _vllm_span(vt, "chatcmpl-unrelated", prompt=5, completion=5, queue_s=0.0)
        proxy.shutdown()
        vllm.shutdown()
        assert c.flush(30)
        ids = {
            "a": format(req_a.get_span_context().span_id, "016x"),
            "b": format(req_b.get_span_context().span_id, "016x"),
            "p_leg": format(p_leg.get_span_context().span_id, "016x"),
            "d_leg": format(d_leg.get_span_context().span_id, "016x"),
        }
    return connect(tmp_path / "t"), ids


def test_vllm_requests_view_joins_by_parent_and_by_request_id(store):
    con, ids = store
    cols = [d[0] for d in con.execute("SELECT * FROM vllm_requests LIMIT 0").description]
    assert tuple(cols) == vllm.VLLM_REQUESTS.column_names
    rows = con.execute(
        "SELECT vllm_request_id, request_id, session_id, turn, leg, matched_by, proxy_span_id, parent_span_id,"
        " prompt_tokens, completion_tokens, queue_ms, ttft_ms, e2e_ms, prefill_ms, decode_ms, inference_ms,"
        " service_name, model FROM vllm_requests ORDER BY vllm_request_id, leg"
    ).fetchall()
    assert rows == [
        (
            "chatcmpl-req-b-9f1c",
            "req-b",
            "sess-1",
            1,
            None,
            "request_id",
            ids["b"],
            "",
            150,
            7,
            4.0,
            250.0,
            1500.0,
            125.0,
            1000.0,
            1125.0,
            "vllm",
            "qwen",
        ),
        (
            "chatcmpl-unrelated",
            None,
            None,
            None,
            None,
            None,
            None,
            "",
            5,
            5,
            0.0,
            250.0,
            1500.0,
            125.0,
            1000.0,
            1125.0,
            "vllm",
            "qwen",
        ),
        (
            "cmpl-req-a-0",
            "req-a",
            "sess-1",
            0,
            sc.ROLE_DECODE,
            "parent",
            ids["a"],
            ids["d_leg"],
            100,
            20,
            1.0,
            250.0,
            1500.0,
            125.0,
            1000.0,
            1125.0,
            "vllm",
            "qwen",
        ),
        (
            "cmpl-req-a-0",
            "req-a",
            "sess-1",
            0,
            sc.ROLE_PREFILL,
            "parent",
            ids["a"],
            ids["p_leg"],
            100,
            1,
            2.0,
            250.0,
            1500.0,
            125.0,
            1000.0,
            1125.0,
            "vllm",
            "qwen",
        ),
    ]


def test_vllm_requests_on_an_empty_store(tmp_path):
    con = connect(tmp_path / "none", allow_empty=True)
    assert con.execute("SELECT count(*) FROM vllm_requests").fetchone() == (0,)
