"""session_breakdown / turn_breakdown on hand-built traces with known answers (exact ms)."""

from __future__ import annotations

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis import sessions
from kvtrace.analysis.filters import Filters
from kvtrace.store import connect
from kvtrace.store.views.breakdown import BREAKDOWN_COLUMNS, PART_COLUMNS
from kvtrace.testing.synth import SpanBuilder

PARTS = ("wall_ms",) + PART_COLUMNS + ("unattributed_ms",)


def _parts(row: dict) -> dict:
    return {k: row[k] for k in PARTS}


def _by_session(con) -> dict:
    return {r["session_id"]: r for r in sessions.breakdown(con, limit=100).to_pylist()}


@pytest.fixture
def store(tmp_path):
    b = SpanBuilder()
    # s-overlap: parallel LLM calls, overlapping tools, explicit app work, gaps, two turns
    s = b.session("s-overlap", 0, 1000)
    t0 = b.turn("s-overlap", 0, 0, 600, parent=s)
    b.llm_call("s-overlap", 0, 100, 300, 50, parent=t0)  # input 100-150, gen 150-300
    b.llm_call("s-overlap", 0, 120, 350, 100, parent=t0)  # input 120-220, gen 220-350 (parallel)
    b.tool("s-overlap", 0, 340, 500, parent=t0)  # overlaps generation until 350
    b.tool("s-overlap", 0, 450, 550, parent=t0)  # overlaps the other tool
    b.app_work("s-overlap", 0, 560, 580, parent=t0)
    t1 = b.turn("s-overlap", 1, 600, 1000, parent=s)
    b.llm_call("s-overlap", 1, 650, 900, None, parent=t1)  # failed: no token, all input
    b.tool("s-overlap", 1, 700, 800, parent=t1)  # hidden behind input processing
    b.app_work("s-overlap", 1, 880, 950, parent=t1)  # 900-950 is app work
    b.app_work("s-overlap", 1, 990, 1200, parent=t1)  # clipped at the session end
    # s-traces: one session over three traces (session span resumed after a pause, turns as roots)
    b.session("s-traces", 10_000, 10_400)
    b.session("s-traces", 11_000, 11_500)
    ta = b.turn("s-traces", 0, 10_000, 10_400)
    b.llm_call("s-traces", 0, 10_100, 10_300, 40, parent=ta)
    tb = b.turn("s-traces", 1, 11_000, 11_500)
    b.llm_call("s-traces", 1, 11_000, 11_200, 20, parent=tb)
    b.tool("s-traces", 1, 11_250, 11_450, parent=tb)
    # s-proxy: no agent spans at all; requests carry session id and turn
    b.request("s-proxy", 0, "p-0", 20_000, 20_300, 100.0)
    b.request("s-proxy", 1, "p-1", 20_500, 20_700, 50.0)
    b.request("s-proxy", 1, "p-2", 20_600, 20_800, 150.0)  # parallel, ttft ends at 20_750
    b.write(tmp_path)
    return connect(tmp_path)


@pytest.fixture
def paused(tmp_path):
    """One session with user pauses between turns (outside the turn spans, as kvtrace bench marks
    them) and one inside a turn that app work overlaps, and a tool while the user thinks: the
    agent's activity beats the user's pause."""
    b = SpanBuilder()
    s = b.session("s-pause", 30_000, 32_000)
    b.user_pause("s-pause", None, 30_000, 30_500, parent=s)  # before turn 0
    t0 = b.turn("s-pause", 0, 30_500, 31_000, parent=s)
    b.llm_call("s-pause", 0, 30_500, 30_700, 100, parent=t0)  # input 100, gen 100
    b.user_pause("s-pause", 0, 30_650, 30_900, parent=t0)  # 30_700-30_900 left after the call
    b.app_work("s-pause", 0, 30_800, 30_850, parent=t0)  # app work beats the pause: 50
    b.user_pause("s-pause", None, 31_000, 31_800, parent=s, reason=None)  # between the turns
    b.tool("s-pause", None, 31_700, 31_750, parent=s)  # a tool while the user thinks: tool wait
    t1 = b.turn("s-pause", 1, 31_800, 32_000, parent=s)
    b.llm_call("s-pause", 1, 31_800, 31_900, 50, parent=t1)  # input 50, gen 50; 31_900-32_000 unattributed
    b.write(tmp_path)
    return connect(tmp_path)


def test_view_columns_follow_the_contract(store):
    cols = [d[0] for d in store.execute("SELECT * FROM session_breakdown LIMIT 0").description]
    assert tuple(cols[: len(BREAKDOWN_COLUMNS)]) == BREAKDOWN_COLUMNS
    cols = [d[0] for d in store.execute("SELECT * FROM turn_breakdown LIMIT 0").description]
    assert cols[:2] == ["session_id", "turn"]
    assert set(PARTS) <= set(cols)


def test_overlapping_tools_parallel_calls_and_gaps(store):
    row = _by_session(store)["s-overlap"]
    # gen: union 150-350 + none in turn 1 = 200; input: 100-150, 650-900 = 300
    # tools: 350-550 = 200 (700-800 hidden by input); app spans: 560-580, 900-950, 990-1000 = 80
    # unattributed: 0-100, 550-560, 580-650, 950-990 = 220
    assert _parts(row) == {
        "wall_ms": 1000.0,
        "input_processing_ms": 300.0,
        "generation_ms": 200.0,
        "tool_wait_ms": 200.0,
        "app_work_ms": 300.0,
        "user_pause_ms": 0.0,
        "unattributed_ms": 220.0,
    }
    assert row["turns"] == 2


def test_turn_breakdown_splits_the_session(store):
    turns = {r["turn"]: r for r in sessions.turns(store, Filters(session_id="s-overlap")).to_pylist()}
    assert _parts(turns[0]) == {
        "wall_ms": 600.0,
        "input_processing_ms": 50.0,
        "generation_ms": 200.0,
        "tool_wait_ms": 200.0,
        "app_work_ms": 150.0,
        "user_pause_ms": 0.0,
        "unattributed_ms": 130.0,
    }
    assert _parts(turns[1]) == {
        "wall_ms": 400.0,
        "input_processing_ms": 250.0,
        "generation_ms": 0.0,
        "tool_wait_ms": 0.0,
        "app_work_ms": 150.0,
        "user_pause_ms": 0.0,
        "unattributed_ms": 90.0,
    }


def test_session_spanning_many_traces(store):
    row = _by_session(store)["s-traces"]
    # wall 10_000-11_500; input 40 + 20, gen 160 + 180, tool 200, rest (incl. the pause) app work
    assert _parts(row) == {
        "wall_ms": 1500.0,
        "input_processing_ms": 60.0,
        "generation_ms": 340.0,
        "tool_wait_ms": 200.0,
        "app_work_ms": 900.0,
        "user_pause_ms": 0.0,
        "unattributed_ms": 900.0,
    }
    assert row["turns"] == 2


def test_user_pauses_are_a_part_of_their_own(paused):
    store = paused
    row = _by_session(store)["s-pause"]
    # pauses: 30_000-30_500 (500), 30_700-30_900 minus app 30_800-30_850 (150), 31_000-31_800 minus
    # tool 31_700-31_750 (750); app work: 50 + unattributed 30_900-31_000 and 31_900-32_000 (200)
    assert _parts(row) == {
        "wall_ms": 2000.0,
        "input_processing_ms": 150.0,
        "generation_ms": 150.0,
        "tool_wait_ms": 50.0,
        "app_work_ms": 250.0,
        "user_pause_ms": 1400.0,
        "unattributed_ms": 200.0,
    }
    turns = {r["turn"]: _parts(r) for r in sessions.turns(store, Filters(session_id="s-pause")).to_pylist()}
    assert turns == {  # the pauses between turns are outside every turn window
        0: {
            "wall_ms": 500.0,
            "input_processing_ms": 100.0,
            "generation_ms": 100.0,
            "tool_wait_ms": 0.0,
            "app_work_ms": 150.0,
            "user_pause_ms": 150.0,
            "unattributed_ms": 100.0,
        },
        1: {
            "wall_ms": 200.0,
            "input_processing_ms": 50.0,
            "generation_ms": 50.0,
            "tool_wait_ms": 0.0,
            "app_work_ms": 100.0,
            "user_pause_ms": 0.0,
            "unattributed_ms": 100.0,
        },
    }
    assert sessions.totals(store, Filters(session_id="s-pause"))["user_pause_ms"] == 1400.0


def test_proxy_only_session_uses_request_spans(store):
    row = _by_session(store)["s-proxy"]
    # gen: 20_100-20_300, 20_550-20_700 (p-1), 20_750-20_800 (p-2) = 400
    # input: 20_000-20_100, 20_500-20_550, 20_700-20_750 (p-2 waits while p-1 is not streaming) = 200
    assert _parts(row) == {
        "wall_ms": 800.0,
        "input_processing_ms": 200.0,
        "generation_ms": 400.0,
        "tool_wait_ms": 0.0,
        "app_work_ms": 200.0,
        "user_pause_ms": 0.0,
        "unattributed_ms": 200.0,
    }
    turns = {r["turn"]: r["wall_ms"] for r in sessions.turns(store, Filters(session_id="s-proxy")).to_pylist()}
    assert turns == {0: 300.0, 1: 300.0}


def test_parts_sum_to_wall(store):
    for row in sessions.breakdown(store, limit=100).to_pylist() + sessions.turns(store).to_pylist():
        assert abs(sum(row[c] for c in PART_COLUMNS) - row["wall_ms"]) <= 1.0, row


def test_totals_sorting_and_filters(store):
    tot = sessions.totals(store)
    assert (tot["sessions"], tot["turns"], tot["wall_ms"]) == (3, 6, 3300.0)
    assert tot["generation_ms"] == 200.0 + 340.0 + 400.0
    ids = [r["session_id"] for r in sessions.breakdown(store, order="generation_ms", descending=False).to_pylist()]
    assert ids == ["s-overlap", "s-traces", "s-proxy"]
    assert [r["session_id"] for r in sessions.breakdown(store, limit=1).to_pylist()] == ["s-traces"]
    b = SpanBuilder()
    window = Filters(start_ns=b.ns(9_000), end_ns=b.ns(15_000))
    assert [r["session_id"] for r in sessions.breakdown(store, window).to_pylist()] == ["s-traces"]
    assert [r["session_id"] for r in sessions.breakdown(store, Filters(service="kvtrace-proxy")).to_pylist()] == [
        "s-proxy"
    ]
    assert sessions.list_sessions(store) == ["s-traces", "s-overlap", "s-proxy"]
    with pytest.raises(ValueError, match="cannot sort by"):
        sessions.breakdown(store, order="wall_ms; DROP VIEW spans")


def test_overview_is_the_totals_and_the_sorted_rows_of_one_query(store, tmp_path):
    for filters in (None, Filters(service="kvtrace-proxy"), Filters(session_id="nobody")):
        for order, descending, limit in (("wall_ms", True, 100), ("generation_ms", False, 2), ("session_id", True, 1)):
            got = sessions.overview(store, filters, order=order, descending=descending, limit=limit)
            assert got["totals"] == sessions.totals(store, filters)
            assert got["rows"].equals(
                sessions.breakdown(store, filters, order=order, descending=descending, limit=limit)
            )
    assert sessions.overview(store, Filters(session_id="nobody"))["totals"]["sessions"] == 0
    assert sessions.overview(store, limit=1)["totals"]["sessions"] == 3  # all sessions, not the rows shown
    empty = sessions.overview(connect(tmp_path / "none", allow_empty=True))
    assert empty["rows"].num_rows == 0 and empty["totals"]["sessions"] == 0
    with pytest.raises(ValueError, match="cannot sort by"):
        sessions.overview(store, order="wall_ms; DROP VIEW spans")


def test_spans_of_session_lists_every_trace(store):
    spans = sessions.spans_of_session(store, "s-traces")
    assert len({s["trace_id"] for s in spans}) == 4  # two session spans, two turn roots
    assert sorted(s["name"] for s in spans[:2]) == sorted([sc.SPAN_AGENT_SESSION, sc.SPAN_AGENT_TURN])
    assert [s["start_ms"] for s in spans] == sorted(s["start_ms"] for s in spans)
    assert spans[0]["start_ms"] == 0.0 and max(s["end_ms"] for s in spans) == 1500.0
    assert {s["lane"] for s in spans} == {"agent", "tool"}
    assert sessions.spans_of_session(store, "nope") == []


def test_empty_store_has_empty_views(tmp_path):
    con = connect(tmp_path / "none", allow_empty=True)
    assert sessions.breakdown(con).num_rows == 0
    assert sessions.totals(con)["sessions"] == 0
    assert sessions.turns(con).num_rows == 0


def test_session_windows_agree_with_the_sessions_view(store):
    mine = store.execute(
        "SELECT session_id, start_ns, end_ns, turns FROM kvtrace_session_windows ORDER BY 1"
    ).fetchall()
    view = store.execute("SELECT session_id, start_ns, end_ns, turns FROM sessions ORDER BY 1").fetchall()
    assert mine == view and len(mine) == 3


def test_non_streamed_kvtrace_call_takes_its_requests_ttft(tmp_path):
    """A kvtrace llm_call span without a TTFT (a non-streamed call) splits at its proxy request's
    first token (request start - call start + the request's TTFT), as agent_llm_calls reports it; a
    call without a request stays input processing throughout."""
    b = SpanBuilder()
    s = b.session("s-plain", 0, 1000)
    t = b.turn("s-plain", 0, 0, 1000, parent=s)
    call = b.llm_call("s-plain", 0, 100, 600, None, parent=t, request_id="plain-1")
    b.request("s-plain", 0, "plain-1", 120, 580, 80.0, parent=call)  # first token at 200
    b.tool("s-plain", 0, 650, 850, parent=t)
    b.llm_call("s-plain", 0, 900, 950, None, parent=t)  # no request: all input
    b.write(tmp_path)
    con = connect(tmp_path)
    expected = {
        "wall_ms": 1000.0,
        "input_processing_ms": 150.0,
        "generation_ms": 400.0,
        "tool_wait_ms": 200.0,
        "app_work_ms": 250.0,
        "user_pause_ms": 0.0,
        "unattributed_ms": 250.0,
    }
    assert _parts(_by_session(con)["s-plain"]) == expected
    turns = sessions.turns(con, Filters(session_id="s-plain")).to_pylist()
    assert [(r["turn"], _parts(r)) for r in turns] == [(0, expected)]
    calls = con.execute("SELECT request_id, ttft_ms FROM agent_llm_calls ORDER BY start_ns").fetchall()
    assert calls == [("plain-1", 100.0), (None, None)]
