"""What every agent script shares, as a user of these libraries sets it up (no kvtrace code): the
OTel SDK exporting over OTLP/HTTP, the W3C context put on the model's HTTP requests by the httpx
instrumentation (openai 3.x's client is httpx2: ``HTTPX2ClientInstrumentor``), the three questions
and the 0.5 s weather tool.  Runs in the side venv (requirements.txt beside this file)."""

from __future__ import annotations

import argparse
import asyncio

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

AGENT = "weather"
QUESTIONS = ("What is the weather in Paris?", "And in Rome?", "And in Oslo?")
INSTRUCTIONS = "Answer questions about the weather; call get_weather first."
WEATHER = "sunny, 21 C"
TOOLS = [  # the weather tool for agents that call the OpenAI API themselves
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather where the user asked.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--base-url", required=True, help="the model's OpenAI base URL (kvtrace proxy, .../v1)")
    p.add_argument("--otlp", required=True, help="OTLP/HTTP traces endpoint (kvtrace collect, .../v1/traces)")
    p.add_argument("--session-id", required=True, help="the agent's own session (conversation) id")
    p.add_argument("--model", default="sim")
    p.add_argument("--tool-s", type=float, default=0.5, help="how long the weather tool takes")
    return p.parse_args()


def exporter(args: argparse.Namespace) -> OTLPSpanExporter:
    return OTLPSpanExporter(endpoint=args.otlp)


def provider(args: argparse.Namespace, service: str) -> TracerProvider:
    """The global tracer provider, exporting to ``--otlp``; httpx2 requests carry its context."""
    tp = TracerProvider(resource=Resource.create({"service.name": service}))
    tp.add_span_processor(BatchSpanProcessor(exporter(args)))
    trace.set_tracer_provider(tp)
    HTTPX2ClientInstrumentor().instrument(tracer_provider=tp)
    return tp


async def weather(args: argparse.Namespace) -> str:
    await asyncio.sleep(args.tool_s)
    return WEATHER
