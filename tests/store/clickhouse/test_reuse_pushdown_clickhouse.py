"""The KV reuse and retention pages' questions through bounds on ClickHouse (issue #40): with kvtrace's
materialized tables (:mod:`kvtrace.store.clickhouse.mviews`: windows, traces, requests, prefills, d2p),
:func:`kvtrace.analysis.pushdown.request_scoped` reads only the spans a range's or a session's rows can
join, and recompute is priced at the whole table's prefill rates from the prefills and d2p tables;
the answers are exactly the whole raw table's, on the multi-day store (requests, retentions and
sessions across inserts, hours and midnight; a request and a retention of no session), whether the
tables were fed by the inserts (``live``) or backfilled.  A table without them is read whole."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

pytest.importorskip("sqlglot")
pytest.importorskip("chdb")
pytest.importorskip("support.clickhouse_check")

from kvtrace.analysis import pushdown, reuse  # noqa: E402
from kvtrace.analysis.common import rows  # noqa: E402
from kvtrace.analysis.filters import Filters  # noqa: E402
from kvtrace.store import connect, lookup  # noqa: E402
from kvtrace.store.clickhouse import load, mviews, mviews_sql  # noqa: E402
from kvtrace.store.clickhouse.backend import BackendError  # noqa: E402
from kvtrace.store.clickhouse.store import ClickHouseStore  # noqa: E402
from kvtrace.store.files import list_files  # noqa: E402
from kvtrace.store.schema import SCHEMA  # noqa: E402
from kvtrace.store.sql import ident  # noqa: E402

from support import multiday, session_queries  # noqa: E402

DAYS = 3


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    traces = multiday.build(tmp_path_factory.mktemp("multiday"), days=DAYS)
    live = multiday.load_chdb(traces, before_insert=mviews.init)
    backfilled = multiday.load_chdb(traces, live.backend, parts=None)
    mviews.init(backfilled.backend, backfilled.table)
    raw = multiday.load_chdb(traces, live.backend, parts=None)  # no materialized tables
    duck = connect(traces, scan_index=False)
    return {"live": live, "backfilled": backfilled, "raw": raw, "duck": duck, "dir": traces}


def _at(con, sql: str, params: dict) -> int:
    [row] = con.query(sql, params).to_pylist()
    return next(iter(row.values()))


def _cases(raw) -> dict[str, Filters]:
    """A day, the minute around midnight, an open end, one decision's instant (its request's other spans
    lie outside), one bare prefill's instant (a request of no session: its decision lies outside), a
    session, none, and after everything."""
    lo, _ = multiday.day_range(1)
    sid = multiday.midnight_session(0)
    [turn] = [r for r in reuse.requests(raw, Filters(session_id=sid)).to_pylist() if r["turn"] == 1]
    bare = _at(raw, "SELECT start_ns FROM engine_requests WHERE request_id = $r", {"r": multiday.bare_request(0)})
    return {
        "day 1": Filters(*multiday.day_range(1)),
        "midnight": Filters(start_ns=lo - 60 * 10**9, end_ns=lo + 60 * 10**9),
        "from midnight": Filters(start_ns=lo),
        "one decision": Filters(start_ns=turn["start_ns"], end_ns=turn["start_ns"]),
        "one bare prefill": Filters(start_ns=bare, end_ns=bare),
        "day 0, service": Filters(*multiday.day_range(0), service="kvtrace-proxy"),
        f"session {sid}": Filters(session_id=sid),
        "session nobody": Filters(session_id="nobody"),
        "after everything": Filters(start_ns=multiday.day_range(DAYS)[0]),
    }


@pytest.mark.parametrize("query", session_queries.REUSE_QUERIES)
def test_bounded_reuse_answers_equal_the_whole_tables(stores, query):
    fn, raw = session_queries.REUSE_QUERIES[query], stores["raw"]
    for name, f in _cases(raw).items():
        expected = fn(raw, f)  # no materialized tables: every span read, the rates over the views
        got = fn(stores["live"], f)
        assert session_queries.same_answer(got, expected), (name, got, expected)


@pytest.mark.slow
@pytest.mark.parametrize("query", session_queries.REUSE_QUERIES)
def test_bounded_reuse_answers_equal_on_the_backfilled_table(stores, query):
    fn, raw = session_queries.REUSE_QUERIES[query], stores["raw"]
    for name, f in {"everything": Filters(), **_cases(raw)}.items():
        expected = fn(raw, f)
        assert session_queries.same_answer(fn(stores["backfilled"], f), expected), name


def _sorted(table) -> list[tuple]:
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


@pytest.mark.parametrize("name", ["live", "backfilled"])
def test_the_tables_hold_the_duckdb_lookups_rows(stores, name):
    """The requests table merged per request, and the prefills and d2p tables, are the DuckDB store's
    lookups over the same spans (the views' own rows)."""
    store, duck = stores[name], stores["duck"]
    n, q = mviews.names(store.table), store.backend.query
    merged = q(f"SELECT request_id, min(lo) AS lo, max(hi) AS hi FROM {ident(n.requests)} GROUP BY request_id")
    expected = duck.execute(f"SELECT request_id, lo, hi FROM ({lookup.sql(lookup.REQUESTS, 'kvtrace_raw')})").fetchall()
    assert _sorted(merged) == sorted(expected, key=repr) and merged.num_rows == 75
    pairs = ((n.prefills, lookup.PREFILLS, lookup.PREFILLS_COLUMNS), (n.d2p, lookup.D2P, lookup.D2P_COLUMNS))
    for table, view, columns in pairs:
        got = q(f"SELECT {columns} FROM {ident(table)}")
        want = duck.execute(f"SELECT {columns} FROM ({lookup.sql(view, 'kvtrace_raw')})").fetchall()
        assert _sorted(got) == sorted(want, key=repr) and got.num_rows > 10, table


def test_a_backfill_rerun_adds_no_row(stores):
    store = stores["backfilled"]
    n = mviews.names(store.table)
    count = {t: _at(store, f"SELECT count(*) AS n FROM {ident(t)}", {}) for t in (n.prefills, n.d2p, n.scan)}
    day = datetime.fromtimestamp(multiday.day_range(1)[0] / 1e9, UTC).date().isoformat()
    for sql in mviews_sql.backfill_statements(store.table, day):
        store.backend.command(sql)
    assert {t: _at(store, f"SELECT count(*) AS n FROM {ident(t)}", {}) for t in count} == count


def test_the_whole_tables_rates_price_a_bounded_question(stores):
    live, raw = stores["live"], stores["raw"]
    assert live.rates_relations() is not None and raw.rates_relations() is None
    by_views = rows(raw, reuse.PREFILL_RATE_SQL + " ORDER BY engine_id NULLS FIRST")
    assert len(by_views) > 1 and session_queries.same_answer(reuse.prefill_rates(live), by_views)
    day = pushdown.request_scoped(live, Filters(*multiday.day_range(0)))
    assert day.bounds is not None and session_queries.same_answer(reuse.prefill_rates(day), by_views)
    assert session_queries.same_answer(reuse.break_even(day), rows(raw, reuse.BREAK_EVEN_SQL))


def _spans(store) -> int:
    return _at(store, "SELECT count(*) AS n FROM kvtrace_raw", {})


def test_a_request_is_read_whole_and_the_rest_is_not_read(stores):
    live, raw = stores["live"], stores["raw"]
    sid = multiday.midnight_session(0)
    [turn] = [r for r in reuse.requests(raw, Filters(session_id=sid)).to_pylist() if r["turn"] == 1]
    lo, hi = (
        _at(raw, f"SELECT {fn}({col}) AS v FROM spans WHERE request_id = $r", {"r": turn["request_id"]})
        for fn, col in (("min", "start_ns"), ("max", "end_ns"))
    )
    got = live.requests_bounds(turn["start_ns"], turn["start_ns"])
    assert got is not None and got[0] <= lo < multiday.day_range(1)[0] < hi <= got[1]  # across midnight
    everything = _spans(live)
    one = pushdown.request_scoped(live, Filters(start_ns=turn["start_ns"], end_ns=turn["start_ns"]))
    assert 0 < _spans(one) < everything / DAYS
    assert _spans(pushdown.request_scoped(live, Filters(session_id="nobody"))) == 0
    assert pushdown.request_scoped(live, Filters(service="kvtrace-proxy")) is live  # no time, no session
    assert pushdown.request_scoped(live, Filters(session_id=sid), by_session=False) is live
    day = Filters(*multiday.day_range(1))
    assert pushdown.request_scoped(raw, day) is raw and raw.requests_bounds(0, 2**62) is None  # no tables: whole
    assert _spans(live) == everything  # bounds belong to the bounded copy


def test_what_is_kept_follows_each_insert(stores):
    """The bounds and rates kept per state of the tables' parts (:meth:`ClickHouseStore.generation`) are
    found again after an insert: a day inserted later is read, and priced, at once."""
    backend, raw = stores["raw"].backend, stores["raw"]
    table = stores["live"].table + "_later"
    load.create_table(backend, table)
    mviews.init(backend, table)
    spans = load.exporter_table(pa.concat_tables(pq.read_table(p, schema=SCHEMA) for p in list_files(stores["dir"])))
    day1_lo = multiday.day_range(1)[0]
    early = pc.less(pc.cast(spans["Timestamp"], pa.int64()), day1_lo)
    settings = load.exporter_settings(backend)
    load.insert(backend, table, spans.filter(early), settings)
    store, day1 = ClickHouseStore(backend, table), Filters(*multiday.day_range(1))
    before = store.generation()
    assert before is not None and reuse.summary(store, day1)["decisions"] == 0
    day0_rates = reuse.prefill_rates(store)
    load.insert(backend, table, spans.filter(pc.invert(early)), settings)
    assert store.generation() != before
    assert reuse.summary(store, day1)["decisions"] > 0
    for f in (day1, Filters(start_ns=day1_lo)):
        assert session_queries.same_answer(reuse.summary(store, f), reuse.summary(raw, f))
    whole = reuse.prefill_rates(raw)
    assert not session_queries.same_answer(day0_rates, whole)
    assert session_queries.same_answer(reuse.prefill_rates(store), whole)


def test_without_system_parts_nothing_is_kept_and_the_answers_hold(stores, monkeypatch):
    """A user who cannot read ``system.parts``: no generation, so bounds and rates are found for each
    question (never kept where a change could not be seen), and the answers are the raw table's."""
    live, raw = stores["live"], stores["raw"]
    store = ClickHouseStore(live.backend, live.table)
    real = store.backend.query

    def query(sql, params=None):
        if "system.parts" in sql:
            raise BackendError("Not enough privileges")
        return real(sql, params)

    monkeypatch.setattr(store.backend, "query", query)
    assert store.has_lookup and store.generation() is None
    calls = []
    monkeypatch.setattr(store, "requests_bounds", lambda lo, hi: calls.append((lo, hi)) or live.requests_bounds(lo, hi))
    day = Filters(*multiday.day_range(1))
    for _ in range(2):
        assert session_queries.same_answer(reuse.summary(store, day), reuse.summary(raw, day))
    assert len(calls) == 2


def test_a_v3_set_is_completed_in_place(stores):
    """``kvtrace clickhouse init`` on a table with the v3 set adds the requests, prefills and d2p tables
    (backfilled) and keeps the v3 tables as they are (a row only they hold survives); the answers are
    then the raw table's, for what was inserted before and after."""
    backend, raw = stores["raw"].backend, stores["raw"]
    table = stores["live"].table + "_v3"
    old, t = mviews.comment(3), mviews.names(table)
    v3 = tuple(s for s in mviews_sql.TARGETS if s not in mviews.UPGRADES[old])
    load.create_table(backend, table)
    spans = load.exporter_table(pa.concat_tables(pq.read_table(p, schema=SCHEMA) for p in list_files(stores["dir"])))
    first = pc.less(pc.cast(spans["Timestamp"], pa.int64()), multiday.day_range(1)[0] + 3600 * 10**9)
    settings = load.exporter_settings(backend)
    load.insert(backend, table, spans.filter(first), settings)
    for sql in mviews_sql.ddl_statements(table, old, mviews_sql.building(old), v3):
        backend.command(sql)
    for row in backend.query(mviews_sql.days_sql(table)).to_pylist():
        for sql in mviews_sql.backfill_statements(table, row["day"], v3):
            backend.command(sql)
    for sql in mviews_sql.mark_statements(table, old, v3):
        backend.command(sql)
    st = mviews.state(backend, table)
    assert st == mviews.State("old", (old,)) and mviews.added(table, st) == mviews.UPGRADES[old]
    assert mviews.advice(table, st, "chdb:X") == (
        f"{table}: materialized tables are {old}, this kvtrace reads {mviews.COMMENT} (until then it reads the raw "
        f"table): add what {mviews.COMMENT} adds with `kvtrace clickhouse init --clickhouse chdb:X --table {table}` "
        "(the tables already there are kept)"
    )
    backend.command(f"INSERT INTO {ident(t.sessions)} (SessionId, TraceId) VALUES ('kept-session', 'kept-trace')")
    mviews.init(backend, table)
    assert mviews.state(backend, table) == mviews.State("current")
    load.insert(backend, table, spans.filter(pc.invert(first)), settings)
    store = ClickHouseStore(backend, table)
    assert _at(store, f"SELECT count(*) AS n FROM {ident(t.sessions)} WHERE SessionId = 'kept-session'", {}) == 1
    for f in (Filters(*multiday.day_range(1)), Filters(session_id=multiday.midnight_session(0))):
        for query in ("summary", "retention_totals", "tokens_by_source"):
            fn = session_queries.REUSE_QUERIES[query]
            assert session_queries.same_answer(fn(store, f), fn(raw, f)), (query, f)


def test_an_older_set_missing_a_table_is_rebuilt_not_completed(stores):
    backend = stores["raw"].backend
    table = stores["live"].table + "_v3_short"
    old = mviews.comment(3)
    load.create_table(backend, table)
    v3 = (mviews_sql.SCAN_T, mviews_sql.SESSIONS, mviews_sql.TRACES)  # the windows table dropped by hand
    for sql in mviews_sql.ddl_statements(table, old, old, v3):
        backend.command(sql)
    st = mviews.state(backend, table)
    assert st == mviews.State("old", (old,)) and mviews.added(table, st) is None
    with pytest.raises(BackendError, match="--replace"):
        mviews.init(backend, table)
