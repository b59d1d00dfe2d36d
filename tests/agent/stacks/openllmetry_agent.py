"""OpenAI Agents SDK + OpenLLMetry (``traceloop-sdk`` with its
``opentelemetry-instrumentation-openai-agents``): a 3-turn weather agent, one ``get_weather`` call
per turn; the session is Traceloop's association property ``session_id``."""

from __future__ import annotations

import asyncio

import stack_common as common
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
from openai import AsyncOpenAI
from opentelemetry import trace
from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor
from traceloop.sdk import Traceloop
from traceloop.sdk.instruments import Instruments


async def main() -> None:
    args = common.parse_args()
    Traceloop.init(
        app_name="weather-agent-openllmetry",
        exporter=common.exporter(args),
        disable_batch=True,
        telemetry_enabled=False,
        instruments={Instruments.OPENAI_AGENTS},
    )
    HTTPX2ClientInstrumentor().instrument(tracer_provider=trace.get_tracer_provider())
    Traceloop.set_association_properties({"session_id": args.session_id})

    @function_tool
    async def get_weather() -> str:
        """The weather where the user asked."""
        return await common.weather(args)

    client = AsyncOpenAI(base_url=args.base_url, api_key="sim", max_retries=0)
    model = OpenAIChatCompletionsModel(model=args.model, openai_client=client)
    agent = Agent(name="Weather agent", instructions=common.INSTRUCTIONS, tools=[get_weather], model=model)
    history: list = []
    for question in common.QUESTIONS:
        result = await Runner.run(agent, [*history, {"role": "user", "content": question}])
        history = result.to_input_list()
    trace.get_tracer_provider().shutdown()


if __name__ == "__main__":
    asyncio.run(main())
