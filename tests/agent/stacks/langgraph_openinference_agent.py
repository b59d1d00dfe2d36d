"""LangGraph + ``langchain-openai`` + ``openinference-instrumentation-langchain``: a 3-turn ReAct
weather graph, one ``get_weather`` call per turn; the session is OpenInference's ``using_session``."""

from __future__ import annotations

import asyncio

import stack_common as common
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent
from openinference.instrumentation import using_session
from openinference.instrumentation.langchain import LangChainInstrumentor


async def main() -> None:
    args = common.parse_args()
    tp = common.provider(args, "weather-agent-langgraph-openinference")
    LangChainInstrumentor().instrument(tracer_provider=tp)

    @tool
    async def get_weather() -> str:
        """The weather where the user asked."""
        return await common.weather(args)

    llm = ChatOpenAI(model=args.model, base_url=args.base_url, api_key="sim", max_retries=0)
    graph = create_react_agent(llm, [get_weather], prompt=common.INSTRUCTIONS)
    messages: list = []
    with using_session(args.session_id):
        for question in common.QUESTIONS:
            state = await graph.ainvoke({"messages": [*messages, ("user", question)]})
            messages = state["messages"]
    tp.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
