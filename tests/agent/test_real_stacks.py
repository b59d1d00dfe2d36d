"""Agents as they are already instrumented, with the real packages from PyPI (the side venv of
tests/agent/stacks/): a 3-turn weather agent, one 0.5 s tool per turn, through ``kvtrace proxy``
over ``kvtrace sim --tool-calls first-tool``, its spans sent over OTLP/HTTP into ``kvtrace collect``
in the same trace directory.  The views then put every span of the agent's traces in the agent's
own session, count one turn per agent run, make tool_wait the tool spans' union, split the wall
time into five parts that sum to it and join each LLM call to the KV decision P made for it.

Skipped when the side venv is absent, except under CI=true where that is a failure."""

from __future__ import annotations

import signal
from dataclasses import dataclass

import pytest

from kvtrace import semconv as sc
from kvtrace.store import connect

from support.agent_stacks import Rig, stacks_python

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
TURNS = 3
TOOL_MS = 500.0
# SIGTERM: the sim and the collector exit 0; the proxy flushes its spans, then dies of the signal
CLEAN_EXITS = {"sim": 0, "proxy": -signal.SIGTERM, "collect": 0}
PARTS = ("input_processing_ms", "generation_ms", "tool_wait_ms", "app_work_ms", "user_pause_ms")


@dataclass(frozen=True)
class Stack:
    script: str
    tool_span: str  # the name the framework gives its tool spans
    convention: str  # whose attributes the LLM-call spans carry first (ROLE_RULES order)
    join: str  # how the LLM calls find their proxy requests


STACKS = {
    "openai-agents+openinference": Stack(
        "openai_agents_openinference_agent.py", "get_weather", sc.CONV_OPENINFERENCE, sc.JOIN_TRACE
    ),
    "openai+openai-v2+genai-spans": Stack(
        "openai_v2_genai_agent.py", "execute_tool get_weather", sc.CONV_GENAI, sc.JOIN_TRACE
    ),
    "openai+openinference": Stack("openai_openinference_agent.py", "get_weather", sc.CONV_OPENINFERENCE, sc.JOIN_TRACE),
    # OpenLLMetry's LLM spans carry gen_ai.operation.name before llm.request.type
    "openai-agents+openllmetry": Stack("openllmetry_agent.py", "get_weather.tool", sc.CONV_GENAI, sc.JOIN_TRACE),
    # OpenInference's LangChain tracer never attaches its context: the HTTP spans are trace roots
    "langgraph+openinference": Stack(
        "langgraph_openinference_agent.py", "get_weather", sc.CONV_OPENINFERENCE, sc.JOIN_SESSION_TIME
    ),
}


@dataclass
class Run:
    stack: Stack
    session_id: str
    con: object

    def rows(self, sql: str, params: dict | None = None) -> list[dict]:
        cur = self.con.execute(sql, params or {})
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


@pytest.fixture(scope="module", params=sorted(STACKS))
def run(request, tmp_path_factory):
    stacks_python()  # skip (or fail under CI) before starting anything
    stack = STACKS[request.param]
    root = tmp_path_factory.mktemp(request.param.replace("+", "-"))
    session_id = f"agent-{request.param}"
    rig = Rig(root / "traces", root)
    try:
        rig.wait_ready()
        done = rig.run_agent(stack.script, session_id)
        assert done.returncode == 0, f"{stack.script} failed:\n{done.stderr[-4000:]}\n{rig.logs()}"
        assert rig.stop() == CLEAN_EXITS, rig.logs()
    finally:
        rig.kill()
    return Run(stack, session_id, connect(root / "traces"))


def _union_ms(intervals: list[tuple[int, int]]) -> float:
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total, end = total + (e - s), e
        elif e > end:
            total, end = total + (e - end), e
    return total / 1e6


def _tool_spans(run: Run) -> list[tuple[int, int]]:
    rows = run.rows("SELECT start_ns, end_ns FROM spans WHERE name = $name", {"name": run.stack.tool_span})
    return [(r["start_ns"], r["end_ns"]) for r in rows]


def _session(run: Run) -> dict:
    (row,) = run.rows("SELECT * FROM session_breakdown")
    return row


def test_every_span_of_the_agents_traces_is_in_the_agents_own_session(run):
    assert _session(run)["session_id"] == run.session_id
    assert run.rows("SELECT DISTINCT session_id FROM trace_sessions") == [{"session_id": run.session_id}]
    # every span of the store (agent, proxy, P, D) is in a trace whose session the agent decided
    assert run.rows("SELECT count(*) AS n FROM spans ANTI JOIN trace_sessions USING (trace_id)") == [{"n": 0}]
    own = run.rows("SELECT count(*) AS n FROM trace_sessions WHERE agent_session_id = $s", {"s": run.session_id})
    assert own == [{"n": TURNS}]  # one trace per agent run, each naming the session itself


def test_a_turn_is_one_agent_run(run):
    assert _session(run)["turns"] == TURNS
    turns = run.rows("SELECT turn, start_ns, end_ns, tool_wait_ms FROM turn_breakdown ORDER BY turn")
    assert [t["turn"] for t in turns] == list(range(TURNS))
    tools = _tool_spans(run)
    for t in turns:  # each turn holds one tool call, and its tool_wait is that span
        inside = [(s, e) for s, e in tools if t["start_ns"] <= s and e <= t["end_ns"]]
        assert len(inside) == 1, (t, tools)
        assert t["tool_wait_ms"] == pytest.approx(_union_ms(inside), abs=1.0)


def test_tool_wait_is_the_union_of_the_tool_spans(run):
    tools = _tool_spans(run)
    assert len(tools) == TURNS
    tool_wait = _session(run)["tool_wait_ms"]
    assert tool_wait == pytest.approx(_union_ms(tools), abs=1.0)
    assert TURNS * TOOL_MS <= tool_wait < TURNS * (TOOL_MS + 250)  # the sleeps plus the framework's own time


def test_five_parts_sum_to_the_wall_time_of_the_agents_extent(run):
    row = _session(run)
    assert sum(row[p] for p in PARTS) == pytest.approx(row["wall_ms"], abs=0.01)
    assert row["unplaced_spans"] == 0 and row["user_pause_ms"] == 0.0
    assert min(row[p] for p in PARTS[:4]) > 0, row
    # the window is the agent's extent: its first span's start to its last span's end
    (extent,) = run.rows(
        "SELECT min(start_ns) AS s, max(end_ns) AS e FROM spans WHERE service_name LIKE 'weather-agent-%'"
    )
    assert (row["start_ns"], row["end_ns"]) == (extent["s"], extent["e"])


def test_each_llm_call_reaches_the_kv_decision_p_made_for_it(run):
    calls = run.rows(
        "SELECT a.session_id, a.convention, a.join_kind, a.request_id, a.outcome, d.outcome AS decision "
        "FROM agent_llm_calls a LEFT JOIN kv_decisions d ON d.request_id = a.request_id AND d.engine_role = $p "
        "ORDER BY a.start_ns",
        {"p": sc.ROLE_PREFILL},
    )
    assert len(calls) == 2 * TURNS, calls  # per turn: the call that asks for the tool, the one after it
    assert {(c["session_id"], c["convention"], c["join_kind"]) for c in calls} == {
        (run.session_id, run.stack.convention, run.stack.join)
    }
    assert all(c["outcome"] is not None and c["outcome"] == c["decision"] for c in calls), calls
    requests = run.rows("SELECT request_id FROM requests ORDER BY start_ns")
    assert [c["request_id"] for c in calls] == [r["request_id"] for r in requests]  # one each, in order
