"""Agents traced with OpenInference, OTel GenAI or OpenLLMetry spans (no kvtrace code in them): the
breakdown places their spans by convention, puts the proxy's spans into the agent's session, counts
one turn per agent run, and joins every LLM call to its proxy request (exact ms)."""

from __future__ import annotations

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis import sessions
from kvtrace.analysis.filters import Filters
from kvtrace.store import connect
from kvtrace.testing.synth import SpanBuilder

PARTS = ("wall_ms", "input_processing_ms", "generation_ms", "tool_wait_ms", "app_work_ms", "user_pause_ms")
OI = sc.OPENINFERENCE_SPAN_KIND


def _parts(row: dict) -> dict:
    return {k: row[k] for k in (*PARTS, "unattributed_ms")}


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


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    b = SpanBuilder()
    for k, base in enumerate((0, 10_000, 20_000)):
        _oi_turn(b, base, nested=k == 0)
    _langgraph(b)
    _genai(b)
    _openllmetry(b)
    root = tmp_path_factory.mktemp("conventions")
    b.write(root)
    return root


@pytest.fixture(scope="module")
def store(traces):
    return connect(traces)


def _rows(con, sql: str) -> list[dict]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def test_each_agent_is_one_session_under_its_own_id(store):
    by_id = {r["session_id"]: r for r in sessions.breakdown(store, limit=100).to_pylist()}
    assert sorted(by_id) == ["g-1", "lg-1", "oi-1", "prefix-ddd"]  # no prefix-aaa: the agent's id won
    assert {k: (r["turns"], r["unplaced_spans"]) for k, r in by_id.items()} == {
        "oi-1": (3, 0),
        "lg-1": (1, 1),
        "g-1": (1, 0),
        "prefix-ddd": (1, 0),
    }


def test_openinference_session_splits_into_the_five_parts(store):
    row = sessions.breakdown(store, Filters(session_id="oi-1")).to_pylist()[0]
    # per turn: input 220 + 110 (TTFT from the request: its start + its TTFT), generation 280 + 390,
    # tool 500, app work 500 (the agent run's own time); 16 s between the turns is unattributed
    assert _parts(row) == {
        "wall_ms": 22_000.0,
        "input_processing_ms": 990.0,
        "generation_ms": 2010.0,
        "tool_wait_ms": 1500.0,
        "app_work_ms": 17_500.0,
        "user_pause_ms": 0.0,
        "unattributed_ms": 16_000.0,
    }
    assert sum(row[k] for k in PARTS[1:]) == row["wall_ms"]


def test_a_turn_is_one_agent_run(store):
    turns = sessions.turns(store, Filters(session_id="oi-1")).to_pylist()
    assert [(t["turn"], t["start_ns"], t["end_ns"]) for t in turns] == [
        (i, SpanBuilder().ns(base), SpanBuilder().ns(base + 2000)) for i, base in enumerate((0, 10_000, 20_000))
    ]
    for t in turns:  # the nested agent and chain of turn 0 count once, inside the app work
        assert _parts(t) == {
            "wall_ms": 2000.0,
            "input_processing_ms": 330.0,
            "generation_ms": 670.0,
            "tool_wait_ms": 500.0,
            "app_work_ms": 500.0,
            "user_pause_ms": 0.0,
            "unattributed_ms": 0.0,
        }


def test_broken_context_joins_by_time_and_genai_ttft_is_the_spans_own(store):
    by_id = {r["session_id"]: _parts(r) for r in sessions.breakdown(store, limit=100).to_pylist()}
    assert by_id["lg-1"] == {  # TTFT from the request it overlaps: 20 + 100 ms
        "wall_ms": 1000.0,
        "input_processing_ms": 120.0,
        "generation_ms": 280.0,
        "tool_wait_ms": 300.0,
        "app_work_ms": 300.0,
        "user_pause_ms": 0.0,
        "unattributed_ms": 0.0,
    }
    assert by_id["g-1"] == {  # gen_ai.response.time_to_first_chunk 0.05 s beats the proxy's 30 ms + 10 ms
        "wall_ms": 1000.0,
        "input_processing_ms": 50.0,
        "generation_ms": 250.0,
        "tool_wait_ms": 200.0,
        "app_work_ms": 500.0,
        "user_pause_ms": 0.0,
        "unattributed_ms": 0.0,
    }
    assert by_id["prefix-ddd"]["tool_wait_ms"] == 200.0 and by_id["prefix-ddd"]["input_processing_ms"] == 50.0


def test_trace_sessions_record_the_proxys_session_as_the_agents(store):
    rows = _rows(
        store,
        "SELECT t.session_id, t.agent_session_id, t.proxy_session_id, t.join_kind, count(*) AS traces "
        "FROM trace_sessions t GROUP BY ALL ORDER BY ALL",
    )
    assert [tuple(r.values()) for r in rows] == [
        ("g-1", "g-1", "g-1", sc.JOIN_TRACE, 1),
        ("lg-1", "lg-1", None, sc.JOIN_TRACE, 1),
        ("lg-1", None, None, sc.JOIN_SESSION_TIME, 1),  # the request's own trace
        ("oi-1", "oi-1", "prefix-aaa", sc.JOIN_TRACE, 3),  # the proxy's prefix session is the agent's
        ("prefix-ddd", None, "prefix-ddd", sc.JOIN_TRACE, 1),  # no session id on the agent's spans
    ]


def test_every_llm_call_reaches_its_kv_decision(store):
    rows = _rows(
        store,
        "SELECT session_id, convention, join_kind, request_id, outcome, input_tokens, output_tokens, ttft_ms "
        "FROM agent_llm_calls ORDER BY start_ns",
    )
    oi = [
        {
            "session_id": "oi-1",
            "convention": sc.CONV_OPENINFERENCE,
            "join_kind": sc.JOIN_TRACE,
            "request_id": f"oi-{base}-{n}",
            "outcome": "pulled",
            "input_tokens": 50,
            "output_tokens": 5,
            "ttft_ms": ttft,
        }
        for base in (0, 10_000, 20_000)
        for n, ttft in ((0, 220.0), (1, 110.0))
    ]
    assert rows == oi + [
        {
            "session_id": "lg-1",
            "convention": sc.CONV_OPENINFERENCE,
            "join_kind": sc.JOIN_SESSION_TIME,
            "request_id": "lg-req",
            "outcome": "no_remote",
            "input_tokens": 100,
            "output_tokens": 10,
            "ttft_ms": 120.0,
        },
        {
            "session_id": "g-1",
            "convention": sc.CONV_GENAI,
            "join_kind": sc.JOIN_TRACE,
            "request_id": "g-req",
            "outcome": None,
            "input_tokens": 40,  # the span's own
            "output_tokens": 7,  # the request's
            "ttft_ms": 50.0,
        },
        {
            "session_id": "prefix-ddd",
            "convention": sc.CONV_OPENLLMETRY,
            "join_kind": sc.JOIN_TRACE,
            "request_id": "tl-req",
            "outcome": None,
            "input_tokens": 100,
            "output_tokens": 10,
            "ttft_ms": 50.0,
        },
    ]
