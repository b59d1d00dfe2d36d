"""Client-side cost of kvtrace's ``openai`` instrumentation, measured against the plain client
in the same run.

Both clients talk to the same in-process endpoint (an httpx2 MockTransport answering a
streamed chat completion of ``--tokens`` chunks, with a ``kv_transfer`` object on the final
chunk), so the numbers isolate what the wrapper adds per call: span start/end, header and body
injection, per-chunk TTFT/TPOT bookkeeping, usage and ``kv_transfer`` parsing.  Spans go to a
BatchSpanProcessor with a no-op exporter (the SDK's export cost runs off the calling thread).

    python benchmarks/agent/bench_wrapper.py [--calls 2000] [--tokens 64]

Prints per-call mean and p50 for plain / traced (inside a session and turn) and the difference
in microseconds, plus the ratio traced/plain.  Target: the difference is small against real
model latency (tens of ms per call); it is reported, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import httpx2
import openai
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from kvtrace import semconv as sc
from kvtrace.agent import Agent, TracedAsyncOpenAI


class NullExporter(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS


def sse_body(tokens: int) -> bytes:
    def chunk(delta, finish=None, **extra):
        return {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }

    events = [chunk({"role": "assistant", "content": ""})] + [chunk({"content": "tok "}) for _ in range(tokens)]
    events.append(chunk({}, "length"))
    usage = {"prompt_tokens": 100, "completion_tokens": tokens, "total_tokens": 100 + tokens}
    events.append(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [],
            "usage": usage,
            sc.RESPONSE_KV_TRANSFER: {
                sc.KVT_DECISION: sc.OUTCOME_PULLED,
                sc.KVT_PULLED_TOKENS: 96,
                sc.KVT_REQUEST_ID: "r",
            },
        }
    )
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


async def drive(client, calls: int, agent: Agent | None) -> list[float]:
    times = []
    messages = [{"role": "user", "content": "hello"}]

    async def one():
        t0 = time.perf_counter()
        stream = await client.chat.completions.create(model="m", messages=messages, stream=True, max_tokens=64)
        async for _ in stream:
            pass
        times.append((time.perf_counter() - t0) * 1e6)

    if agent is None:
        for _ in range(calls):
            await one()
        return times
    async with agent.session("bench"):
        async with agent.turn():
            for _ in range(calls):
                await one()
    return times


async def main(calls: int, tokens: int) -> None:
    body = sse_body(tokens)

    async def handler(request):
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    def transport():
        return httpx2.AsyncClient(transport=httpx2.MockTransport(handler))

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(NullExporter()))
    agent = Agent(provider)
    plain = openai.AsyncOpenAI(base_url="http://h/v1", api_key="k", http_client=transport(), max_retries=0)
    traced = TracedAsyncOpenAI(base_url="http://h/v1", api_key="k", http_client=transport(), max_retries=0, agent=agent)
    await drive(plain, 100, None)  # warm-up both paths
    await drive(traced, 100, agent)
    results = {}
    for _ in range(3):  # interleave to spread drift over both
        results.setdefault("plain", []).extend(await drive(plain, calls // 3, None))
        results.setdefault("traced", []).extend(await drive(traced, calls // 3, agent))
    provider.shutdown()
    p, t = results["plain"], results["traced"]
    for name, xs in results.items():
        print(
            f"{name:7s} mean {statistics.mean(xs):8.1f} us  p50 {statistics.median(xs):8.1f} us  "
            f"({len(xs)} calls, {tokens} chunks)"
        )
    print(
        f"added   mean {statistics.mean(t) - statistics.mean(p):8.1f} us  "
        f"p50 {statistics.median(t) - statistics.median(p):8.1f} us"
    )
    print(f"ratio traced/plain (p50) {statistics.median(t) / statistics.median(p):.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    asyncio.run(main(a.calls, a.tokens))
