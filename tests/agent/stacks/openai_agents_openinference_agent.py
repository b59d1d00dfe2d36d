"""OpenAI Agents SDK + ``openinference-instrumentation-openai-agents``: a 3-turn weather agent, one
``get_weather`` call per turn; the session is OpenInference's ``using_session``."""

from __future__ import annotations

import asyncio

import stack_common as common
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
from openai import AsyncOpenAI
from openinference.instrumentation import using_session
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor


async def main() -> None:
    args = common.parse_args()
    tp = common.provider(args, "weather-agent-openai-agents-openinference")
    OpenAIAgentsInstrumentor().instrument(tracer_provider=tp)  # replaces the SDK's own exporter

    @function_tool
    async def get_weather() -> str:
        """The weather where the user asked."""
        return await common.weather(args)

    client = AsyncOpenAI(base_url=args.base_url, api_key="sim", max_retries=0)
    model = OpenAIChatCompletionsModel(model=args.model, openai_client=client)
    agent = Agent(name="Weather agent", instructions=common.INSTRUCTIONS, tools=[get_weather], model=model)
    history: list = []
    with using_session(args.session_id):
        for question in common.QUESTIONS:
            result = await Runner.run(agent, [*history, {"role": "user", "content": question}])
            history = result.to_input_list()
    tp.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
