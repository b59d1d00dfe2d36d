"""The archive path: kvtrace Parquet files load unchanged into the OTel Collector ClickHouse
exporter's ``otel_traces`` table (in chDB, in-process ClickHouse), and every kvtrace view over that
table gives the DuckDB views' rows (numbers spelled by Python there, not by the exporter)."""

from __future__ import annotations

import pytest

from kvtrace import semconv as sc
from kvtrace.store import clickhouse as ch
from kvtrace.store import files
from kvtrace.store.sql import ident

from support.sim_workload import read_rows, run_workload

pytest.importorskip("chdb", reason="chdb not installed (pip install 'kvtrace[clickhouse]')")
clickhouse_check = pytest.importorskip("support.clickhouse_check")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    traces = tmp_path_factory.mktemp("traces")
    run_workload(traces_dir=traces, sessions=3, turns=3)
    backend = clickhouse_check.chdb_backend()
    table = "archive.otel_traces"
    clickhouse_check.load.create_table(backend, table)
    backend.command(f"TRUNCATE TABLE {ident(table)}")
    for path in files.list_files(traces):
        backend.command(ch.insert_parquet(path, table))
    return backend, table, traces


def test_parquet_rows_arrive_unchanged(loaded):
    backend, table, traces = loaded
    rows = read_rows(traces)
    got = backend.query(
        f"SELECT TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName, StatusCode, "
        f"toString(toUnixTimestamp64Nano(Timestamp)) AS ts, Duration, SpanAttributes, "
        f"ResourceAttributes, Events.Name AS en, Links.SpanId AS ls FROM {table} "
        f"ORDER BY TraceId, SpanId"
    ).to_pylist()
    assert [
        [
            r["TraceId"],
            r["SpanId"],
            r["ParentSpanId"],
            r["SpanName"],
            r["SpanKind"],
            r["ServiceName"],
            r["StatusCode"],
            r["ts"],
            r["Duration"],
            dict(r["SpanAttributes"]),
            dict(r["ResourceAttributes"]),
            r["en"],
            r["ls"],
        ]
        for r in got
    ] == [
        [
            r["TraceId"],
            r["SpanId"],
            r["ParentSpanId"],
            r["SpanName"],
            r["SpanKind"],
            r["ServiceName"],
            r["StatusCode"],
            str(r["Timestamp"]),
            r["Duration"],
            r["SpanAttributes"],
            r["ResourceAttributes"],
            r["Events.Name"],
            r["Links.SpanId"],
        ]
        for r in rows
    ]


def test_every_view_matches_duckdb_on_loaded_parquet(loaded):
    backend, table, traces = loaded
    store = clickhouse_check.ClickHouseStore(backend, table)
    duck = clickhouse_check.connect(traces)
    counts = {
        v: clickhouse_check.compare_view(duck, store, v)
        for v in ("requests", "kv_decisions", "kv_transfers", "kv_retention", "engine_requests", "sessions")
    }
    assert counts == {
        "requests": 9,
        "kv_decisions": 18,
        "kv_transfers": 15,
        "kv_retention": 9,
        "engine_requests": 18,
        "sessions": 3,
    }


def test_workload_pulls_and_sessions_are_visible(loaded):
    backend, table, _ = loaded
    store = clickhouse_check.ClickHouseStore(backend, table)
    outcomes = {
        r["outcome"]
        for r in store.query(
            "SELECT DISTINCT outcome FROM kv_decisions WHERE direction = $d", {"d": sc.DIRECTION_D2P}
        ).to_pylist()
    }
    assert sc.OUTCOME_PULLED in outcomes and sc.OUTCOME_NO_REMOTE in outcomes
    sessions = store.query("SELECT session_id, requests, turns FROM sessions ORDER BY session_id").to_pylist()
    assert sessions == [{"session_id": f"session-{i}", "requests": 3, "turns": 3} for i in range(3)]
    directions = store.query("SELECT DISTINCT direction FROM kv_transfers ORDER BY direction").column("direction")
    assert directions.to_pylist() == [sc.DIRECTION_D2P, sc.DIRECTION_P2D]
