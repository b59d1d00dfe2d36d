"""kvtrace.agent.direct.DirectChat (the virtual arm's client) sends the openai SDK's request, byte
for byte, and makes the SDK path's llm_call span and result: same headers, body, span attributes,
timestamps, events and status; a refused request raises the SDK's exception type."""

from __future__ import annotations

import json

import openai
import pytest
from aiohttp import web
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv.attributes.exception_attributes import EXCEPTION_STACKTRACE

from kvtrace import semconv as sc
from kvtrace.agent.api import Agent
from kvtrace.agent.direct import DirectChat
from kvtrace.agent.openai_wrap import TracedAsyncOpenAI
from kvtrace.bench.runner import _read
from kvtrace.sim import virtual
from kvtrace.telemetry.ids import UnseededIdGenerator

KVT = {"offered": True, "pulled_tokens": 96, "request_id": "r-1"}
EVENTS = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"reasoning": "thinking "}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": "the answer "}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": "is here "}, "finish_reason": "length"}], "kv_transfer": KVT},
    {
        "choices": [],
        "usage": {
            "prompt_tokens": 120,
            "completion_tokens": 3,
            "total_tokens": 123,
            "prompt_tokens_details": {"cached_tokens": 96},
        },
    },
]


# what orjson reads otherwise than json (or not at all): the client's parse falls back to json for them
ODD_KVT = {"remote_block_ids": [2**70, 12], "ratio": float("inf"), "note": "\ud800 lone"}
ODD_EVENTS = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "\ud83d"}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {"content": "done"}, "finish_reason": "length"}], "kv_transfer": ODD_KVT},
]


def _app(seen: list, status: int, events: list = EVENTS) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        seen.append(({k.lower(): v for k, v in request.headers.items()}, await request.read()))
        if status != 200:
            return web.json_response({"error": {"message": "pool full", "type": "pool_full"}}, status=status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in events:
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def _call(
    direct: bool, status: int, exporter: InMemorySpanExporter, events: list = EVENTS
) -> tuple[list, object]:
    seen: list = []
    runner = web.AppRunner(_app(seen, status, events))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    provider = TracerProvider(id_generator=UnseededIdGenerator())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = Agent(provider, name="t")
    sdk = TracedAsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=0, agent=agent)
    client = DirectChat(sdk, agent) if direct else sdk
    outcome: object
    try:
        async with agent.session("s-1", "t"):
            stream = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "héllo"}],
                max_tokens=3,
                stream=True,
                extra_body={"ignore_eos": True},
                timeout=600.0,
            )
            outcome = await _read(stream, None)
            await stream.close()
            outcome = (outcome, stream.result)
    except openai.APIError as exc:
        outcome = (type(exc), str(exc), getattr(exc, "status_code", None))
    finally:
        await client.close()
        await runner.cleanup()
    return seen, outcome


def _but_where(attributes) -> dict:
    """An event's attributes less the stack trace (which names the code path the error took)."""
    return {k: v for k, v in attributes.items() if k != EXCEPTION_STACKTRACE}


def _spans(exporter: InMemorySpanExporter) -> list:
    return [
        (s.name, s.context.span_id, s.parent.span_id if s.parent else None, s.start_time, s.end_time)
        + (dict(s.attributes), s.status.status_code, s.status.description)
        + ([(e.name, e.timestamp, _but_where(e.attributes)) for e in s.events],)
        for s in exporter.get_finished_spans()
    ]


@pytest.mark.parametrize("status", [200, 503])
def test_the_direct_client_sends_and_records_what_the_sdk_does(status):
    runs = {}
    for direct in (False, True):
        exporter = InMemorySpanExporter()
        seen, outcome = virtual.run(_call(direct, status, exporter), seed=7)
        runs[direct] = (seen, outcome, _spans(exporter))
    (sdk_seen, sdk_out, sdk_spans), (seen, out, spans) = runs[False], runs[True]
    assert len(seen) == len(sdk_seen) == 1
    headers, body = seen[0]
    sdk_headers, sdk_body = sdk_seen[0]
    assert body == sdk_body  # the same JSON bytes, key order included
    assert json.loads(body)["conversation_id"] == "s-1" and json.loads(body)["stream_options"] == {
        "include_usage": True
    }
    assert headers == sdk_headers
    assert spans == sdk_spans and any(s[0] == sc.SPAN_AGENT_LLM_CALL for s in spans)
    if status == 200:
        (text, result), (sdk_text, sdk_result) = out, sdk_out
        assert text == sdk_text == ("the answer is here ", "thinking ")
        assert vars(result) == vars(sdk_result) and result.kv_transfer == KVT and result.ttft_ms is not None
    else:
        assert out == sdk_out == (openai.InternalServerError, "Error code: 503 - pool full", 503)


def test_events_orjson_would_read_otherwise_reach_the_result_as_the_sdk_reads_them():
    runs = {}
    for direct in (False, True):
        exporter = InMemorySpanExporter()
        runs[direct] = virtual.run(_call(direct, 200, exporter, ODD_EVENTS), seed=7)[1]
    (text, result), (sdk_text, sdk_result) = runs[True], runs[False]
    assert text == sdk_text == ("\ud83ddone", "")
    assert result.kv_transfer == sdk_result.kv_transfer
    assert result.kv_transfer == ODD_KVT and type(result.kv_transfer["remote_block_ids"][0]) is int


def _rows(run_dir: str) -> dict:
    import glob

    import pyarrow.parquet as pq

    return {
        (r["TraceId"], r["SpanId"]): r
        for path in glob.glob(f"{run_dir}/**/*.parquet", recursive=True)
        for r in pq.read_table(path).to_pylist()
    }


def test_a_virtual_arm_through_the_direct_client_writes_the_sdk_arms_spans(tmp_path, monkeypatch):
    """A 2P2D arm on the shipped Mooncake trace's first sessions: every span of every component
    (bench, proxy, P, D), ids and timestamps included, and the bench's records are the same."""
    from kvtrace.bench import inproc
    from kvtrace.bench.fleet import Fleet

    cfg = dict(input="mooncake-conversation", sessions=14, nonce="d")
    results, rows = {}, {}
    for direct in (False, True):
        monkeypatch.setattr(inproc, "DIRECT_CLIENT", direct)
        run_dir = str(tmp_path / f"direct-{direct}")
        main = inproc.run_arm(run_dir, "qwen3-32b", True, True, "efa-3200", cfg, "A", 450.0, None, Fleet(2, 2))
        results[direct], rows[direct] = virtual.run(main, seed=11), _rows(run_dir)
    a, b = rows[False], rows[True]
    assert len(a) > 100 and a.keys() == b.keys()
    assert {k: v for k, v in a.items() if v != b[k]} == {}
    assert [vars(r) for r in results[False].requests] == [vars(r) for r in results[True].requests]
