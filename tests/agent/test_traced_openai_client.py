"""The traced ``openai`` client: headers/body sent, TTFT/tokens/kv_transfer recorded,
interrupted streams end their span.  The endpoint is an httpx2 MockTransport (no sockets)."""

from __future__ import annotations

import gc
import json

import httpx2
import openai
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from kvtrace import semconv as sc
from kvtrace.agent import (
    ERROR_STREAM_INTERRUPTED,
    Agent,
    TracedAsyncOpenAI,
    TracedOpenAI,
    instrument_openai,
    kv_transfer_of,
    last_kv_transfer,
    last_result,
)

KVT = {
    sc.KVT_REQUEST_ID: "req-1",
    sc.KVT_DECISION: sc.OUTCOME_PULLED,
    sc.KVT_PULLED_TOKENS: 128,
    sc.KVT_OFFERED: True,
    sc.KVT_OFFER_REASON: sc.OFFER_OFFERED,
}
PIECES = ["alpha ", "beta ", "gamma ", "delta "]


def _chunk(delta: dict | None = None, finish=None, **extra) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": choices, **extra}


def sse(body: dict) -> list[bytes]:
    opts = body.get("stream_options") or {}
    usage = {"prompt_tokens": 40, "completion_tokens": len(PIECES), "total_tokens": 40 + len(PIECES)}
    events = [_chunk({"role": "assistant", "content": ""})]
    events += [_chunk({"content": p}) for p in PIECES]
    if opts.get("include_usage"):
        events.append(_chunk({}, "length"))
        events.append(_chunk(None, usage=usage, kv_transfer=KVT))
    else:
        events.append(_chunk({}, "length", kv_transfer=KVT))
    return [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]


def completion_body(body: dict) -> dict:
    if "messages" in body:
        return {
            "id": "r",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "".join(PIECES)}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 40, "completion_tokens": 4, "total_tokens": 44},
            sc.RESPONSE_KV_TRANSFER: KVT,
        }
    return {
        "id": "r",
        "object": "text_completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "text": "".join(PIECES), "finish_reason": "length", "logprobs": None}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11},
        sc.RESPONSE_KV_TRANSFER: KVT,
    }


class Endpoint:
    """Records requests; answers JSON or SSE.  ``endless``: the stream never ends by itself."""

    def __init__(self, status: int = 200, endless: bool = False) -> None:
        self.requests: list[tuple[dict, dict]] = []
        self.status = status
        self.endless = endless

    def _parse(self, request):
        body = json.loads(request.content)
        self.requests.append(({k.lower(): v for k, v in request.headers.items()}, body))
        return body

    def _events(self, body):
        events = sse(body)
        if self.endless:
            events = events[:-3]
        return events

    def sync(self, request: httpx2.Request) -> httpx2.Response:
        body = self._parse(request)
        if self.status != 200:
            return httpx2.Response(self.status, json={"error": {"message": "boom", "type": "x", "code": 1}})
        if body.get("stream"):
            events = self._events(body)

            def gen():
                yield from events
                while self.endless:
                    yield _chunk_bytes()

            return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=gen())
        return httpx2.Response(200, json=completion_body(body))

    async def async_(self, request: httpx2.Request) -> httpx2.Response:
        body = self._parse(request)
        if body.get("stream"):
            events = self._events(body)

            async def agen():
                for e in events:
                    yield e
                while self.endless:
                    yield _chunk_bytes()

            return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=agen())
        return httpx2.Response(200, json=completion_body(body))


def _chunk_bytes() -> bytes:
    return f"data: {json.dumps(_chunk({'content': 'more '}))}\n\n".encode()


def sync_client(endpoint, provider):
    http = httpx2.Client(transport=httpx2.MockTransport(endpoint.sync))
    return TracedOpenAI(
        base_url="http://127.0.0.1:8123/v1", api_key="k", http_client=http, max_retries=0, tracer_provider=provider
    )


def async_client(endpoint, provider):
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(endpoint.async_))
    return TracedAsyncOpenAI(
        base_url="http://127.0.0.1:8123/v1", api_key="k", http_client=http, max_retries=0, tracer_provider=provider
    )


def llm_span(exporter):
    spans = [s for s in exporter.get_finished_spans() if s.name == sc.SPAN_AGENT_LLM_CALL]
    assert len(spans) == 1
    return spans[0]


def split_timing(attrs: dict) -> dict:
    attrs = dict(attrs)
    timing = {k: attrs.pop(k) for k in (sc.REQUEST_LATENCY_MS, sc.LLM_TTFT_MS, sc.LLM_TPOT_MS) if k in attrs}
    assert all(isinstance(v, float) and v >= 0 for v in timing.values())
    return attrs, timing


def traceparent_of(span) -> str:
    ctx = span.context
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def test_non_streaming_chat_in_session(tracer_provider, span_exporter):
    endpoint = Endpoint()
    client = sync_client(endpoint, tracer_provider)
    agent = Agent(tracer_provider)
    with agent.session("conv-9"), agent.turn():
        resp = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "secret"}], max_tokens=4)
        assert last_kv_transfer() == KVT
    assert kv_transfer_of(resp) == KVT and resp.model_extra[sc.RESPONSE_KV_TRANSFER] == KVT
    headers, body = endpoint.requests[0]
    span = llm_span(span_exporter)
    assert headers["traceparent"] == traceparent_of(span)
    assert headers[sc.HEADER_SESSION_ID.lower()] == "conv-9"
    assert headers["baggage"] == f"{sc.BAGGAGE_SESSION_ID}=conv-9"
    assert body[sc.BODY_CONVERSATION_ID] == "conv-9"
    assert "stream_options" not in body
    attrs, timing = split_timing(span.attributes)
    assert set(timing) == {sc.REQUEST_LATENCY_MS}  # no TTFT without a stream
    assert attrs == {
        sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
        sc.GEN_AI_PROVIDER_NAME: sc.PROVIDER_VLLM,
        sc.OPENINFERENCE_SPAN_KIND: sc.OI_LLM,
        sc.REQUEST_STREAM: False,
        sc.GEN_AI_REQUEST_MODEL: "m",
        sc.GEN_AI_REQUEST_MAX_TOKENS: 4,
        sc.SESSION_ID: "conv-9",
        sc.GEN_AI_CONVERSATION_ID: "conv-9",
        sc.TURN_INDEX: 0,
        sc.SERVER_ADDRESS: "127.0.0.1",
        sc.SERVER_PORT: 8123,
        sc.GEN_AI_USAGE_INPUT_TOKENS: 40,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 4,
        sc.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",),
        sc.KV_OUTCOME: sc.OUTCOME_PULLED,
        sc.KV_PULLED_TOKENS: 128,
        sc.GEN_AI_REQUEST_ID: "req-1",
    }
    assert span.kind == SpanKind.CLIENT
    turn = next(s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_AGENT_TURN)
    assert span.parent.span_id == turn.context.span_id


def test_streaming_chat_records_ttft_usage_and_kv_transfer(tracer_provider, span_exporter):
    endpoint = Endpoint()
    client = sync_client(endpoint, tracer_provider)
    with Agent(tracer_provider).session("s2"):
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "".join(PIECES)
    _, body = endpoint.requests[0]
    assert body["stream_options"] == {"include_usage": True}
    assert stream.kv_transfer == KVT
    result = stream.result
    assert (result.input_tokens, result.output_tokens, result.chunks) == (40, 4, 4)
    assert result.outcome == sc.OUTCOME_PULLED and result.pulled_tokens == 128
    assert result.error is None and not result.interrupted and result.text == text
    assert last_result() is result
    span = llm_span(span_exporter)
    attrs, timing = split_timing(span.attributes)
    assert set(timing) == {sc.REQUEST_LATENCY_MS, sc.LLM_TTFT_MS, sc.LLM_TPOT_MS}
    assert timing[sc.LLM_TTFT_MS] <= timing[sc.REQUEST_LATENCY_MS]
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 4 and attrs[sc.KV_OUTCOME] == sc.OUTCOME_PULLED
    assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)
    assert span.status.status_code == StatusCode.UNSET


def test_caller_stream_options_respected_and_kvt_on_finish_chunk(tracer_provider, span_exporter):
    endpoint = Endpoint()
    client = sync_client(endpoint, tracer_provider)
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], stream=True, stream_options={"include_usage": False}
    )
    list(stream)
    _, body = endpoint.requests[0]
    assert body["stream_options"] == {"include_usage": False}
    assert sc.BODY_CONVERSATION_ID not in body  # outside a session
    assert stream.kv_transfer == KVT
    assert stream.result.output_tokens == 4  # counted from content chunks without usage
    headers, _ = endpoint.requests[0]
    assert sc.HEADER_SESSION_ID.lower() not in headers and "traceparent" in headers


def test_interrupted_sync_stream_ends_span_with_error(tracer_provider, span_exporter):
    endpoint = Endpoint(endless=True)
    client = sync_client(endpoint, tracer_provider)
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    assert span_exporter.get_finished_spans() == ()
    stream.close()
    span = llm_span(span_exporter)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes[sc.ERROR_TYPE] == ERROR_STREAM_INTERRUPTED
    assert sc.LLM_TTFT_MS in span.attributes and sc.KV_OUTCOME not in span.attributes
    assert stream.result.interrupted and stream.kv_transfer is None


def test_abandoned_stream_ends_span_when_collected(tracer_provider, span_exporter):
    endpoint = Endpoint(endless=True)
    client = sync_client(endpoint, tracer_provider)
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
    next(stream)
    del stream
    gc.collect()
    assert llm_span(span_exporter).attributes[sc.ERROR_TYPE] == ERROR_STREAM_INTERRUPTED


def test_stream_context_manager_closes(tracer_provider, span_exporter):
    client = sync_client(Endpoint(endless=True), tracer_provider)
    with client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True) as stream:
        next(stream)
    assert llm_span(span_exporter).attributes[sc.ERROR_TYPE] == ERROR_STREAM_INTERRUPTED


def test_http_error_marks_span_and_propagates(tracer_provider, span_exporter):
    client = sync_client(Endpoint(status=500), tracer_provider)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    span = llm_span(span_exporter)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes[sc.ERROR_TYPE] == "InternalServerError"


def test_text_completion_operation(tracer_provider, span_exporter):
    endpoint = Endpoint()
    client = sync_client(endpoint, tracer_provider)
    resp = client.completions.create(model="m", prompt="hello", max_tokens=4)
    assert resp.choices[0].text == "".join(PIECES)
    span = llm_span(span_exporter)
    assert span.attributes[sc.GEN_AI_OPERATION_NAME] == sc.OP_TEXT_COMPLETION
    assert span.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 7


def test_content_captured_only_on_request(tracer_provider, span_exporter, monkeypatch):
    monkeypatch.delenv("KVTRACE_CAPTURE_CONTENT", raising=False)
    client = sync_client(Endpoint(), tracer_provider)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "secret"}])
    assert not any("secret" in str(v) or "alpha" in str(v) for v in llm_span(span_exporter).attributes.values())
    span_exporter.clear()
    http = httpx2.Client(transport=httpx2.MockTransport(Endpoint().sync))
    capturing = instrument_openai(
        openai.OpenAI(base_url="http://h/v1", api_key="k", http_client=http, max_retries=0),
        agent=Agent(tracer_provider, capture_content=True),
    )
    capturing.chat.completions.create(model="m", messages=[{"role": "user", "content": "secret"}])
    attrs = llm_span(span_exporter).attributes
    assert json.loads(attrs[sc.GEN_AI_INPUT_MESSAGES]) == [{"role": "user", "content": "secret"}]
    assert json.loads(attrs[sc.GEN_AI_OUTPUT_MESSAGES]) == [{"role": "assistant", "content": "".join(PIECES)}]


def test_instrument_is_idempotent(tracer_provider, span_exporter):
    client = sync_client(Endpoint(), tracer_provider)
    assert instrument_openai(client, tracer_provider) is client
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert len(span_exporter.get_finished_spans()) == 1


async def test_async_stream_and_parallel_calls(tracer_provider, span_exporter):
    import asyncio

    endpoint = Endpoint()
    client = async_client(endpoint, tracer_provider)
    agent = Agent(tracer_provider)

    async def call(i):
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": str(i)}], stream=True
        )
        async for _ in stream:
            pass
        return stream

    async with agent.session("as"):
        async with agent.turn():
            streams = await asyncio.gather(*(call(i) for i in range(3)))
    assert all(s.kv_transfer == KVT and s.result.output_tokens == 4 for s in streams)
    spans = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_AGENT_LLM_CALL]
    turn = next(s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_AGENT_TURN)
    assert len(spans) == 3 and all(s.parent.span_id == turn.context.span_id for s in spans)
    sent = sorted(h["traceparent"] for h, _ in endpoint.requests)
    assert sent == sorted(traceparent_of(s) for s in spans)
    assert all(b[sc.BODY_CONVERSATION_ID] == "as" for _, b in endpoint.requests)


async def test_interrupted_async_stream(tracer_provider, span_exporter):
    client = async_client(Endpoint(endless=True), tracer_provider)
    stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
    n = 0
    async for _ in stream:
        n += 1
        if n == 3:
            break
    await stream.close()
    span = llm_span(span_exporter)
    assert span.attributes[sc.ERROR_TYPE] == ERROR_STREAM_INTERRUPTED
    assert span.status.status_code == StatusCode.ERROR
    assert stream.result.chunks == 2  # the role-only first chunk carries no content


async def test_async_non_stream_sets_last_kv_transfer(tracer_provider, span_exporter):
    client = async_client(Endpoint(), tracer_provider)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert last_kv_transfer() == KVT


def test_broken_tracer_never_breaks_the_call(caplog):
    class BrokenTracer:
        def start_span(self, *a, **k):
            raise RuntimeError("tracer down")

    class BrokenProvider:
        def get_tracer(self, *a, **k):
            return BrokenTracer()

    endpoint = Endpoint()
    http = httpx2.Client(transport=httpx2.MockTransport(endpoint.sync))
    client = instrument_openai(
        openai.OpenAI(base_url="http://h/v1", api_key="k", http_client=http, max_retries=0),
        agent=Agent(BrokenProvider()),
    )
    resp = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert resp.choices[0].message.content == "".join(PIECES)
    headers, body = endpoint.requests[0]
    assert "traceparent" not in headers and sc.BODY_CONVERSATION_ID not in body
    assert "calling untraced" in caplog.text


@pytest.mark.parametrize("stream", [False, True])
def test_cached_prompt_tokens_follow_genai_conventions(tracer_provider, span_exporter, stream):
    """gen_ai.usage.cache_read.input_tokens: the proxy's local hit + pulled; else the usage's
    prompt_tokens_details.cached_tokens; gen_ai.usage.input_tokens stays the total."""
    usage = {
        "prompt_tokens": 40,
        "completion_tokens": 4,
        "total_tokens": 44,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
    for kvt, want in (({**KVT, sc.KVT_LOCAL_HIT_TOKENS: 16}, 16 + 128), (KVT, 32)):

        def answer(request, kvt=kvt):
            if json.loads(request.content).get("stream"):
                events = [_chunk({"content": "a "}), _chunk({}, "length"), _chunk(None, usage=usage, kv_transfer=kvt)]
                data = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
                return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=data)
            return httpx2.Response(
                200, json={**completion_body({"messages": []}), "usage": usage, sc.RESPONSE_KV_TRANSFER: kvt}
            )

        span_exporter.clear()
        http = httpx2.Client(transport=httpx2.MockTransport(answer))
        client = TracedOpenAI(
            base_url="http://127.0.0.1:8123/v1",
            api_key="k",
            http_client=http,
            max_retries=0,
            tracer_provider=tracer_provider,
        )
        msgs = [{"role": "user", "content": "x"}]
        if stream:
            s = client.chat.completions.create(model="m", messages=msgs, stream=True)
            list(s)
            result = s.result
        else:
            client.chat.completions.create(model="m", messages=msgs)
            result = last_result()
        attrs = llm_span(span_exporter).attributes
        assert (attrs[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS], attrs[sc.GEN_AI_USAGE_INPUT_TOKENS]) == (want, 40)
        assert result.cached_tokens == want
