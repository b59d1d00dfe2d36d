"""A P answer whose ``kv_transfer_params`` D cannot use (not an object, a field of the wrong
type, a non-finite number) is recorded as the decode-only fallback it is: the client still gets
D's answer, D prefills locally (no P block location sent), and the spans say so."""

from __future__ import annotations

import json

import pytest
from opentelemetry.trace import StatusCode

from kvtrace import semconv as sc
from kvtrace.proxy.legs import unusable_params
from kvtrace.testing.proxy import sse

GOOD = {
    "do_remote_decode": False,
    "do_remote_prefill": True,
    "remote_engine_id": "p0",
    "remote_block_ids": [[1, 2, 3]],
    "remote_request_id": "r-p0",
    "remote_host": "10.0.0.9",
    "remote_port": 5600,
}
CASES = {  # name -> (P's kv_transfer_params, why D cannot use them)
    "notadict": ("notadict", "kv_transfer_params is str, not an object"),
    "list": (["a"], "kv_transfer_params is list, not an object"),
    "port": ({**GOOD, "remote_port": "5600"}, "kv_transfer_params.remote_port is not a port"),
    "blocks": ({**GOOD, "remote_block_ids": "1,2,3"}, "kv_transfer_params.remote_block_ids is not a list of block ids"),
    "flag": ({**GOOD, "do_remote_prefill": "yes"}, "kv_transfer_params.do_remote_prefill is not a boolean"),
    "nan": ({**GOOD, "tp_size": float("nan")}, "kv_transfer_params holds a non-finite number"),
    "inf": ({**GOOD, "kvtrace": {"x": float("inf")}}, "kv_transfer_params holds a non-finite number"),
}


def test_usable_params_pass():
    assert unusable_params(GOOD) is None
    assert unusable_params({**GOOD, "remote_block_ids": [4, 5], "tp_size": 2, "remote_engine_id": None}) is None


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_unusable_form_is_named(case):
    params, why = CASES[case]
    assert unusable_params(params) == why


@pytest.mark.parametrize("case", ["notadict", "port", "nan"])
async def test_the_client_gets_its_answer_and_the_span_says_decode_only(rig_factory, case):  # noqa: F811
    params, _ = CASES[case]
    rig = await rig_factory(p_kwargs={"kv_params": [params]})
    status, _, data = await rig.post(headers={sc.HEADER_REQUEST_ID: "r1"})
    assert status == 200
    events = sse(data)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])[sc.RESPONSE_KV_TRANSFER][sc.KVT_FALLBACK] == sc.FALLBACK_DECODE_ONLY
    (_, d_body) = rig.d.received[0]
    assert set(d_body["kv_transfer_params"]) == {sc.KV_PARAMS_KEY}  # D prefills locally
    span = await rig.server_span()
    attrs = dict(span.attributes)
    assert attrs.pop(sc.REQUEST_LATENCY_MS) > 0
    assert attrs.pop(sc.REQUEST_TTFT_MS) > 0
    assert attrs == {
        sc.HTTP_REQUEST_METHOD: "POST",
        sc.URL_PATH: "/v1/chat/completions",
        sc.GEN_AI_REQUEST_ID: "r1",
        sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
        sc.GEN_AI_REQUEST_MODEL: "fake",
        sc.REQUEST_STREAM: True,
        sc.PROXY_OFFER: False,
        sc.PROXY_OFFER_REASON: sc.OFFER_NO_CONVERSATION_ID,
        sc.PROXY_CONVERSATION_TTL_S: 450.0,
        sc.SESSION_SOURCE: sc.SOURCE_NONE,
        sc.PROXY_PREFILL_ENDPOINT: rig.p.url,
        sc.PROXY_DECODE_ENDPOINT: rig.d.url,
        sc.PROXY_FALLBACK: sc.FALLBACK_DECODE_ONLY,
        sc.HTTP_RESPONSE_STATUS_CODE: 200,
        # D's own answer (the fake's usage), D pulled nothing
        sc.GEN_AI_RESPONSE_FINISH_REASONS: ("length",),
        sc.GEN_AI_USAGE_INPUT_TOKENS: 40,
        sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 16,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: rig.d.tokens,
        sc.KV_PULLED_TOKENS: 0,
    }
    assert span.status.status_code != StatusCode.ERROR
    assert [e.name for e in span.events] == [sc.EVENT_UPSTREAM_ERROR, sc.EVENT_FIRST_TOKEN]
    assert (span.events[0].name, dict(span.events[0].attributes)) == (
        sc.EVENT_UPSTREAM_ERROR,
        {sc.ERROR_TYPE: sc.ERROR_INVALID_RESPONSE, sc.SERVER_ADDRESS: "127.0.0.1", sc.SERVER_PORT: rig.p.port},
    )
