"""The simulated worker's HTTP surface matches vLLM 0.33's OpenAI server byte for byte in shape."""

from __future__ import annotations

import json

import aiohttp
import pytest

from kvtrace import semconv as sc
from kvtrace.sim import tokenizer
from kvtrace.sim.cluster import SimCluster

KVT_KEYS = {
    sc.KVT_TRACE_ID,
    sc.KVT_REQUEST_ID,
    sc.KVT_SESSION_ID,
    sc.KVT_TURN,
    sc.KVT_ENGINE_ID,
    sc.KVT_ROLE,
    sc.KVT_PROMPT_TOKENS,
    sc.KVT_LOCAL_HIT_TOKENS,
    sc.KVT_REMOTE_TOKENS,
    sc.KVT_PULLED_TOKENS,
    sc.KVT_RECOMPUTED_TOKENS,
    sc.KVT_PEER_ENGINE_ID,
    sc.KVT_DECISION,
}


@pytest.fixture
async def worker(tracer_provider):
    async with SimCluster(0, 1, cost=False, tracer_provider=tracer_provider, model="sim-model") as c:
        async with aiohttp.ClientSession(base_url=c.decode_urls[0]) as session:
            yield session


def expected_text(prompt_ids, n, seed=None):
    _, pieces = tokenizer.generate(tokenizer.seed_for(prompt_ids, seed), n)
    return pieces


async def test_completion_non_streaming_shape(worker):
    ids = tokenizer.encode("Hello there, simulator ")
    async with worker.post(
        "/v1/completions",
        json={"model": "sim-model", "prompt": "Hello there, simulator ", "max_tokens": 3},
        headers={"X-Request-Id": "abc"},
    ) as r:
        assert r.status == 200 and r.content_type == "application/json"
        body = await r.json()
    kvp = body.pop("kv_transfer_params")
    created = body.pop("created")
    assert isinstance(created, int)
    assert body == {
        "id": "cmpl-abc",
        "object": "text_completion",
        "model": "sim-model",
        "choices": [
            {
                "index": 0,
                "text": "".join(expected_text(ids, 3)),
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "routed_experts": None,
                "weight_versions": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {
            "prompt_tokens": len(ids),
            "total_tokens": len(ids) + 3,
            "completion_tokens": 3,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
        "ec_transfer_params": None,
        "metrics": None,
    }
    assert list(kvp) == [sc.KV_PARAMS_KEY]  # plain request: no vLLM fields, only the kvtrace summary
    assert set(kvp[sc.KV_PARAMS_KEY]) == KVT_KEYS
    assert kvp[sc.KV_PARAMS_KEY][sc.KVT_REQUEST_ID] == "abc"
    assert kvp[sc.KV_PARAMS_KEY][sc.KVT_ROLE] == sc.ROLE_BOTH


async def test_chat_non_streaming_shape_and_token_id_prompts(worker):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    async with worker.post("/v1/chat/completions", json={"messages": msgs, "max_completion_tokens": 2, "seed": 7}) as r:
        body = await r.json()
    ids = tokenizer.encode(
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "".join(expected_text(ids, 2, 7)),
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            },
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": None,
            "routed_experts": None,
            "weight_versions": None,
        }
    ]
    assert [k for k in body] == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "prompt_logprobs",
        "prompt_token_ids",
        "prompt_text",
        "kv_transfer_params",
        "ec_transfer_params",
        "metrics",
    ]
    assert body["usage"]["prompt_tokens"] == len(ids)
    async with worker.post("/v1/completions", json={"prompt": ids, "max_tokens": 2, "seed": 7}) as r:
        assert (await r.json())["choices"][0]["text"] == body["choices"][0]["message"]["content"]


async def test_completion_stream_framing(worker):
    prompt = "stream me "
    async with worker.post(
        "/v1/completions",
        json={"prompt": prompt, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}},
        headers={"X-Request-Id": "s1"},
    ) as r:
        assert r.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        raw = await r.text()
    blocks = raw.split("\n\n")
    assert blocks[-2:] == ["data: [DONE]", ""]
    events = [json.loads(b[len("data: ") :]) for b in blocks[:-2]]
    created = events[0]["created"]
    pieces = expected_text(tokenizer.encode(prompt), 3)
    for i, piece in enumerate(pieces):
        last = i == 2
        kvp = events[i].pop("kv_transfer_params")
        assert events[i] == {
            "id": "cmpl-s1",
            "object": "text_completion",
            "created": created,
            "model": "sim-model",
            "choices": [
                {
                    "index": 0,
                    "text": piece,
                    "logprobs": None,
                    "finish_reason": "length" if last else None,
                    "stop_reason": None,
                    "prompt_token_ids": None,
                    "token_ids": None,
                    "weight_versions": None,
                }
            ],
        }
        assert (kvp is None) != last
    assert events[3] == {
        "id": "cmpl-s1",
        "object": "text_completion",
        "created": created,
        "model": "sim-model",
        "choices": [],
        "usage": {"prompt_tokens": 2, "total_tokens": 5, "completion_tokens": 3},
    }
    assert len(events) == 4


async def test_chat_stream_framing_without_usage(worker):
    async with worker.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": True}
    ) as r:
        raw = await r.text()
    events = [json.loads(b[6:]) for b in raw.split("\n\n") if b.startswith("data: {")]
    assert raw.endswith("data: [DONE]\n\n") and len(events) == 3
    assert events[0]["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert list(events[0]) == ["id", "object", "created", "model", "choices", "prompt_token_ids", "prompt_text"]
    assert events[1]["choices"][0] == {
        "index": 0,
        "delta": {"content": events[1]["choices"][0]["delta"]["content"]},
        "logprobs": None,
        "finish_reason": None,
        "token_ids": None,
    }
    assert events[1]["kv_transfer_params"] is None
    assert list(events[2]["choices"][0]) == [
        "index",
        "delta",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
        "weight_versions",
    ]
    assert events[2]["choices"][0]["finish_reason"] == "length"
    assert events[2]["kv_transfer_params"][sc.KV_PARAMS_KEY][sc.KVT_PROMPT_TOKENS] == len(
        tokenizer.encode(tokenizer.render_chat([{"role": "user", "content": "x"}]))
    )


@pytest.mark.parametrize(
    "body,status,param",
    [
        ({"prompt": 5}, 400, "prompt"),
        ({"prompt": ""}, 400, "prompt"),
        ({"prompt": [1, -2]}, 400, "prompt"),
        ({"prompt": "x", "n": 2}, 400, "n"),
        ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
        ({"prompt": "x", "kv_transfer_params": [1]}, 400, "kv_transfer_params"),
        ({"prompt": "x", "model": "other"}, 404, "model"),
        ({"messages": []}, 400, "messages"),
    ],
)
async def test_invalid_requests(worker, body, status, param):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    async with worker.post(path, json=body) as r:
        assert r.status == status
        err = (await r.json())["error"]
    assert err["code"] == status and err["param"] == param
    assert err["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


async def test_not_json_and_too_long(worker):
    async with worker.post("/v1/completions", data=b"{nope", headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400 and (await r.json())["error"]["type"] == "BadRequestError"
    async with worker.post("/v1/completions", json={"prompt": [7] * (65536 * 16 + 1), "max_tokens": 1}) as r:
        assert r.status == 400 and "KV blocks" in (await r.json())["error"]["message"]


async def test_health_and_models(worker):
    async with worker.get("/health") as r:
        assert r.status == 200
    async with worker.get("/v1/models") as r:
        data = (await r.json())["data"]
    assert [(m["id"], m["object"], m["owned_by"], m["max_model_len"]) for m in data] == [
        ("sim-model", "model", "vllm", 65536 * 16)
    ]


def test_tokenizer_prefix_and_determinism():
    a, b = "first turn text ", "second part<|im_end|>\n"
    assert tokenizer.encode(a + b) == tokenizer.encode(a) + tokenizer.encode(b)
    assert tokenizer.encode(a) == tokenizer.encode(a)
    ids, pieces = tokenizer.generate(42, 5)
    assert tokenizer.encode("".join(pieces)) == ids
    assert tokenizer.generate(42, 5) == (ids, pieces) and tokenizer.generate(43, 5)[0] != ids
