"""Proxy fault handling against scriptable fake workers: P 5xx / unreachable (502 or decode-only),
D dying mid-stream, D 5xx, client disconnect, bad client input — and the proxy keeps serving."""

from __future__ import annotations

import asyncio
import json

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from kvtrace import semconv as sc
from kvtrace.testing.proxy import BODY, CHAT, sse


def _no_latency(attrs) -> dict:
    out = dict(attrs)
    assert out.pop(sc.REQUEST_LATENCY_MS) > 0
    return out


def _base_attrs(rid, stream=True, **extra):
    return {
        sc.HTTP_REQUEST_METHOD: "POST",
        sc.URL_PATH: CHAT,
        sc.GEN_AI_REQUEST_ID: rid,
        sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
        sc.GEN_AI_REQUEST_MODEL: "fake",
        sc.REQUEST_STREAM: stream,
        sc.PROXY_OFFER: False,
        sc.PROXY_OFFER_REASON: sc.OFFER_NO_CONVERSATION_ID,
        sc.PROXY_CONVERSATION_TTL_S: 450.0,  # the default: decoder_kv_blocks_ttl 480 s minus 30 s
        sc.SESSION_SOURCE: sc.SOURCE_NONE,  # the rig turns prefix matching off
        **extra,
    }


async def test_prefill_5xx_gives_502_and_proxy_keeps_serving(rig_factory):
    rig = await rig_factory(p_status=500)
    status, headers, data = await rig.post(headers={sc.HEADER_REQUEST_ID: "r1"})
    assert status == 502
    err = json.loads(data)["error"]
    assert err["type"] == "upstream_error" and err["code"] == 502 and rig.p.url in err["message"]
    span = await rig.server_span()
    assert headers[sc.HEADER_TRACE_ID] == format(span.context.trace_id, "032x")
    assert span.kind == SpanKind.SERVER and span.status.status_code == StatusCode.ERROR
    assert _no_latency(span.attributes) == _base_attrs(
        "r1",
        **{
            sc.PROXY_FALLBACK: sc.FALLBACK_NONE,
            sc.PROXY_PREFILL_ENDPOINT: rig.p.url,
            sc.HTTP_RESPONSE_STATUS_CODE: 502,
            sc.ERROR_TYPE: "500",
        },
    )
    assert [(e.name, dict(e.attributes)) for e in span.events] == [
        (sc.EVENT_UPSTREAM_ERROR, {sc.ERROR_TYPE: "500", sc.SERVER_ADDRESS: "127.0.0.1", sc.SERVER_PORT: rig.p.port})
    ]
    (leg,) = rig.spans(sc.SPAN_PROXY_PREFILL)
    assert leg.parent.span_id == span.context.span_id and leg.kind == SpanKind.CLIENT
    assert dict(leg.attributes) == {
        sc.GEN_AI_REQUEST_ID: "r1",
        sc.SERVER_ADDRESS: "127.0.0.1",
        sc.SERVER_PORT: rig.p.port,
        sc.PROXY_PREFILL_ENDPOINT: rig.p.url,
        sc.PROXY_OFFER: False,
        sc.HTTP_RESPONSE_STATUS_CODE: 500,
        sc.ERROR_TYPE: "500",
    }
    assert rig.d.received == []  # D never saw the request
    rig.p.status = 200
    status, _, data = await rig.post()
    assert status == 200 and sse(data)[-1] == "[DONE]"


async def test_prefill_unreachable_decode_only_fallback(rig_factory):
    rig = await rig_factory(p_down=True, prefill_failure="decode_only")
    status, _, data = await rig.post(headers={sc.HEADER_REQUEST_ID: "r2"})
    assert status == 200
    events = sse(data)
    assert events[-1] == "[DONE]"
    final = json.loads(events[-2])
    kv = final[sc.RESPONSE_KV_TRANSFER]
    assert kv[sc.KVT_FALLBACK] == sc.FALLBACK_DECODE_ONLY and kv[sc.KVT_DECISION] is None
    assert kv[sc.KVT_PULLED_TOKENS] is None and kv[sc.KVT_PROMPT_TOKENS] is None
    (hdrs, body) = rig.d.received[0]
    # D prefills locally: no P block location, only the trace context
    assert set(body["kv_transfer_params"]) == {sc.KV_PARAMS_KEY}
    span = await rig.server_span()
    attrs = _no_latency(span.attributes)
    assert attrs[sc.PROXY_FALLBACK] == sc.FALLBACK_DECODE_ONLY
    assert attrs[sc.HTTP_RESPONSE_STATUS_CODE] == 200 and span.status.status_code != StatusCode.ERROR
    assert [e.name for e in span.events] == [sc.EVENT_UPSTREAM_ERROR, sc.EVENT_FIRST_TOKEN]
    assert span.events[0].attributes[sc.ERROR_TYPE] == "ClientConnectorError"


async def test_prefill_unreachable_error_mode(rig_factory):
    rig = await rig_factory(p_down=True)
    status, _, data = await rig.post()
    assert status == 502 and json.loads(data)["error"]["code"] == 502
    span = await rig.server_span()
    assert span.attributes[sc.ERROR_TYPE] == "ClientConnectorError"


async def test_failed_prefill_does_not_forget_location(rig_factory):
    rig = await rig_factory()
    conv = {**BODY, sc.BODY_CONVERSATION_ID: "c1"}
    assert (await rig.post(conv))[0] == 200
    rig.p.status = 503  # P fails the offered turn, and the fresh prefill it is then asked for
    assert (await rig.post(conv))[0] == 502
    rig.p.status = 200
    assert (await rig.post(conv))[0] == 200
    spans = [await rig.server_span(n) for n in (1, 2, 3)]
    got = [(s.attributes[sc.TURN_INDEX], s.attributes[sc.PROXY_OFFER_REASON]) for s in spans]
    assert got == [(0, sc.OFFER_NO_ENTRY), (1, sc.OFFER_OFFERED), (2, sc.OFFER_OFFERED)]
    assert spans[1].attributes[sc.PROXY_PREFILL_ATTEMPTS] == 2 and sc.KV_OUTCOME not in spans[1].attributes
    offered, retry = (body["kv_transfer_params"] for _, body in rig.p.received[1:3])
    assert offered["remote_engine_id"] == "d0" and retry["remote_engine_id"] is None  # the retry offers nothing
    # the fourth P request (turn 2) carried D's block location from turn 0, with the upstream flags
    sent = rig.p.received[3][1]["kv_transfer_params"]
    assert sent["remote_engine_id"] == "d0" and sent["remote_block_ids"] == [[1, 2, 3]]
    assert sent["do_remote_decode"] is True and sent["do_remote_prefill"] is False
    assert sent["remote_host"] == "127.0.0.1"  # D's host, as upstream rewrites it
    assert sent[sc.KV_PARAMS_KEY][sc.CTX_TURN] == 2 and sent[sc.KV_PARAMS_KEY][sc.CTX_SESSION_ID] == "c1"
    assert sc.BODY_CONVERSATION_ID not in rig.p.received[3][1]


async def test_decode_dies_mid_stream(rig_factory):
    rig = await rig_factory(d_kwargs={"die_after": 2, "tokens": 5})
    status, _, data = await rig.post()
    assert status == 200
    events = sse(data)
    assert events[-1] == "[DONE]"
    assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:2]] == ["t0", "t1"]
    err = json.loads(events[-2])["error"]
    assert err["type"] == "upstream_error" and err["code"] == 502 and "mid-stream" in err["message"]
    span = await rig.server_span()
    assert span.status.status_code == StatusCode.ERROR
    etype = span.attributes[sc.ERROR_TYPE]
    assert etype in ("ClientPayloadError", "ServerDisconnectedError", "incomplete_stream")
    (leg,) = rig.spans(sc.SPAN_PROXY_DECODE)
    assert leg.status.status_code == StatusCode.ERROR and leg.attributes[sc.ERROR_TYPE] == etype
    assert sc.EVENT_UPSTREAM_ERROR in [e.name for e in span.events]


async def test_stream_ends_for_the_client_at_done_while_d_holds_its_body_open(rig_factory):
    """[DONE] and the end of the chunked body go out together, in one write, as soon as [DONE]
    arrives: the client's response is complete while D has not ended its body yet."""
    rig = await rig_factory(d_kwargs={"after_done": "hold", "tokens": 3})
    async with rig.http.post(rig.proxy.url + CHAT, json=BODY) as r:
        data = await asyncio.wait_for(r.read(), 5)  # the whole body, D still holding
    assert r.status == 200 and sse(data)[-1] == "[DONE]" and not rig.d.release.is_set()
    assert [json.loads(e)["choices"][0]["delta"]["content"] for e in sse(data)[:3]] == ["t0", "t1", "t2"]
    rig.d.release.set()  # D ends its body: the proxy read it to the end and ends its spans
    span = await rig.server_span()
    assert span.status.status_code == StatusCode.UNSET and sc.ERROR_TYPE not in span.attributes
    assert span.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    status, _, again = await rig.post()  # D's connection went back to the pool in a clean state
    assert status == 200 and sse(again)[-1] == "[DONE]"


async def test_decode_dies_after_done_client_keeps_a_clean_stream(rig_factory):
    """D drops its connection after [DONE] (no end of its chunked body): the client already has its
    whole stream, with no error event after [DONE]; the spans record D's failure."""
    rig = await rig_factory(d_kwargs={"after_done": "die", "tokens": 2})
    status, _, data = await rig.post()
    events = sse(data)
    assert status == 200 and events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]] == ["t0", "t1"]
    span = await rig.server_span()
    etype = span.attributes[sc.ERROR_TYPE]
    assert etype in ("ClientPayloadError", "ServerDisconnectedError")
    assert span.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    (leg,) = rig.spans(sc.SPAN_PROXY_DECODE)
    assert leg.status.status_code == StatusCode.ERROR and leg.attributes[sc.ERROR_TYPE] == etype
    assert [e.name for e in span.events] == [sc.EVENT_FIRST_TOKEN, sc.EVENT_UPSTREAM_ERROR]


async def test_decode_dies_mid_stream_non_streaming_client(rig_factory):
    rig = await rig_factory(d_kwargs={"die_after": 1})
    status, _, data = await rig.post({**BODY, "stream": False})
    assert status == 502 and json.loads(data)["error"]["type"] == "upstream_error"


async def test_decode_5xx_gives_502(rig_factory):
    rig = await rig_factory(d_kwargs={"status": 500})
    status, _, data = await rig.post()
    assert status == 502 and rig.d.url in json.loads(data)["error"]["message"]
    span = await rig.server_span()
    assert span.attributes[sc.PROXY_DECODE_ENDPOINT] == rig.d.url and span.attributes[sc.ERROR_TYPE] == "500"


async def test_worker_4xx_passes_through(rig_factory):
    rig = await rig_factory(p_status=400)
    status, _, data = await rig.post()
    assert status == 400 and json.loads(data)["error"]["code"] == 400


async def test_client_disconnect_cancels_upstream(rig_factory):
    rig = await rig_factory(d_kwargs={"stall_after": 1, "tokens": 5})
    async with rig.http.post(rig.proxy.url + CHAT, json=BODY) as r:
        assert r.status == 200
        await r.content.readline()  # first event arrived
        await asyncio.wait_for(rig.d.stalled.wait(), 5)
        r.close()  # the client goes away mid-stream
    await asyncio.wait_for(rig.d.cancelled.wait(), 5)  # D's request was cancelled
    span = await rig.server_span()
    assert sc.EVENT_CLIENT_DISCONNECT in [e.name for e in span.events]
    assert span.attributes[sc.ERROR_TYPE] == "client_disconnect"
    assert span.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 499
    (leg,) = rig.spans(sc.SPAN_PROXY_DECODE)
    assert leg.attributes[sc.ERROR_TYPE] == "client_disconnect"


@pytest.mark.parametrize(
    ("raw", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (b"[1, 2]", 400, "invalid_request"),
        (json.dumps({**BODY, "messages": "hi"}).encode(), 400, "invalid_request"),
        (json.dumps({**BODY, "max_tokens": "3"}).encode(), 400, "invalid_request"),
        (json.dumps({**BODY, "max_tokens": True}).encode(), 400, "invalid_request"),
        (json.dumps({**BODY, sc.BODY_CONVERSATION_ID: 7}).encode(), 400, "invalid_request"),
        (json.dumps({**BODY, "stream": "yes"}).encode(), 400, "invalid_request"),
        (b"\xff\xfe", 400, "invalid_json"),
        (b"[" * 3000, 400, "invalid_json"),
        (json.dumps({**BODY, "pad": "x" * 5000}).encode(), 413, "body_too_large"),
    ],
    ids=[
        "bad-json",
        "not-object",
        "messages-str",
        "max-tokens-str",
        "max-tokens-bool",
        "conv-id-int",
        "stream-str",
        "not-utf8",
        "too-deep",
        "too-large",
    ],
)
async def test_bad_input_is_4xx_json(rig_factory, raw, status, code):
    rig = await rig_factory(max_body_bytes=4096)
    got, headers, data = await rig.post(raw=raw)
    assert got == status and headers["Content-Type"].startswith("application/json")
    err = json.loads(data)["error"]
    assert err["code"] == code and err["type"] == "invalid_request_error" and err["message"]
    span = await rig.server_span()
    assert span.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == status
    assert rig.p.received == [] and rig.d.received == []
    assert (await rig.post())[0] == 200  # still serving
