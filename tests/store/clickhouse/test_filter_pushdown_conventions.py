"""Filters pushed down to ClickHouse for agents traced by the ecosystem's conventions: a session is
a property of whole traces, and the span naming it is not always the first (OpenLLMetry's workflow
starts before the proxy request that carries the session; an OpenInference run's requests carry the
proxy's prefix session, which loses to the agent's).  Every session-scoped query on the bounded
table equals DuckDB's on the directory."""

from __future__ import annotations

import pytest

pytest.importorskip("sqlglot")
pytest.importorskip("chdb")
clickhouse_check = pytest.importorskip("support.clickhouse_check")

from kvtrace.analysis.filters import Filters  # noqa: E402
from kvtrace.analysis.pushdown import narrowed  # noqa: E402
from kvtrace.store import connect  # noqa: E402
from kvtrace.testing.synth import SpanBuilder  # noqa: E402

from support import agent_conventions, session_queries  # noqa: E402

ns = SpanBuilder().ns  # ms after the builder's base -> epoch ns
CASES = {
    **{f"session {s}": Filters(session_id=s) for s in ("prefix-ddd", "prefix-aaa", "lg-1", "nobody")},
    "openllmetry's request": Filters(start_ns=ns(70_150), end_ns=ns(70_200)),
    "openinference turn 1": Filters(start_ns=ns(10_100), end_ns=ns(10_700)),
    "from the langgraph run on": Filters(start_ns=ns(50_000)),  # its request has no session
    "until the second oi turn": Filters(end_ns=ns(10_050)),
}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("conventions")
    agent_conventions.build(root)
    return connect(root), clickhouse_check.load_dir(root)


@pytest.mark.parametrize("query", session_queries.SESSION_QUERIES)
@pytest.mark.parametrize("case", CASES)
def test_filtered_answers_equal_duckdb(stores, query, case):
    duck, ch = stores
    run = session_queries.SESSION_QUERIES[query]
    expected, got = run(duck, CASES[case]), run(ch, CASES[case])
    assert session_queries.same_answer(got, expected), (got, expected)


def test_a_session_is_bounded_by_its_traces(stores):
    duck, ch = stores
    # the workflow span (70.0 s) starts before the request naming prefix-ddd (70.11 s)
    assert narrowed(ch, Filters(session_id="prefix-ddd")).bounds == (ns(70_000), ns(70_800))
    # prefix-aaa is named by the oi-1 runs' requests: their traces, whose session is oi-1
    assert narrowed(ch, Filters(session_id="prefix-aaa")).bounds == (ns(0), ns(22_000))
    assert narrowed(ch, Filters(session_id="lg-1")).bounds == (ns(50_000), ns(51_000))
    assert narrowed(ch, Filters(session_id="nobody")).bounds == (1, 0)
    assert session_queries.SESSION_QUERIES["turns"](duck, Filters(session_id="prefix-ddd"))  # not vacuous
