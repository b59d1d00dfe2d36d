"""kvtrace.agent API: span names, whole attribute dicts, parent links, context propagation."""

from __future__ import annotations

import asyncio
import threading

import pytest
from opentelemetry import baggage
from opentelemetry.trace import SpanKind, StatusCode

from kvtrace import semconv as sc
from kvtrace.agent import (
    Agent,
    app_work,
    current_session,
    extra_body,
    request_headers,
    session,
    tool_call,
    traced_tool,
    turn,
    user_pause,
)


def by_name(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


def one(exporter, name):
    spans = by_name(exporter, name)
    assert len(spans) == 1, [s.name for s in exporter.get_finished_spans()]
    return spans[0]


def parent_id(span):
    return span.parent.span_id if span.parent is not None else None


def test_session_turn_tool_app_work_tree(tracer_provider, span_exporter):
    agent = Agent(tracer_provider, name="coder")
    with agent.session("s-1", scenario="unit") as state:
        assert current_session() is state and state.session_id == "s-1"
        with agent.turn() as t0:
            with agent.app_work("plan"):
                pass
            with agent.tool_call("grep", call_id="call-1"):
                pass
        with agent.turn() as t1:
            pass
    assert (t0.index, t1.index) == (0, 1)
    assert current_session() is None

    sess = one(span_exporter, sc.SPAN_AGENT_SESSION)
    turns = sorted(by_name(span_exporter, sc.SPAN_AGENT_TURN), key=lambda s: s.attributes[sc.TURN_INDEX])
    tool = one(span_exporter, sc.SPAN_AGENT_TOOL_CALL)
    work = one(span_exporter, sc.SPAN_AGENT_APP_WORK)
    assert dict(sess.attributes) == {
        sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
        sc.OPENINFERENCE_SPAN_KIND: sc.OI_AGENT,
        sc.GEN_AI_AGENT_NAME: "coder",
        sc.SESSION_ID: "s-1",
        sc.GEN_AI_CONVERSATION_ID: "s-1",
        sc.AGENT_SCENARIO: "unit",
    }
    assert sess.kind == SpanKind.INTERNAL and sess.parent is None
    in_session = {sc.SESSION_ID: "s-1", sc.GEN_AI_CONVERSATION_ID: "s-1"}
    run = {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.OPENINFERENCE_SPAN_KIND: sc.OI_CHAIN}
    assert [dict(t.attributes) for t in turns] == [
        {**run, sc.TURN_INDEX: 0, sc.GEN_AI_AGENT_NAME: "coder", **in_session},
        {**run, sc.TURN_INDEX: 1, sc.GEN_AI_AGENT_NAME: "coder", **in_session},
    ]
    assert dict(tool.attributes) == {
        sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
        sc.OPENINFERENCE_SPAN_KIND: sc.OI_TOOL,
        sc.GEN_AI_TOOL_NAME: "grep",
        sc.GEN_AI_TOOL_TYPE: sc.TOOL_TYPE_FUNCTION,
        sc.GEN_AI_TOOL_CALL_ID: "call-1",
        **in_session,
        sc.TURN_INDEX: 0,
    }
    assert dict(work.attributes) == {
        sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TASK,
        sc.OPENINFERENCE_SPAN_KIND: sc.OI_CHAIN,
        sc.AGENT_WORK_NAME: "plan",
        **in_session,
        sc.TURN_INDEX: 0,
    }
    sid = sess.context.span_id
    assert [parent_id(t) for t in turns] == [sid, sid]
    assert parent_id(tool) == turns[0].context.span_id
    assert parent_id(work) == turns[0].context.span_id
    assert {s.context.trace_id for s in span_exporter.get_finished_spans()} == {sess.context.trace_id}


async def test_user_pause_spans_mark_the_users_time(tracer_provider, span_exporter):
    """Between turns (the session is the parent, no turn index), inside a turn, and through the
    module-level function, which finds the open session's agent."""
    agent = Agent(tracer_provider)
    async with agent.session("s-p"):
        async with agent.user_pause("think"):
            pass
        with agent.turn():
            with user_pause():
                pass
    sess, turn_span = one(span_exporter, sc.SPAN_AGENT_SESSION), one(span_exporter, sc.SPAN_AGENT_TURN)
    between, inside = by_name(span_exporter, sc.SPAN_AGENT_USER_PAUSE)
    pause = {
        sc.GEN_AI_OPERATION_NAME: sc.OP_USER_PAUSE,
        sc.OPENINFERENCE_SPAN_KIND: sc.OI_CHAIN,
        sc.SESSION_ID: "s-p",
        sc.GEN_AI_CONVERSATION_ID: "s-p",
    }
    assert dict(between.attributes) == {**pause, sc.AGENT_PAUSE_REASON: "think"}
    assert dict(inside.attributes) == {**pause, sc.TURN_INDEX: 0}
    assert parent_id(between) == sess.context.span_id and parent_id(inside) == turn_span.context.span_id
    assert between.kind == inside.kind == SpanKind.INTERNAL


def test_explicit_turn_index_moves_auto_increment(tracer_provider, span_exporter):
    agent = Agent(tracer_provider)
    with agent.session("s"):
        with agent.turn(5) as a:
            pass
        with agent.turn() as b:
            pass
    assert (a.index, b.index) == (5, 6)


def test_session_id_generated_and_baggage_set(tracer_provider, span_exporter):
    agent = Agent(tracer_provider)
    with agent.session() as state:
        assert len(state.session_id) == 32
        assert baggage.get_baggage(sc.BAGGAGE_SESSION_ID) == state.session_id
        assert extra_body() == {sc.BODY_CONVERSATION_ID: state.session_id}
    assert baggage.get_baggage(sc.BAGGAGE_SESSION_ID) is None
    assert extra_body() == {}


def test_request_headers_inside_llm_call(tracer_provider, span_exporter):
    agent = Agent(tracer_provider)
    with agent.session("s-h"):
        with agent.turn():
            with agent.llm_call("m", request_id="req-7", stream=True, max_tokens=32) as call:
                headers = request_headers()
                assert call.headers() == headers
                call.observe("a ")
                call.observe("b ")
                call.finish(
                    input_tokens=10,
                    output_tokens=2,
                    kv_transfer={
                        sc.KVT_DECISION: sc.OUTCOME_PULLED,
                        sc.KVT_PULLED_TOKENS: 96,
                        sc.KVT_REQUEST_ID: "req-7",
                    },
                )
    span = one(span_exporter, sc.SPAN_AGENT_LLM_CALL)
    ctx = span.context
    assert headers == {
        "traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}",
        "baggage": f"{sc.BAGGAGE_SESSION_ID}=s-h",
        sc.HEADER_SESSION_ID: "s-h",
        sc.HEADER_REQUEST_ID: "req-7",
    }
    attrs = dict(span.attributes)
    timing = {k: attrs.pop(k) for k in (sc.REQUEST_LATENCY_MS, sc.LLM_TTFT_MS, sc.LLM_TPOT_MS)}
    assert all(isinstance(v, float) and v >= 0 for v in timing.values())
    assert timing[sc.LLM_TTFT_MS] <= timing[sc.REQUEST_LATENCY_MS]
    assert attrs.pop(sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK) == timing[sc.LLM_TTFT_MS] / 1000.0  # the same, in s
    assert attrs == {
        sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
        sc.GEN_AI_PROVIDER_NAME: sc.PROVIDER_VLLM,
        sc.OPENINFERENCE_SPAN_KIND: sc.OI_LLM,
        sc.REQUEST_STREAM: True,
        sc.GEN_AI_REQUEST_MODEL: "m",
        sc.GEN_AI_REQUEST_MAX_TOKENS: 32,
        sc.SESSION_ID: "s-h",
        sc.GEN_AI_CONVERSATION_ID: "s-h",
        sc.TURN_INDEX: 0,
        sc.GEN_AI_REQUEST_ID: "req-7",
        sc.GEN_AI_USAGE_INPUT_TOKENS: 10,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 2,
        sc.KV_OUTCOME: sc.OUTCOME_PULLED,
        sc.KV_PULLED_TOKENS: 96,
    }
    assert span.kind == SpanKind.CLIENT
    assert parent_id(span) == one(span_exporter, sc.SPAN_AGENT_TURN).context.span_id
    assert call.result.outcome == sc.OUTCOME_PULLED and call.result.pulled_tokens == 96
    assert call.result.text == "a b "


def test_request_headers_outside_session_has_no_session_fields(tracer_provider, span_exporter):
    agent = Agent(tracer_provider)
    with agent.llm_call("m") as call:
        headers = call.headers()
    assert set(headers) == {"traceparent"}
    assert call.extra_body() == {}


def test_llm_call_exception_marks_error(tracer_provider, span_exporter):
    agent = Agent(tracer_provider)
    with pytest.raises(ConnectionError):
        with agent.llm_call("m"):
            raise ConnectionError("refused")
    span = one(span_exporter, sc.SPAN_AGENT_LLM_CALL)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes[sc.ERROR_TYPE] == "ConnectionError"
    assert [e.name for e in span.events] == ["exception"]


def test_tool_exception_recorded_and_reraised(tracer_provider, span_exporter):
    agent = Agent(tracer_provider)
    with agent.session("s"), agent.turn():
        with pytest.raises(ValueError):
            with agent.tool_call("flaky"):
                raise ValueError("bad")
    tool = one(span_exporter, sc.SPAN_AGENT_TOOL_CALL)
    assert tool.status.status_code == StatusCode.ERROR
    assert tool.attributes[sc.ERROR_TYPE] == "ValueError"
    # the turn and session saw no exception
    assert one(span_exporter, sc.SPAN_AGENT_TURN).status.status_code == StatusCode.UNSET


async def test_parallel_tool_calls_in_tasks_keep_their_parents(tracer_provider, span_exporter):
    agent = Agent(tracer_provider)
    started = asyncio.Event()
    waiting = 0

    async def tool(name: str):
        nonlocal waiting
        async with agent.tool_call(name):
            waiting += 1
            if waiting == 6:
                started.set()
            await started.wait()  # all six tool spans are open at the same time

    async def run_session(sid: str):
        async with agent.session(sid):
            async with agent.turn():
                await asyncio.gather(tool(f"{sid}-a"), tool(f"{sid}-b"), tool(f"{sid}-c"))

    await asyncio.wait_for(asyncio.gather(run_session("x"), run_session("y")), 5)
    turns = {s.attributes[sc.SESSION_ID]: s for s in by_name(span_exporter, sc.SPAN_AGENT_TURN)}
    tools = by_name(span_exporter, sc.SPAN_AGENT_TOOL_CALL)
    assert len(tools) == 6
    for t in tools:
        sid = t.attributes[sc.GEN_AI_TOOL_NAME].split("-")[0]
        assert t.attributes[sc.SESSION_ID] == sid
        assert t.attributes[sc.TURN_INDEX] == 0
        assert parent_id(t) == turns[sid].context.span_id
        assert t.context.trace_id == turns[sid].context.trace_id
    assert turns["x"].context.trace_id != turns["y"].context.trace_id


def test_sessions_in_threads_are_isolated(tracer_provider, span_exporter):
    agent = Agent(tracer_provider)
    barrier = threading.Barrier(2, timeout=5)

    def worker(sid):
        with agent.session(sid), agent.turn():
            barrier.wait()
            with agent.tool_call("t"):
                pass

    threads = [threading.Thread(target=worker, args=(s,)) for s in ("t1", "t2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    tools = by_name(span_exporter, sc.SPAN_AGENT_TOOL_CALL)
    turns = {s.attributes[sc.SESSION_ID]: s.context.span_id for s in by_name(span_exporter, sc.SPAN_AGENT_TURN)}
    assert sorted(t.attributes[sc.SESSION_ID] for t in tools) == ["t1", "t2"]
    assert all(parent_id(t) == turns[t.attributes[sc.SESSION_ID]] for t in tools)


async def test_decorators_sync_and_async(tracer_provider, span_exporter):
    agent = Agent(tracer_provider)

    @agent.traced_tool("search")
    async def search(q):
        await asyncio.sleep(0)
        return q * 2

    @traced_tool()
    def lint(path):
        return path.upper()

    @app_work("parse")
    def parse(x):
        return x + 1

    @agent.app_work("plan")
    async def plan():
        return "p"

    async with agent.session("dec"):
        async with agent.turn():
            assert await search("a") == "aa"
            assert lint("f.py") == "F.PY"
            assert parse(1) == 2
            assert await plan() == "p"
            assert await search("b") == "bb"  # a decorator opens a fresh span per call

    turn_id = one(span_exporter, sc.SPAN_AGENT_TURN).context.span_id
    tools = by_name(span_exporter, sc.SPAN_AGENT_TOOL_CALL)
    works = by_name(span_exporter, sc.SPAN_AGENT_APP_WORK)
    assert sorted(t.attributes[sc.GEN_AI_TOOL_NAME] for t in tools) == ["lint", "search", "search"]
    assert sorted(w.attributes[sc.AGENT_WORK_NAME] for w in works) == ["parse", "plan"]
    assert all(parent_id(s) == turn_id for s in tools + works)
    assert all(s.attributes[sc.SESSION_ID] == "dec" for s in tools + works)
    # module-level decorators used the session's agent (same provider, same trace)
    assert len({s.context.trace_id for s in span_exporter.get_finished_spans()}) == 1


async def test_decorated_async_tool_error(tracer_provider, span_exporter):
    agent = Agent(tracer_provider)

    @agent.traced_tool("boom")
    async def boom():
        raise RuntimeError("x")

    async with agent.session("e"):
        with pytest.raises(RuntimeError):
            await boom()
    tool = one(span_exporter, sc.SPAN_AGENT_TOOL_CALL)
    assert tool.attributes[sc.ERROR_TYPE] == "RuntimeError"
    assert tool.status.status_code == StatusCode.ERROR


def test_module_functions_take_a_provider(tracer_provider, span_exporter):
    with session("m-1", agent_name="mod", tracer_provider=tracer_provider):
        with turn():
            with tool_call("t", "c1"):
                pass
            with app_work("w"):
                pass
    names = sorted(s.name for s in span_exporter.get_finished_spans())
    assert names == sorted([sc.SPAN_AGENT_SESSION, sc.SPAN_AGENT_TURN, sc.SPAN_AGENT_TOOL_CALL, sc.SPAN_AGENT_APP_WORK])
    assert one(span_exporter, sc.SPAN_AGENT_SESSION).attributes[sc.GEN_AI_AGENT_NAME] == "mod"


def test_scope_cannot_be_entered_twice(tracer_provider):
    scope = Agent(tracer_provider).tool_call("t")
    with scope:
        with pytest.raises(RuntimeError):
            scope.__enter__()
