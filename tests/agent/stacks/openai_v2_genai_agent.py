"""Plain ``openai`` + the official ``opentelemetry-instrumentation-openai-v2`` (its ``chat {model}``
spans), with the agent's own ``invoke_agent`` / ``execute_tool`` spans written by hand per the OTel
GenAI conventions (the attribute names from ``opentelemetry-semantic-conventions``), as a user of
openai-v2 does; the session is ``gen_ai.conversation.id``.  Streams its model calls."""

from __future__ import annotations

import asyncio
import json

import stack_common as common
from openai import AsyncOpenAI
from opentelemetry import trace
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as genai


async def chat(client: AsyncOpenAI, args, messages: list) -> dict:
    """One streamed model call: the assistant message, tool calls assembled from their deltas."""
    stream = await client.chat.completions.create(
        model=args.model, messages=messages, tools=common.TOOLS, stream=True, stream_options={"include_usage": True}
    )
    content, calls = "", {}
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or ():
                blank = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                call = calls.setdefault(d.index, blank)
                call["id"] = d.id or call["id"]
                call["function"]["name"] += (d.function and d.function.name) or ""
                call["function"]["arguments"] += (d.function and d.function.arguments) or ""
    message = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


async def turn(tracer, client, args, messages: list) -> None:
    attrs = {
        genai.GEN_AI_OPERATION_NAME: "invoke_agent",
        genai.GEN_AI_AGENT_NAME: common.AGENT,
        genai.GEN_AI_PROVIDER_NAME: "openai",
        genai.GEN_AI_REQUEST_MODEL: args.model,
        genai.GEN_AI_CONVERSATION_ID: args.session_id,
    }
    with tracer.start_as_current_span(f"invoke_agent {common.AGENT}", attributes=attrs):
        while True:
            message = await chat(client, args, messages)
            messages.append(message)
            if not message.get("tool_calls"):
                return
            for call in message["tool_calls"]:
                name = call["function"]["name"]
                tool_attrs = {
                    genai.GEN_AI_OPERATION_NAME: "execute_tool",
                    genai.GEN_AI_TOOL_NAME: name,
                    genai.GEN_AI_TOOL_TYPE: "function",
                    genai.GEN_AI_TOOL_CALL_ID: call["id"],
                    genai.GEN_AI_CONVERSATION_ID: args.session_id,
                }
                with tracer.start_as_current_span(f"execute_tool {name}", attributes=tool_attrs):
                    json.loads(call["function"]["arguments"] or "{}")
                    result = await common.weather(args)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})


async def main() -> None:
    args = common.parse_args()
    tp = common.provider(args, "weather-agent-openai-v2-genai")
    OpenAIInstrumentor().instrument(tracer_provider=tp)
    tracer = trace.get_tracer("weather-agent")
    client = AsyncOpenAI(base_url=args.base_url, api_key="sim", max_retries=0)
    messages: list = [{"role": "system", "content": common.INSTRUCTIONS}]
    for question in common.QUESTIONS:
        messages.append({"role": "user", "content": question})
        await turn(tracer, client, args, messages)
    tp.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
