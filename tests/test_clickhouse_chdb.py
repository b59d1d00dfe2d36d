"""The ClickHouse path: kvtrace Parquet files load unchanged into the OTel Collector ClickHouse
exporter's ``otel_traces`` table (in chDB, in-process ClickHouse) and the session-level queries of
:mod:`kvtrace.store.clickhouse` there give the DuckDB views' answers."""

from __future__ import annotations

import json
import os

import pytest
from test_collect_workload import read_rows, run_workload

from kvtrace import semconv as sc
from kvtrace.store import clickhouse as ch
from kvtrace.store import connect, files

TABLE = "otel.otel_traces"


def _chdb():
    if os.environ.get("CI") == "true":
        import chdb  # noqa: F401  (CI installs it: the dev extra)
    return pytest.importorskip("chdb.session", reason="chdb not installed (pip install chdb)")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    session_mod = _chdb()
    traces = tmp_path_factory.mktemp("traces")
    run_workload(traces_dir=traces, sessions=3, turns=3)
    db = session_mod.Session(str(tmp_path_factory.mktemp("chdb")))
    db.query("CREATE DATABASE IF NOT EXISTS otel")
    db.query(ch.render(ch.TRACES_TABLE_DDL, TABLE))
    for path in files.list_files(traces):
        db.query(ch.insert_parquet(path, TABLE))
    yield db, traces
    db.close()


def _ch_rows(db, sql: str) -> list[list]:
    return json.loads(db.query(sql, "JSONCompact").bytes())["data"]


def test_parquet_rows_arrive_unchanged(loaded):
    db, traces = loaded
    rows = read_rows(traces)
    got = _ch_rows(db, f"SELECT TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName, StatusCode, "
                       f"toString(toUnixTimestamp64Nano(Timestamp)), Duration, SpanAttributes, ResourceAttributes, "
                       f"Events.Name, Links.SpanId FROM {TABLE} ORDER BY TraceId, SpanId")
    assert got == [[r["TraceId"], r["SpanId"], r["ParentSpanId"], r["SpanName"], r["SpanKind"], r["ServiceName"],
                    r["StatusCode"], str(r["Timestamp"]), r["Duration"], r["SpanAttributes"],
                    r["ResourceAttributes"], r["Events.Name"], r["Links.SpanId"]] for r in rows]


@pytest.mark.parametrize("name", list(ch.SESSION_QUERIES))
def test_session_queries_match_duckdb(loaded, name):
    db, traces = loaded
    got = _ch_rows(db, ch.render(ch.SESSION_QUERIES[name], TABLE))
    con = connect(traces)
    expected = [list(r) for r in con.execute(ch.DUCKDB_SESSION_QUERIES[name]).fetchall()]
    assert len(expected) >= 3
    if name == "retention":  # float sums: same values, summation order may differ
        assert [r[:3] for r in got] == [r[:3] for r in expected]
        assert [r[3] for r in got] == pytest.approx([r[3] for r in expected], rel=1e-12)
    else:
        assert got == expected


def test_workload_pulls_and_sessions_are_visible(loaded):
    db, _ = loaded
    outcomes = {r[1] for r in _ch_rows(db, ch.render(ch.SESSION_DECISIONS, TABLE))}
    assert sc.OUTCOME_PULLED in outcomes and sc.OUTCOME_NO_REMOTE in outcomes
    sessions = _ch_rows(db, ch.render(ch.SESSION_REQUESTS, TABLE))
    assert [(r[0], r[1], r[2]) for r in sessions] == [(f"session-{i}", 3, 3) for i in range(3)]
    directions = {r[1] for r in _ch_rows(db, ch.render(ch.SESSION_TRANSFERS, TABLE))}
    assert directions == {sc.DIRECTION_D2P, sc.DIRECTION_P2D}
