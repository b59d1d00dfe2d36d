"""A fleet's failed legs per instance: the proxy's legs to a worker that cannot be reached are rows of
``proxy_legs`` naming that worker, and ``per_instance`` (so ``kvtrace report`` and the dashboard)
gives the dead worker a row of its own (no request ends there, so the requests alone never named it),
with its legs failed and unreachable, the same on DuckDB and on ClickHouse, and within the filters."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from kvtrace import semconv as sc
from kvtrace.analysis import instances
from kvtrace.analysis.filters import Filters
from kvtrace.analysis.report import document
from kvtrace.proxy.server import start
from kvtrace.sim.cluster import SimCluster
from kvtrace.store import connect
from kvtrace.store.exporter import ParquetSpanExporter
from kvtrace.testing.synth import PROXY, SpanBuilder

from support.sim_stack import Clock, dead_first_prefiller, two_turn_sessions

SESSIONS = ("a", "b", "c")
D0 = "http://10.0.0.2:8200"  # the older store's decoder


async def _serve(directory) -> dict:
    """1 live P and 1 dead (a closed port), 2 D, least-loaded: three sessions of two turns each."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(ParquetSpanExporter(directory)))
    clock = Clock()
    cluster = SimCluster(1, 2, cost=False, tracer_provider=provider, clock=clock)
    await cluster.__aenter__()
    config, dead = dead_first_prefiller(cluster, sc.ROUTING_LEAST_LOADED)
    proxy = await start(config, provider, clock=clock, port=0)
    try:
        async with aiohttp.ClientSession() as http:
            statuses = await two_turn_sessions(http, proxy.url, SESSIONS)
    finally:
        await proxy.close()
        await cluster.__aexit__(None, None, None)
        provider.shutdown()
    assert statuses == [200] * 6
    return {"dead": f"http://127.0.0.1:{dead}", "live": cluster.prefill_urls[0], "decode": cluster.decode_urls}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dead-prefiller")
    return directory, asyncio.run(_serve(directory))


def test_the_failed_leg_names_the_worker_that_could_not_be_reached(fleet):
    directory, urls = fleet
    rows = (
        connect(directory)
        .execute(
            "SELECT session_id, turn, role, endpoint, http_status, error_type, unreachable, failover, offered "
            "FROM proxy_legs ORDER BY start_ns"
        )
        .fetchall()
    )
    # only the first turn tried the dead P (least-loaded: it looks idle); it then left the routing
    p, d = sc.ROLE_PREFILL, sc.ROLE_DECODE
    assert rows[:3] == [
        ("a", 0, p, urls["dead"], None, "ClientConnectorError", True, None, False),
        ("a", 0, p, urls["live"], 200, None, None, True, False),
        ("a", 0, d, rows[2][3], 200, None, None, None, None),
    ]
    assert len(rows) == 13 and [r[:3] for r in rows[3:]] == [
        (s, t, role) for s in SESSIONS for t in (0, 1) for role in (p, d) if (s, t) != ("a", 0)
    ]
    later = rows[3:]
    assert {r[3] for r in later if r[2] == p} == {urls["live"]} and {r[3] for r in later if r[2] == d} <= set(
        urls["decode"]
    )
    assert all(r[4] == 200 and r[5] is None and r[6] is None and r[7] is None for r in later)


def test_the_dead_worker_has_its_row_per_instance(fleet):
    directory, urls = fleet
    con = connect(directory)
    found = instances.per_instance(con).to_pylist()
    assert instances.is_fleet(found)
    prefill = {r["endpoint"]: r for r in found if r["role"] == sc.ROLE_PREFILL}
    assert set(prefill) == {urls["dead"], urls["live"]}
    dead_ms = con.execute("SELECT duration_ms FROM proxy_legs WHERE error_type IS NOT NULL").fetchall()[0][0]
    zero = dict.fromkeys(sc.ROUTE_REASONS, 0)
    assert prefill[urls["dead"]] == {
        "role": sc.ROLE_PREFILL,
        "endpoint": urls["dead"],
        "requests": 0,
        **zero,
        "pulled": 0,
        "local_hit_tokens": 0,
        "pulled_tokens": 0,
        "recomputed_tokens": 0,
        "mean_ttft_ms": None,
        "legs": 1,
        "failed_legs": 1,
        "unreachable_legs": 1,
        "failed_leg_ms": dead_ms,
    }
    live = prefill[urls["live"]]
    assert (live["endpoint"], live["requests"], live["legs"], live["failed_legs"]) == (urls["live"], 6, 6, 0)
    assert (live[sc.ROUTE_FAILOVER], live["unreachable_legs"], live["failed_leg_ms"]) == (1, 0, None)
    decode = [r for r in found if r["role"] == sc.ROLE_DECODE]
    assert sum(r["requests"] for r in decode) == sum(r["legs"] for r in decode) == 6
    assert {r["failed_legs"] for r in decode} == {0}
    # a filter selects the legs of the requests it selects: session b never tried the dead P
    only_b = instances.per_instance(con, Filters(session_id="b")).to_pylist()
    assert [(r["endpoint"], r["requests"], r["legs"]) for r in only_b if r["role"] == sc.ROLE_PREFILL] == [
        (urls["live"], 2, 2)
    ]
    section = document._instances(con)[0][1]
    dead_line = next(line for line in section.splitlines() if urls["dead"] in line)
    cells = [c.strip() for c in dead_line.strip("|").split("|")]
    assert cells[2:4] == ["0", "–"] and cells[-2:] == ["1 / 1 (1 unreachable)", f"{dead_ms:,.1f}"]


def test_clickhouse_gives_the_same_rows(fleet):
    pytest.importorskip("sqlglot")
    pytest.importorskip("chdb")
    from support import clickhouse_check

    directory, _ = fleet
    store = clickhouse_check.load_dir(directory)
    for filters in (None, Filters(session_id="a")):
        assert (
            instances.per_instance(store, filters).to_pylist()
            == instances.per_instance(connect(directory), filters).to_pylist()
        )


def _older_store(root) -> None:
    """Legs as the proxy wrote them before they named their worker: address and port only; one P
    refused the first turn's leg (an error, no unreachable mark)."""
    b = SpanBuilder()
    for i, p in enumerate((8101, 8100, 8101)):
        at, rid = 1000.0 * i, f"r{i}"
        ident = {sc.GEN_AI_REQUEST_ID: rid, sc.SESSION_ID: "s"}
        request = b.span(
            sc.SPAN_PROXY_REQUEST,
            at,
            at + 500,
            service=PROXY,
            attrs={**ident, sc.PROXY_PREFILL_ENDPOINT: f"http://10.0.0.1:{p}", sc.PROXY_DECODE_ENDPOINT: D0},
        )
        if i == 0:
            dead = {**ident, sc.SERVER_ADDRESS: "10.0.0.1", sc.SERVER_PORT: 8199, sc.ERROR_TYPE: "ClientConnectorError"}
            b.span(sc.SPAN_PROXY_PREFILL, at + 1, at + 3, parent=request, service=PROXY, kind="CLIENT", attrs=dead)
        leg = {**ident, sc.SERVER_ADDRESS: "10.0.0.1", sc.SERVER_PORT: p, sc.HTTP_RESPONSE_STATUS_CODE: 200}
        b.span(sc.SPAN_PROXY_PREFILL, at + 3, at + 50, parent=request, service=PROXY, kind="CLIENT", attrs=leg)
        leg = {**ident, sc.SERVER_ADDRESS: "10.0.0.2", sc.SERVER_PORT: 8200, sc.HTTP_RESPONSE_STATUS_CODE: 200}
        b.span(sc.SPAN_PROXY_DECODE, at + 50, at + 500, parent=request, service=PROXY, kind="CLIENT", attrs=leg)
    b.write(root)


def test_older_traces_name_a_legs_worker_by_its_address(tmp_path):
    _older_store(tmp_path)
    found = instances.per_instance(connect(tmp_path)).to_pylist()
    got = [(r["role"], r["endpoint"], r["requests"], r["legs"], r["failed_legs"], r["unreachable_legs"]) for r in found]
    assert got == [
        (sc.ROLE_PREFILL, "http://10.0.0.1:8100", 1, 1, 0, 0),
        (sc.ROLE_PREFILL, "http://10.0.0.1:8101", 2, 2, 0, 0),
        (sc.ROLE_PREFILL, "http://10.0.0.1:8199", 0, 1, 1, 0),  # failed; unreachable is not in older traces
        (sc.ROLE_DECODE, D0, 3, 3, 0, 0),
    ]
    assert found[2]["failed_leg_ms"] == 2.0


def test_clickhouse_gives_the_same_rows_on_older_traces(tmp_path):
    pytest.importorskip("sqlglot")
    pytest.importorskip("chdb")
    from support import clickhouse_check

    _older_store(tmp_path)
    store = clickhouse_check.load_dir(tmp_path)
    assert instances.per_instance(store).to_pylist() == instances.per_instance(connect(tmp_path)).to_pylist()
    assert clickhouse_check.check_views(tmp_path, store)["proxy_legs"] == 7
