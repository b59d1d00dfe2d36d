"""Simulator options: vLLM's --no-enable-prefix-caching per role, and a thinking model's
reasoning (chat_template_kwargs.enable_thinking) streamed as vLLM's reasoning parser does."""

from __future__ import annotations

import json

import aiohttp
import pytest

from kvtrace import semconv as sc
from kvtrace.sim import tokenizer
from kvtrace.sim.cluster import SimCluster

from support.pd_legs import d_leg, p_leg

BODY = {"model": "m", "messages": [{"role": "user", "content": "cache block token " * 40}]}


async def _turn(http, cluster, rid, cached=None, max_tokens=20):
    status, p = await p_leg(http, cluster, BODY, rid, cached)
    assert status == 200
    return p, await d_leg(http, cluster, BODY, rid, p["kv_transfer_params"], max_tokens)


@pytest.mark.parametrize("off", [(), ("prefill",), ("decode",), ("prefill", "decode")])
async def test_prefix_caching_off_per_role(tracer_provider, span_exporter, off):
    async with SimCluster(1, 1, cost=False, tracer_provider=tracer_provider, no_prefix_caching=off) as cluster:
        async with aiohttp.ClientSession() as http:
            for i in range(2):  # the same prompt twice: a prefix-cache hit the second time, if caching is on
                await _turn(http, cluster, f"r{i}")
        p_engine, d_engine = cluster.prefill[0].engine, cluster.decode[0].engine
        assert (p_engine.prefix_caching, d_engine.prefix_caching) == ("prefill" not in off, "decode" not in off)
    decisions = [s.attributes for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_KV_DECISION]
    p2 = [d for d in decisions if d[sc.KV_DIRECTION] == sc.DIRECTION_D2P][1]
    d2 = [d for d in decisions if d[sc.KV_DIRECTION] == sc.DIRECTION_P2D][1]
    n = p2[sc.KV_PROMPT_TOKENS]
    full_hit = (n - 1) // 16 * 16  # vLLM's cap: the last prompt token is always computed
    assert p2[sc.KV_LOCAL_HIT_TOKENS] == (0 if "prefill" in off else full_hit)
    assert d2[sc.KV_LOCAL_HIT_TOKENS] == (0 if "decode" in off else full_hit)
    assert d2[sc.KV_PULLED_TOKENS if "decode" in off else sc.KV_LOCAL_HIT_TOKENS] > 0


def test_prefix_caching_roles_are_checked():
    with pytest.raises(ValueError, match="unknown role"):
        SimCluster(1, 1, no_prefix_caching=("both",))


async def test_resource_attributes_name_the_configuration():
    seen = []

    def factory(service, attrs):
        seen.append((service, attrs))
        from opentelemetry.sdk.trace import TracerProvider

        return TracerProvider()

    kv = {"kv_connector_extra_config": {"bidirectional_kv_xfer": False}}
    async with SimCluster(
        1, 1, cost=False, tracer_provider_factory=factory, kv_config=kv, no_prefix_caching=("prefill",)
    ):
        pass
    got = {attrs[sc.ENGINE_ROLE]: (attrs[sc.ENGINE_PREFIX_CACHING], attrs[sc.KV_BIDIRECTIONAL]) for _, attrs in seen}
    assert got == {sc.ROLE_PREFILL: (False, False), sc.ROLE_DECODE: (True, False)}


def test_thinking_output_and_template_round_trip():
    ids, pieces = tokenizer.generate(3, 10, thinking=True)
    r = tokenizer.reasoning_words(10, True)
    assert r == 4 and len(ids) == 10 and pieces[0] == tokenizer.THINK and pieces[r + 1] == tokenizer.END_THINK
    assert tokenizer.generate(3, 3, thinking=True) == tokenizer.generate(3, 3)  # too short to think
    content, reasoning = tokenizer.split(pieces)
    assert reasoning == "".join(pieces[1 : r + 1]) and content == "".join(pieces[r + 2 :])
    assert [tokenizer.delta(i, p, r) for i, p in enumerate(pieces)][:2] == [("reasoning", ""), ("reasoning", pieces[1])]
    assert tokenizer.delta(r + 1, pieces[r + 1], r) == ("content", "") and tokenizer.delta(9, pieces[9], r) == (
        "content",
        pieces[9],
    )
    user = [{"role": "user", "content": "hi "}]
    prompt = tokenizer.encode(tokenizer.render_chat(user))
    kept = tokenizer.encode(
        tokenizer.render_chat(user + [{"role": "assistant", "content": content, "reasoning": reasoning}])
    )
    assert kept[: len(prompt) + len(ids)] == prompt + ids  # reasoning sent back: extends what D generated
    stripped = tokenizer.encode(tokenizer.render_chat(user + [{"role": "assistant", "content": content}]))
    assert stripped[: len(prompt)] == prompt and stripped[len(prompt)] != ids[0]


async def test_thinking_streams_reasoning_deltas_and_non_streaming_message(tracer_provider):
    body = {**BODY, "max_tokens": 10, "chat_template_kwargs": {"enable_thinking": True}}
    async with SimCluster(0, 1, cost=False, tracer_provider=tracer_provider) as cluster:
        async with aiohttp.ClientSession() as http:
            url = cluster.decode_urls[0] + "/v1/chat/completions"
            async with http.post(url, json={**body, "stream": True}) as r:
                raw = await r.text()
            async with http.post(url, json=body) as r:
                message = (await r.json())["choices"][0]["message"]
            async with http.post(url, json={**body, "chat_template_kwargs": []}) as r:
                assert r.status == 400
    deltas = [json.loads(b[6:])["choices"][0]["delta"] for b in raw.split("\n\n") if b.startswith("data: {")][1:]
    assert [next(iter(d)) for d in deltas] == ["reasoning"] * 5 + ["content"] * 5
    assert "".join(d.get("reasoning", "") for d in deltas) == message["reasoning"] != ""
    assert "".join(d.get("content", "") for d in deltas) == message["content"] != ""
