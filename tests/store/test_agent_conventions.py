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

from support import agent_conventions

PARTS = ("wall_ms", "input_processing_ms", "generation_ms", "tool_wait_ms", "app_work_ms", "user_pause_ms")


def _parts(row: dict) -> dict:
    return {k: row[k] for k in (*PARTS, "unattributed_ms")}


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("conventions")
    agent_conventions.build(root)
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


def test_a_role_filter_is_the_shorter_of_its_list_and_the_complement():
    from kvtrace.store.views.agents import ROW_ROLES, role_in

    assert role_in(sc.ROLE_LLM_CALL, "request") == "role IN ('llm_call', 'request')"
    five = (sc.ROLE_SESSION, sc.ROLE_TURN, sc.ROLE_LLM_CALL, sc.ROLE_AGENT, "request")
    assert role_in(*five) == "role NOT IN ('tool_wait', 'app_work', 'user_pause', 'retention')"
    with pytest.raises(ValueError, match="not a role of the scan"):
        role_in("llm_call", "tool")
    # on rows of every role and of none (a span seen but not placed), the filter keeps exactly the list's
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE r (role VARCHAR)")
    con.executemany("INSERT INTO r VALUES (?)", [(x,) for x in (*ROW_ROLES, None)])
    kept = {row[0] for row in con.execute(f"SELECT role FROM r WHERE {role_in(*five)}").fetchall()}
    assert kept == set(five)


def test_every_role_the_scan_gives_a_span_is_one_the_role_filters_know():
    from kvtrace.store.views.agents import ROW_ROLES

    given = set(sc.ROLE_BY_SPAN_NAME.values()) | {role for *_, role in sc.ROLE_RULES}
    assert given <= set(ROW_ROLES)
