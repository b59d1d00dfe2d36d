"""kvtrace.agent: instrumentation for agents, nothing else.

Agent-side spans (session, turn, LLM call, tool call, app work, user pause), trace and session propagation
to the proxy, and a traced ``openai`` client.  See :mod:`kvtrace.agent.api` for the API; the
benchmark that drives agents through it is :mod:`kvtrace.bench`.
The ``openai`` wrapper is imported lazily (``openai`` is an optional dependency).
"""

from kvtrace.agent.api import (
    Agent,
    app_work,
    current_agent,
    llm_call,
    session,
    tool_call,
    traced_tool,
    turn,
    user_pause,
)
from kvtrace.agent.context import (
    current_session,
    current_turn,
    extra_body,
    last_kv_transfer,
    last_result,
    request_headers,
)
from kvtrace.agent.llm import ERROR_STREAM_INTERRUPTED, LLMCall, LLMResult

_LAZY = {"instrument_openai", "TracedOpenAI", "TracedAsyncOpenAI", "kv_transfer_of"}

__all__ = [
    "Agent",
    "ERROR_STREAM_INTERRUPTED",
    "LLMCall",
    "LLMResult",
    "app_work",
    "current_agent",
    "current_session",
    "current_turn",
    "extra_body",
    "last_kv_transfer",
    "last_result",
    "llm_call",
    "request_headers",
    "session",
    "tool_call",
    "traced_tool",
    "turn",
    "user_pause",
    *sorted(_LAZY),
]


def __getattr__(name: str):
    if name in _LAZY:
        from kvtrace.agent import openai_wrap

        return getattr(openai_wrap, name)
    raise AttributeError(f"module 'kvtrace.agent' has no attribute {name!r}")
