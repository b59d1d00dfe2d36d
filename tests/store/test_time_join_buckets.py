"""The breakdown's time join lists a call once per second it covers only where it needs to: another
convention's calls, matched to requests by time.  kvtrace's own calls find their request by its id, so
a fleet whose calls wait for many minutes (an overloaded run, timeouts without a first token) is not
listed second by second, each second against every call of the fleet (docs/benchmarks.md: 43.5 s
for one run's breakdown, 0.14 s now)."""

from __future__ import annotations

import json

from kvtrace import semconv as sc
from kvtrace.analysis import sessions
from kvtrace.store import connect
from kvtrace.testing.synth import SpanBuilder

HOUR_MS = 3_600_000


def _unnested_rows(con, sql: str, path) -> int:
    """Rows the plan's UNNEST operators made while ``sql`` ran (DuckDB's profile of the query)."""
    con.execute("PRAGMA enable_profiling = 'json'")
    con.execute(f"PRAGMA profiling_output = '{path}'")
    try:
        con.execute(sql).fetchall()
    finally:
        con.execute("PRAGMA disable_profiling")
    rows = 0

    def walk(node) -> None:
        nonlocal rows
        if isinstance(node, list):
            for child in node:
                walk(child)
            return
        if node.get("type") == "UNNEST":  # DuckDB 2.0.0 names an operator only by its type
            rows += node["intermediate_rows"]
        walk(node.get("children", []))

    walk(json.loads(path.read_text())["operator"])
    return rows


def _hour_long_calls(b: SpanBuilder, foreign: bool) -> None:
    """Twenty sessions, each one hour-long call that never got a first token, and its proxy request
    (the first without a TTFT either, the others with one); ``foreign``: the calls are OTel GenAI
    spans of another agent, not kvtrace's."""
    for i in range(20):
        sid = f"s-{i}"
        if foreign:
            attrs = {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT, sc.SESSION_ID: sid}
            call = b.span(f"chat {sid}", 0, HOUR_MS, service="other-agent", kind="CLIENT", attrs=attrs)
        else:
            t = b.turn(sid, 0, 0, HOUR_MS, parent=b.session(sid, 0, HOUR_MS))
            call = b.llm_call(sid, 0, 0, HOUR_MS, None, parent=t, request_id=f"r-{i}")
        b.request(sid, 0, f"r-{i}", 10, HOUR_MS - 10, 1_000.0 * i if i else None, parent=call)


def test_kvtrace_calls_waiting_for_hours_find_their_requests_without_time_buckets(tmp_path):
    b = SpanBuilder()
    _hour_long_calls(b, foreign=False)
    spans = b.write(tmp_path / "traces")
    con = connect(tmp_path / "traces")
    by_id = {r["session_id"]: r for r in sessions.breakdown(con, limit=100).to_pylist()}
    # the call takes its own request's first token (10 ms + TTFT), none where its request had none
    assert by_id["s-0"]["input_processing_ms"] == HOUR_MS and by_id["s-0"]["generation_ms"] == 0.0
    assert by_id["s-3"]["input_processing_ms"] == 3_010.0 and by_id["s-3"]["generation_ms"] == HOUR_MS - 3_010.0
    # the breakdown's other unnest lists each span under one or two categories; a call per second
    # would be 3,600 rows for each call and each request
    assert _unnested_rows(con, "SELECT * FROM session_breakdown", tmp_path / "kv.json") <= 2 * spans


def test_another_conventions_calls_still_meet_requests_by_time(tmp_path):
    b = SpanBuilder()
    _hour_long_calls(b, foreign=True)
    b.write(tmp_path / "traces")
    con = connect(tmp_path / "traces")
    by_id = {r["session_id"]: r for r in sessions.breakdown(con, limit=100).to_pylist()}
    assert by_id["s-3"]["input_processing_ms"] == 3_010.0 and by_id["s-3"]["generation_ms"] == HOUR_MS - 3_010.0
    assert _unnested_rows(con, "SELECT * FROM session_breakdown", tmp_path / "foreign.json") >= 40 * 3_600
