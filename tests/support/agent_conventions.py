"""A store of agents traced by the ecosystem's conventions, no kvtrace code in them: three
OpenAI Agents SDK runs as OpenInference traces them, a LangGraph run whose HTTP call lost the graph's
context, an OTel GenAI agent, and OpenLLMetry without a session attribute (its trace takes the
proxy's prefix session from a request that starts after the workflow span)."""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.testing.synth import SpanBuilder

OI = sc.OPENINFERENCE_SPAN_KIND
SESSIONS = ("oi-1", "lg-1", "g-1", "prefix-ddd")  # the agents' sessions; prefix-aaa lost to oi-1


def build(root) -> None:
    """Write the store into ``root``."""
    b = SpanBuilder()
    for k, base in enumerate((0, 10_000, 20_000)):
        _oi_turn(b, base, nested=k == 0)
    _langgraph(b)
    _genai(b)
    _openllmetry(b)
    b.write(root)


def _oi_turn(b: SpanBuilder, base: float, *, nested: bool) -> None:
    """An OpenAI Agents SDK run as OpenInference traces it: AGENT root, two LLM calls (no TTFT of
    their own), a 500 ms tool; the proxy's request spans continue the LLM calls' context and carry
    the proxy's prefix session."""
    root = b.span("Weather agent", base, base + 2000, attrs={OI: sc.OI_AGENT, sc.SESSION_ID: "oi-1"})
    if nested:  # a handoff agent and a chain inside the run: counted once
        inner = b.span("Helper agent", base + 50, base + 1900, parent=root, attrs={OI: sc.OI_AGENT})
        b.span("step", base + 60, base + 90, parent=inner, attrs={OI: sc.OI_CHAIN})
    for start, end, req_start, req_end, ttft, n in ((100, 600, 120, 580, 200.0, 0), (1200, 1700, 1210, 1690, 100.0, 1)):
        llm = b.span(
            "response",
            base + start,
            base + end,
            parent=root,
            kind="CLIENT",
            attrs={OI: sc.OI_LLM, sc.OI_LLM_TOKEN_COUNT_PROMPT: 50, sc.OI_LLM_TOKEN_COUNT_COMPLETION: 5},
        )
        b.request(
            "prefix-aaa", n, f"oi-{base}-{n}", base + req_start, base + req_end, ttft, parent=llm, outcome="pulled"
        )
    b.span("get_weather", base + 650, base + 1150, parent=root, attrs={OI: sc.OI_TOOL, sc.OI_TOOL_NAME: "w"})


def _langgraph(b: SpanBuilder) -> None:
    """LangGraph + OpenInference: the HTTP call never got the graph's context, so the proxy's
    request is the root of a trace of its own (no session); one span of an unknown kind."""
    graph = b.span("LangGraph", 50_000, 51_000, attrs={OI: sc.OI_CHAIN, sc.SESSION_ID: "lg-1"})
    b.span("ChatOpenAI", 50_100, 50_500, parent=graph, kind="CLIENT", attrs={OI: sc.OI_LLM})
    b.request(None, None, "lg-req", 50_120, 50_480, 100.0, outcome="no_remote")
    b.span("tools", 50_600, 50_900, parent=graph, attrs={OI: sc.OI_TOOL})
    b.span("mystery", 50_920, 50_950, parent=graph, attrs={OI: sc.OI_UNKNOWN})


def _genai(b: SpanBuilder) -> None:
    """OTel GenAI invoke_agent / chat / execute_tool spans; the chat span has its own TTFT (s)."""
    run = b.span(
        "invoke_agent weather",
        60_000,
        61_000,
        attrs={sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.GEN_AI_CONVERSATION_ID: "g-1"},
    )
    chat = b.span(
        "chat qwen",
        60_100,
        60_400,
        parent=run,
        kind="CLIENT",
        attrs={
            sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
            sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: 0.05,
            sc.GEN_AI_USAGE_INPUT_TOKENS: 40,
        },
    )
    b.request("g-1", 0, "g-req", 60_110, 60_390, 30.0, parent=chat, input_tokens=41, output_tokens=7)
    b.span("execute_tool w", 60_500, 60_700, parent=run, attrs={sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL})


def _openllmetry(b: SpanBuilder) -> None:
    """OpenLLMetry without any session attribute: the trace takes the proxy's (prefix) session."""
    flow = b.span("weather.workflow", 70_000, 70_800, attrs={sc.TRACELOOP_SPAN_KIND: sc.TL_WORKFLOW})
    chat = b.span("openai.chat", 70_100, 70_300, parent=flow, kind="CLIENT", attrs={sc.LLM_REQUEST_TYPE: sc.OP_CHAT})
    b.request("prefix-ddd", 0, "tl-req", 70_110, 70_290, 40.0, parent=chat)
    b.span("get_weather.tool", 70_400, 70_600, parent=flow, attrs={sc.TRACELOOP_SPAN_KIND: sc.TL_TOOL})
