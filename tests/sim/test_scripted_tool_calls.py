"""``kvtrace sim --tool-calls first-tool``: a chat request offering tools whose last message is the
user's is answered with a call of the first tool (vLLM's tool-parser shapes, streamed and not); a
tool result gets a text reply; off by default."""

from __future__ import annotations

import json

import aiohttp
import pytest

from kvtrace import semconv as sc
from kvtrace.cli import sim as sim_cli
from kvtrace.sim import tokenizer, wire
from kvtrace.sim.cluster import SimCluster

CHAT = "/v1/chat/completions"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
ASK = [{"role": "user", "content": "weather in Paris?"}]
CALLED = [
    *ASK,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
]


async def _client(tracer_provider, mode):
    cluster = SimCluster(0, 1, cost=False, tracer_provider=tracer_provider, tool_calls=mode)
    await cluster.__aenter__()
    return cluster, aiohttp.ClientSession(base_url=cluster.decode_urls[0])


@pytest.fixture
async def scripted(tracer_provider):
    cluster, http = await _client(tracer_provider, wire.TOOL_CALLS_FIRST_TOOL)
    yield http
    await http.close()
    await cluster.close()


@pytest.fixture
async def plain(tracer_provider):
    cluster, http = await _client(tracer_provider, None)
    yield http
    await http.close()
    await cluster.close()


async def _post(http, body, rid="r1"):
    async with http.post(CHAT, json=body, headers={sc.HEADER_REQUEST_ID: rid}) as r:
        return r.status, await r.text()


def _events(raw: str) -> list[dict]:
    assert raw.endswith("data: [DONE]\n\n")
    return [json.loads(b[6:]) for b in raw.split("\n\n") if b.startswith("data: {")]


async def test_user_turn_with_tools_gets_a_call_of_the_first_tool(scripted):
    status, raw = await _post(scripted, {"messages": ASK, "tools": TOOLS, "max_tokens": 5})
    assert status == 200, raw
    body = json.loads(raw)
    assert body["choices"] == [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
                "tool_calls": [
                    {
                        "id": "chatcmpl-tool-r1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": "{}"},
                    }
                ],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
            "stop_reason": None,
            "token_ids": None,
            "routed_experts": None,
            "weight_versions": None,
        }
    ]
    n_prompt = len(tokenizer.encode(tokenizer.render_chat(ASK)))  # the tools are not rendered into the prompt
    assert body["usage"] == {
        "prompt_tokens": n_prompt,
        "total_tokens": n_prompt + 5,
        "completion_tokens": 5,  # the tokens are still generated: same cost as a text reply
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


async def test_tool_result_gets_a_text_reply(scripted):
    status, raw = await _post(scripted, {"messages": CALLED, "tools": TOOLS, "max_tokens": 3, "seed": 1})
    assert status == 200, raw
    choice = json.loads(raw)["choices"][0]
    ids = tokenizer.encode(tokenizer.render_chat(CALLED))
    _, pieces = tokenizer.generate(tokenizer.seed_for(ids, 1), 3)
    assert (choice["finish_reason"], choice["message"]["content"]) == ("length", "".join(pieces))
    assert "tool_calls" not in choice["message"]


async def test_streamed_call_is_a_name_delta_then_an_arguments_delta_with_the_finish(scripted):
    body = {"messages": ASK, "tools": TOOLS, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    status, raw = await _post(scripted, body)
    assert status == 200, raw
    events = _events(raw)
    assert [e["choices"] for e in events[1:]] == [
        [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "id": "chatcmpl-tool-r1",
                            "type": "function",
                            "index": 0,
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                },
                "logprobs": None,
                "finish_reason": None,
                "token_ids": None,
            }
        ],
        [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]},
                "logprobs": None,
                "finish_reason": "tool_calls",
                "stop_reason": None,
                "token_ids": None,
                "weight_versions": None,
            }
        ],
        [],  # the usage chunk
    ]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[1]["kv_transfer_params"] is None
    summary = events[2]["kv_transfer_params"][sc.KV_PARAMS_KEY]
    assert summary[sc.KVT_PROMPT_TOKENS] == events[3]["usage"]["prompt_tokens"]
    assert events[3]["usage"]["completion_tokens"] == 4


async def test_one_token_stream_carries_the_whole_call_in_one_chunk(scripted):
    status, raw = await _post(scripted, {"messages": ASK, "tools": TOOLS, "max_tokens": 1, "stream": True})
    assert status == 200, raw
    (_, only) = _events(raw)
    assert only["choices"][0]["finish_reason"] == "tool_calls"
    assert only["choices"][0]["delta"] == {
        "tool_calls": [
            {
                "id": "chatcmpl-tool-r1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": "{}"},
                "index": 0,
            }
        ]
    }


@pytest.mark.parametrize(
    "choice,expected",
    [
        ("none", None),
        ("auto", "get_weather"),
        ({"type": "function", "function": {"name": "get_time"}}, "get_time"),
    ],
)
async def test_tool_choice_is_honoured(scripted, choice, expected):
    status, raw = await _post(scripted, {"messages": ASK, "tools": TOOLS, "tool_choice": choice, "max_tokens": 2})
    assert status == 200, raw
    message = json.loads(raw)["choices"][0]["message"]
    assert [c["function"]["name"] for c in message.get("tool_calls", [])] == ([expected] if expected else [])


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tools": {"get_weather": {}}}, "tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ],
)
async def test_malformed_tools_are_a_400_naming_the_field(scripted, extra, param):
    status, raw = await _post(scripted, {"messages": ASK, "max_tokens": 2, **extra})
    assert status == 400
    assert json.loads(raw)["error"]["param"] == param


async def test_off_by_default_tools_get_text(plain):
    status, raw = await _post(plain, {"messages": ASK, "tools": TOOLS, "max_tokens": 2})
    assert status == 200, raw
    choice = json.loads(raw)["choices"][0]
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown tool-call mode 'always'; choose from first-tool"):
        SimCluster(0, 1, cost=False, tool_calls="always")


def test_cli_flag_defaults_off_and_takes_first_tool(capsys):
    import argparse

    parser = argparse.ArgumentParser()
    sim_cli.add_arguments(parser)
    assert parser.parse_args([]).tool_calls is None
    assert parser.parse_args(["--tool-calls", "first-tool"]).tool_calls == "first-tool"
    with pytest.raises(SystemExit):
        parser.parse_args(["--tool-calls", "always"])
    assert "invalid choice: 'always'" in capsys.readouterr().err
