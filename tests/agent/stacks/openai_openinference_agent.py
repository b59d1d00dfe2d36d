"""Plain ``openai`` + ``openinference-instrumentation-openai`` (its LLM spans), with the agent's own
AGENT / TOOL spans made with OpenInference's tracer (``OITracer``), as an OpenInference user of
the bare client does; the session is ``using_session``."""

from __future__ import annotations

import asyncio

import stack_common as common
from openai import AsyncOpenAI
from openinference.instrumentation import OITracer, TraceConfig, using_session
from openinference.instrumentation.openai import OpenAIInstrumentor
from opentelemetry import trace


async def turn(tracer: OITracer, client: AsyncOpenAI, args, messages: list) -> None:
    with tracer.start_as_current_span("Weather agent", openinference_span_kind="agent"):
        while True:
            reply = await client.chat.completions.create(model=args.model, messages=messages, tools=common.TOOLS)
            message = reply.choices[0].message
            messages.append(message.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True))
            if not message.tool_calls:
                return
            for call in message.tool_calls:
                with tracer.start_as_current_span(call.function.name, openinference_span_kind="tool"):
                    result = await common.weather(args)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


async def main() -> None:
    args = common.parse_args()
    tp = common.provider(args, "weather-agent-openai-openinference")
    OpenAIInstrumentor().instrument(tracer_provider=tp)
    tracer = OITracer(trace.get_tracer("weather-agent"), config=TraceConfig())
    client = AsyncOpenAI(base_url=args.base_url, api_key="sim", max_retries=0)
    messages: list = [{"role": "system", "content": common.INSTRUCTIONS}]
    with using_session(args.session_id):
        for question in common.QUESTIONS:
            messages.append({"role": "user", "content": question})
            await turn(tracer, client, args, messages)
    tp.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
