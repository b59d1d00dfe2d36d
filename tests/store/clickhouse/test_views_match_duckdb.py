"""Every kvtrace view gives the same rows on ClickHouse as on DuckDB.

The spans go into chDB exactly as the OTel Collector's ClickHouse exporter writes them (its DDL,
string attribute maps with pdata's number spelling; :mod:`kvtrace.store.clickhouse.load`), and
each view of the registry, read from that table, is compared row by row with DuckDB over the
Parquet directory (``clickhouse_check``: counts, tokens and ids exactly, floats to 1e-9, µs
timestamps to 1 µs).  Stores: the demo's two runs, simulator traces (``clickhouse_check`` is the
helper the vLLM end-to-end test can call on its own spans), agents traced by other conventions
(the breakdown's convention views), and hand-built vLLM ``llm_request`` spans for
``vllm_requests``.  The report, which runs every named query of kvtrace.analysis, is the same text
on both.
"""

from __future__ import annotations

import pytest

pytest.importorskip("sqlglot")
pytest.importorskip("chdb")
clickhouse_check = pytest.importorskip("support.clickhouse_check")

from kvtrace import semconv as sc  # noqa: E402
from kvtrace.analysis.report import document as report  # noqa: E402
from kvtrace.store import connect  # noqa: E402
from kvtrace.store.sql import ident  # noqa: E402
from kvtrace.store.views import VIEWS  # noqa: E402
from kvtrace.testing.synth import PROXY, SpanBuilder  # noqa: E402

ALL_VIEWS = {v.name for v in VIEWS}


@pytest.fixture(scope="module")
def demo(demo_run):
    rc, _, traces = demo_run
    assert rc == 0
    return traces, {run: clickhouse_check.load_dir(traces / run) for run in ("bidir", "baseline")}


@pytest.mark.parametrize("run", ["bidir", "baseline"])
def test_every_view_is_equal_on_the_demo(demo, run):
    traces, stores = demo
    counts = clickhouse_check.check_views(traces / run, stores[run])
    assert set(counts) == ALL_VIEWS
    duck = connect(traces / run)
    for name, n in counts.items():  # every view compared all its rows, most of them many
        assert n == duck.sql(f"SELECT count(*) FROM {name}").fetchall()[0][0]
    assert counts["sessions"] >= 2 and counts["session_breakdown"] == counts["sessions"]
    if run == "bidir":  # (the baseline has no reuse: some views are empty there; the demo's agent is kvtrace's)
        foreign = {"kvtrace_foreign_spans", "trace_sessions"}  # compared on other conventions' spans below
        assert min(counts[v] for v in ALL_VIEWS - {"vllm_requests"} - foreign) > 0


def test_report_is_the_same_text(demo):
    traces, stores = demo
    duck = connect(traces / "bidir"), connect(traces / "baseline")
    expected, _ = report.build(duck[0], "run", compare_con=duck[1], compare_dir="base", plots=False)
    got, _ = report.build(stores["bidir"], "run", compare_con=stores["baseline"], compare_dir="base", plots=False)
    assert report.to_markdown(got, {}) == report.to_markdown(expected, {})
    assert "## Comparison with `base`" in report.to_markdown(got, {})


def test_every_view_is_equal_on_agents_of_other_conventions(tmp_path):
    from support import agent_conventions

    agent_conventions.build(tmp_path)  # OpenInference, LangGraph, OTel GenAI, OpenLLMetry: no kvtrace agent code
    counts = clickhouse_check.check_views(tmp_path)
    assert set(counts) == ALL_VIEWS
    agent_views = ("kvtrace_agent_spans", "session_breakdown", "turn_breakdown", "trace_sessions", "agent_llm_calls")
    assert {k: counts[k] for k in agent_views} == {
        "kvtrace_agent_spans": 9,
        "session_breakdown": 4,
        "turn_breakdown": 6,
        "trace_sessions": 7,
        "agent_llm_calls": 9,
    }


def test_helper_on_simulator_traces(tmp_path):
    from support.sim_workload import run_workload

    run_workload(traces_dir=tmp_path, sessions=2, turns=3)
    counts = clickhouse_check.check_views(tmp_path)
    assert {k: counts[k] for k in ("requests", "kv_decisions", "kv_retention", "engine_requests", "sessions")} == {
        "requests": 6,
        "kv_decisions": 12,
        "kv_retention": 6,
        "engine_requests": 12,
        "sessions": 2,
    }


def _vllm_store(directory) -> None:
    """Two proxied requests; vLLM's llm_request spans under the P and D legs of the first, one
    without trace context for the second (matched by id) and one nobody knows."""
    b = SpanBuilder()
    vllm = {
        sc.GEN_AI_RESPONSE_MODEL: "qwen",
        sc.VLLM_LATENCY_TIME_IN_QUEUE: 0.002,
        sc.VLLM_LATENCY_TIME_TO_FIRST_TOKEN: 0.25,
        sc.VLLM_LATENCY_E2E: 1.5,
        sc.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: 0.125,
        sc.VLLM_LATENCY_TIME_IN_MODEL_DECODE: 1.0,
        sc.VLLM_LATENCY_TIME_IN_MODEL_INFERENCE: 1.125,
    }
    req = b.request("sess-1", 0, "req-a", 0, 1600, 260)
    ident_a = {sc.GEN_AI_REQUEST_ID: "req-a", sc.SESSION_ID: "sess-1", sc.TURN_INDEX: 0}
    for leg, start, end, completion in ((sc.SPAN_PROXY_PREFILL, 1, 300, 1), (sc.SPAN_PROXY_DECODE, 300, 1599, 20)):
        span = b.span(leg, start, end, parent=req, service=PROXY, kind="CLIENT", attrs=ident_a)
        b.span(
            sc.SPAN_VLLM_LLM_REQUEST,
            start + 1,
            end - 1,
            parent=span,
            service="vllm",
            kind="SERVER",
            attrs={
                **vllm,
                sc.GEN_AI_REQUEST_ID: "cmpl-req-a-0",
                sc.GEN_AI_USAGE_PROMPT_TOKENS: 100,
                sc.GEN_AI_USAGE_COMPLETION_TOKENS: completion,
            },
        )
    b.request("sess-1", 1, "req-b", 2000, 2500, 100)
    for rid, prompt in (("chatcmpl-req-b-9f1c", 150), ("chatcmpl-unrelated", 5)):
        b.span(
            sc.SPAN_VLLM_LLM_REQUEST,
            2001,
            2499,
            service="vllm",
            kind="SERVER",
            attrs={
                **vllm,
                sc.GEN_AI_REQUEST_ID: rid,
                sc.GEN_AI_USAGE_PROMPT_TOKENS: prompt,
                sc.GEN_AI_USAGE_COMPLETION_TOKENS: 7,
            },
        )
    b.write(directory)


def test_vllm_requests_are_equal(tmp_path):
    _vllm_store(tmp_path)
    store = clickhouse_check.load_dir(tmp_path)
    assert clickhouse_check.check_views(tmp_path, store, views={"vllm_requests", "requests", "spans"}) == {
        "spans": 8,
        "requests": 2,
        "vllm_requests": 4,
    }
    rows = store.query(
        "SELECT vllm_request_id, request_id, leg, matched_by, prompt_tokens, queue_ms "
        "FROM vllm_requests ORDER BY vllm_request_id, leg"
    ).to_pylist()
    assert [tuple(r.values()) for r in rows] == [
        ("chatcmpl-req-b-9f1c", "req-b", None, "request_id", 150, 2.0),
        ("chatcmpl-unrelated", None, None, None, 5, 2.0),
        ("cmpl-req-a-0", "req-a", sc.ROLE_DECODE, "parent", 100, 2.0),
        ("cmpl-req-a-0", "req-a", sc.ROLE_PREFILL, "parent", 100, 2.0),
    ]


def test_a_changed_value_is_found(tmp_path):
    """The comparison is not vacuous: one token count changed in the table is reported."""
    _vllm_store(tmp_path)
    store = clickhouse_check.load_dir(tmp_path)
    table = ident(store.table)
    store.backend.command(
        f"ALTER TABLE {table} UPDATE SpanAttributes = mapUpdate(SpanAttributes, "
        f"map('{sc.GEN_AI_USAGE_PROMPT_TOKENS}', '101')) WHERE SpanAttributes['{sc.GEN_AI_REQUEST_ID}']"
        " = 'chatcmpl-unrelated' SETTINGS mutations_sync = 2"
    )
    duck = connect(tmp_path)
    assert clickhouse_check.compare_view(duck, store, "requests") == 2
    with pytest.raises(AssertionError, match="vllm_requests row .*: prompt_tokens = 101 on ClickHouse, 5 on DuckDB"):
        clickhouse_check.compare_view(duck, store, "vllm_requests")
    store.backend.command(
        f"DELETE FROM {table} WHERE SpanName = '{sc.SPAN_PROXY_REQUEST}' "
        f"AND SpanAttributes['{sc.GEN_AI_REQUEST_ID}'] = 'req-b'"
    )
    with pytest.raises(AssertionError, match="requests: 1 rows on ClickHouse, 2 on DuckDB"):
        clickhouse_check.compare_view(duck, store, "requests")


def test_cursor_temporary_tables_and_views(tmp_path):
    """A cursor's ``CREATE TEMP TABLE|VIEW`` (the what-if's calibration) works on ClickHouse
    without creating anything: later queries of that cursor read it, a temporary view hides the
    registry view of its name, other cursors do not see it."""
    from kvtrace.store.reader import query
    from kvtrace.store.sql import literal

    _vllm_store(tmp_path)
    store = clickhouse_check.load_dir(tmp_path)
    answers = []
    for con in (connect(tmp_path), store):
        cur = con.cursor()
        query(cur, "CREATE TEMP TABLE base AS SELECT span_id, name, request_id FROM spans")
        cur.execute(
            f"CREATE TEMP VIEW requests AS SELECT request_id FROM base WHERE name = {literal(sc.SPAN_PROXY_REQUEST)}"
        )
        mine = query(cur, "SELECT * FROM requests ORDER BY request_id").to_pylist()
        others = query(con.cursor(), "SELECT count(*) AS n, max(input_tokens) AS tokens FROM requests").to_pylist()
        cur.close()
        answers.append((mine, others))
    assert answers[0] == answers[1] == ([{"request_id": "req-a"}, {"request_id": "req-b"}], [{"n": 2, "tokens": 100}])
