"""Equal answers (issue #40): with kvtrace's materialized tables (:mod:`kvtrace.store.clickhouse.mviews`)
chDB gives the same rows as DuckDB over the raw spans (``connect(dir, scan_index=False)``), on the
multi-day store (:mod:`support.multiday`: sessions, turns and traces across files, hours and
midnight, late spans, other conventions' agents and LangGraph's time-joined request) and on the demo's.

Two tables per store: ``backfilled`` (loaded, then ``init``: the backfill) and ``live`` (``init`` on
the empty table, then the spans in two inserts run with ClickHouse's default settings, as the
exporter's are: the views shape them, every session in two parts).  Compared: the materialized
rows themselves (the classified rows are exactly the ``kvtrace_scan`` view's over the raw table,
the lookups a GROUP BY's), whole views (``session_breakdown``, ``turn_breakdown``, ``kv_decisions``,
``kv_transfers``), and every session-scoped named query (:data:`support.session_queries.SESSION_QUERIES`)
for sessions of every kind, each day and unfiltered; the full sweep (every session, both tables)
is ``slow``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("sqlglot")
pytest.importorskip("chdb")
clickhouse_check = pytest.importorskip("support.clickhouse_check")

from kvtrace import semconv as sc  # noqa: E402
from kvtrace.analysis import sessions  # noqa: E402
from kvtrace.analysis.filters import Filters  # noqa: E402
from kvtrace.store import connect  # noqa: E402
from kvtrace.store.clickhouse import load, mviews, mviews_sql  # noqa: E402
from kvtrace.store.clickhouse.store import ClickHouseStore  # noqa: E402
from kvtrace.store.files import list_files  # noqa: E402
from kvtrace.store.schema import SCHEMA  # noqa: E402
from kvtrace.store.sql import ident  # noqa: E402
from kvtrace.store.views.agents import SCAN, SCAN_COLUMNS  # noqa: E402

from support import multiday, session_queries  # noqa: E402

DAYS = 3
QUERIES = session_queries.SESSION_QUERIES
WHOLE_VIEWS = ("session_breakdown", "turn_breakdown", "kv_decisions", "kv_transfers")
# one session of each kind: kvtrace's (day 0, its trace in two files, late spans), across midnight,
# across an hour, OpenInference across midnight, LangGraph (its request joins by time), GenAI,
# OpenLLMetry (the proxy's prefix session), and none
KINDS = (
    "session-0-0",
    "midnight-0",
    "session-0-1",
    "oi-1-100",
    "lg-1-100",
    "lg-1-102",
    "g-1-101",
    "prefix-ddd-102",
    "nobody",
)


def _init(backend, table):
    mviews.init(backend, table)


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    traces = multiday.build(tmp_path_factory.mktemp("multiday"), days=DAYS)
    live = multiday.load_chdb(traces, before_insert=_init)
    backfilled = multiday.load_chdb(traces, live.backend, parts=None)
    mviews.init(backfilled.backend, backfilled.table)
    raw = multiday.load_chdb(traces, live.backend, parts=None)  # no materialized tables
    duck = connect(traces, scan_index=False)
    return {"dir": traces, "duck": duck, "live": live, "backfilled": backfilled, "raw": raw}


def test_the_store_crosses_what_it_should(multi):
    """The multi-day store is what the equivalence needs (not vacuous): a session across midnight,
    sessions in both inserts' parts, the tables current and used."""
    duck = multi["duck"]
    info = sessions.session_info(duck, "midnight-0")
    assert info["start_ns"] < multiday.day_range(1)[0] < info["end_ns"]
    assert sessions.totals(duck)["sessions"] == 26
    for name in ("live", "backfilled"):
        store = multi[name]
        assert mviews.state(store.backend, store.table) == mviews.State("current") and store.has_lookup
    assert not multi["raw"].has_lookup
    live = multi["live"]
    parts = live.backend.query(
        "SELECT count() AS n FROM system.parts WHERE active AND database = {db:String} AND table = {t:String}",
        {"db": live.table.split(".")[0], "t": live.table.split(".")[1] + mviews_sql.SCAN_T},
    ).to_pylist()[0]["n"]
    assert parts >= 2 * DAYS  # two inserts, each a part per day


def _scan_rows(store, sql: str) -> list[tuple]:
    rows = store.backend.query(sql).to_pylist()
    return sorted((tuple(r.values()) for r in rows), key=repr)


def _classified(store: ClickHouseStore) -> list[tuple]:
    """The scan table's rows as kvtrace reads them (``trace_id`` / ``span_id`` derived), sorted."""
    read = mviews_sql.scan_read_sql(store.table, False, "lo", "hi", None)
    return _scan_rows(store, f"SELECT {SCAN_COLUMNS} FROM ({read})")


@pytest.mark.parametrize("name", ["live", "backfilled"])
def test_the_classified_rows_are_the_scan_views(multi, name):
    """The scan table's rows as kvtrace reads them (``trace_id`` / ``span_id`` derived from the ids it
    stores) are the scan view's over the raw table."""
    store, raw = multi[name], multi["raw"]
    got = _classified(store)
    expected = [tuple(r.values()) for r in raw.query(f"SELECT {SCAN_COLUMNS} FROM {SCAN}").to_pylist()]
    assert len(got) == 409
    assert got == sorted(expected, key=repr)


@pytest.mark.parametrize("name", ["live", "backfilled"])
def test_the_lookups_hold_what_the_raw_table_gives(multi, name):
    store = multi[name]
    n, t = mviews.names(store.table), ident(store.table)
    q = store.backend.query
    traces = q(f"SELECT TraceId, min(Start) AS s, max(End) AS e FROM {ident(n.traces)} GROUP BY TraceId").to_pylist()
    raw = q(
        f"SELECT TraceId, min(toUnixTimestamp64Nano(Timestamp)) AS s, "
        f"max(toUnixTimestamp64Nano(Timestamp) + toInt64(Duration)) AS e FROM {t} GROUP BY TraceId"
    ).to_pylist()
    assert sorted(traces, key=repr) == sorted(raw, key=repr) and len(traces) == 39
    held = q(f"SELECT SessionId, TraceId FROM {ident(n.sessions)}").to_pylist()
    pairs = {(r["SessionId"], r["TraceId"]) for r in held}
    expected = set()
    for r in q(f"SELECT TraceId, SpanAttributes FROM {t}").to_pylist():
        attrs = dict(r["SpanAttributes"])
        expected |= {(attrs[a], r["TraceId"]) for a in sc.SESSION_ATTRIBUTES if attrs.get(a)}
    assert pairs == expected and len(pairs) == 41


@pytest.mark.parametrize("name", ["live", "backfilled"])
def test_whole_views_are_equal(multi, name):
    counts = {v: clickhouse_check.compare_view(multi["duck"], multi[name], v) for v in WHOLE_VIEWS}
    assert counts == {"session_breakdown": 26, "turn_breakdown": 62, "kv_decisions": 76, "kv_transfers": 76}


def _cases(ids) -> dict[str, Filters | None]:
    days = {f"day {d}": Filters(*multiday.day_range(d)) for d in range(DAYS)}
    return {**{f"session {s}": Filters(session_id=s) for s in ids}, **days, "everything": None}


@pytest.mark.parametrize("query", QUERIES)
def test_session_queries_are_equal_on_the_live_table(multi, query):
    """Sessions of every kind, each day and unfiltered, on the table the views filled live."""
    _check(multi, "live", query, _cases(KINDS))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["live", "backfilled"])
@pytest.mark.parametrize("query", QUERIES)
def test_every_session_every_day(multi, name, query):
    ids = [r["session_id"] for r in sessions.breakdown(multi["duck"]).to_pylist()]
    assert len(ids) == 26
    _check(multi, name, query, _cases([*ids, "nobody"]))


def _check(multi, name: str, query: str, cases: dict) -> None:
    run = QUERIES[query]
    for case, f in cases.items():
        expected, got = run(multi["duck"], f), run(multi[name], f)
        assert session_queries.same_answer(got, expected), (case, got, expected)


def test_a_one_session_read_keeps_the_time_joined_request(multi):
    """LangGraph's request trace names no session (it joins ``lg-1`` by time): a read scoped to the
    session's traces must keep it, or the call loses its TTFT (all of it counted as input)."""
    f = Filters(session_id="lg-1-101")
    expected = sessions.breakdown(multi["duck"], f).to_pylist()
    assert expected[0]["generation_ms"] == 280.0
    for name in ("live", "raw"):
        assert session_queries.same_answer(sessions.breakdown(multi[name], f).to_pylist(), expected), name


@pytest.fixture(scope="module")
def demo(demo_run):
    rc, _, traces = demo_run
    assert rc == 0
    d = traces / "bidir"
    live = multiday.load_chdb(d, before_insert=_init)
    return d, connect(d, scan_index=False), live


def test_the_demo_is_equal(demo):
    d, duck, live = demo
    assert live.has_lookup
    counts = {v: clickhouse_check.compare_view(duck, live, v) for v in WHOLE_VIEWS}
    ids = [r["session_id"] for r in sessions.breakdown(duck).to_pylist()]
    assert counts["session_breakdown"] == len(ids) >= 2 and min(counts.values()) > 0
    for query, run in QUERIES.items():  # unfiltered, the longest session and the shortest
        for f in [None, Filters(session_id=ids[0]), Filters(session_id=ids[-1])]:
            assert session_queries.same_answer(run(live, f), run(duck, f)), (query, f)


def test_an_interrupted_init_is_not_read_and_a_rerun_completes_it_once(multi):
    """Spans in the table before the views (one insert), spans the views shaped (a second insert
    after the DDL), a backfill interrupted after one day: the tables are ``partial`` and not read;
    ``init`` again backfills what is missing, no span twice."""
    backend, traces = multi["live"].backend, multi["dir"]
    rows = load.exporter_table(pa.concat_tables(pq.read_table(p, schema=SCHEMA) for p in list_files(traces)))
    table = "kvtrace_check.interrupted"
    load.create_table(backend, table)
    load.insert(backend, table, rows.take(list(range(0, rows.num_rows, 2))))
    for sql in mviews.ddl_statements(table) + mviews_sql.backfill_statements(table, "2026-01-01"):
        backend.command(sql)
    load.insert(backend, table, rows.take(list(range(1, rows.num_rows, 2))), load.exporter_settings(backend))
    st = mviews.state(backend, table)
    assert st == mviews.State("partial") and not ClickHouseStore(backend, table).has_lookup
    assert mviews.advice(table, st, "chdb:X") == (
        f"{table}: materialized tables incomplete (kvtrace reads the raw table): complete them with "
        f"`kvtrace clickhouse init --clickhouse chdb:X --table {table}`"
    )
    assert mviews.init(backend, table) == {"sessions": 26 + 3, "traces": 39, "rows": 409}
    store = ClickHouseStore(backend, table)
    assert store.has_lookup
    expected = [tuple(r.values()) for r in multi["raw"].query(f"SELECT {SCAN_COLUMNS} FROM {SCAN}").to_pylist()]
    assert _classified(store) == sorted(expected, key=repr)


def test_the_time_span_is_the_raw_tables(multi):
    expected = sessions.time_span(multi["duck"])
    assert expected["spans"] > 0 and multi["backfilled"].time_span() == expected  # from the traces table
    for name in ("raw", "backfilled", "live"):
        assert sessions.time_span(multi[name]) == expected, name
    assert multi["raw"].time_span() is None  # no tables: the caller reads the raw table
