"""One session read from a DuckDB store through ``Timestamp`` bounds (:mod:`kvtrace.store.bounds`,
:func:`kvtrace.analysis.pushdown.narrowed`): every session-scoped query gives the answer it gives
over the whole store, on kvtrace's own sessions and on agents of other conventions (a session is
its traces'; the span naming it is not always the first), and the bounded cursor reads fewer rows
while the connection it came from still reads all of them."""

from __future__ import annotations

import pytest

from kvtrace.analysis import pushdown, sessions
from kvtrace.analysis.filters import Filters
from kvtrace.store import bounds, connect
from kvtrace.testing.synth import SpanBuilder, sample_store

from support import agent_conventions, session_queries

ns = SpanBuilder().ns


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    own, agents = tmp_path_factory.mktemp("own"), tmp_path_factory.mktemp("agents")
    sample_store(own, sessions=3, turns=3)
    agent_conventions.build(agents)
    return {"own": connect(own), "agents": connect(agents)}


def _cases(con) -> list[str]:
    return [*sessions.list_sessions(con), "prefix-aaa", "nobody"]


@pytest.mark.parametrize("query", session_queries.SESSION_QUERIES)
@pytest.mark.parametrize("store", ["own", "agents"])
def test_a_bounded_session_gives_the_whole_stores_answer(stores, whole, store, query):
    con = stores[store]
    for sid in _cases(con):
        f = Filters(session_id=sid)
        got, expected = session_queries.SESSION_QUERIES[query](con, f), whole(query, con, f)
        assert session_queries.same_answer(got, expected), (sid, got, expected)


def _windows(con) -> list[Filters]:
    """Time ranges over the store: each session's start, middle and end instants, open-ended ones,
    and one after everything."""
    out = [Filters(end_ns=ns(10**9)), Filters(start_ns=ns(10**9))]
    for r in sessions.breakdown(con).to_pylist():
        mid = (r["start_ns"] + r["end_ns"]) // 2
        out += [Filters(start_ns=mid, end_ns=mid), Filters(start_ns=r["end_ns"]), Filters(end_ns=r["start_ns"])]
    return out


@pytest.mark.parametrize("query", session_queries.SESSION_QUERIES)
@pytest.mark.parametrize("store", ["own", "agents"])
def test_a_bounded_time_range_gives_the_whole_stores_answer(stores, whole, store, query):
    con = stores[store]
    for f in _windows(con):
        got, expected = session_queries.SESSION_QUERIES[query](con, f), whole(query, con, f)
        assert session_queries.same_answer(got, expected), (f, got, expected)


def test_a_session_is_bounded_by_its_traces(stores):
    con = stores["agents"]
    # OpenLLMetry's workflow span (70.0 s) starts before the request naming prefix-ddd (70.11 s)
    assert bounds.session_bounds(con, "prefix-ddd") == (ns(70_000), ns(70_800))
    assert bounds.session_bounds(con, "prefix-aaa") == (ns(0), ns(22_000))  # the oi-1 runs' traces
    assert bounds.session_bounds(con, "g-1") == (ns(60_000), ns(61_000))  # gen_ai.conversation.id
    assert bounds.session_bounds(con, "nobody") is None


def _count(con) -> int:
    return con.execute("SELECT count(*) FROM kvtrace_raw").fetchall()[0][0]


def test_the_bounded_cursor_reads_its_window_only(stores):
    con = stores["agents"]
    everything = _count(con)
    cur = pushdown.narrowed(con, Filters(session_id="lg-1"))
    assert cur is not con and _count(cur) == 5 < everything  # the graph's 4 spans and its lone request
    plan = cur.execute("EXPLAIN SELECT count(*) FROM kvtrace_raw").fetchall()[0][1]
    assert "Timestamp >=" in plan and "Timestamp <=" in plan  # pushed into the Parquet scan
    assert _count(con) == everything  # the variables are the cursor's own
    assert _count(pushdown.narrowed(con, Filters(session_id="nobody"))) == 0
    # a time range: the traces of the sessions whose traces overlap it (here the GenAI agent's only)
    assert bounds.window_bounds(con, ns(60_100), ns(60_200)) == (ns(60_000), ns(61_000))
    assert _count(pushdown.narrowed(con, Filters(start_ns=ns(60_100), end_ns=ns(60_200)))) < everything
    assert bounds.window_bounds(con, ns(10**9), None) is None  # nothing that late
    assert pushdown.narrowed(con, Filters(service="x")) is con  # not session-scoped by time or id
    assert pushdown.narrowed(con, None) is con


def test_a_locked_down_connection_is_bounded_too(tmp_path):
    # the dashboard's connections are read-only (configuration locked); variables are not configuration
    agent_conventions.build(tmp_path)
    con = connect(tmp_path, read_only=True)
    f = Filters(session_id="prefix-ddd")
    assert _count(pushdown.narrowed(con, f)) == 4  # the workflow, its chat and tool, the request
    assert [t["wall_ms"] for t in sessions.turns(con, f).to_pylist()] == [800.0]
