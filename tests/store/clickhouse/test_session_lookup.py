"""kvtrace's session lookup on ClickHouse (:mod:`kvtrace.store.clickhouse.mviews`, ``kvtrace
clickhouse init``), on chDB: the lookup holds what a GROUP BY over the raw table gives, after a
backfill and after inserts the materialized views saw (a session's spans in two inserts, two
parts); a one-session query gives the same rows with it as without, reading fewer; init is
idempotent; an older version is ignored and refused with one line; doctor says how to add it."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

pytest.importorskip("sqlglot")
pytest.importorskip("chdb")
clickhouse_check = pytest.importorskip("support.clickhouse_check")

from kvtrace import semconv as sc  # noqa: E402
from kvtrace.analysis import sessions  # noqa: E402
from kvtrace.analysis.filters import Filters  # noqa: E402
from kvtrace.analysis.pushdown import narrowed  # noqa: E402
from kvtrace.cli import main  # noqa: E402
from kvtrace.store.clickhouse import load, mviews, mviews_sql  # noqa: E402
from kvtrace.store.clickhouse.backend import BackendError, ChdbBackend  # noqa: E402
from kvtrace.store.clickhouse.store import ClickHouseStore  # noqa: E402
from kvtrace.store.files import list_files  # noqa: E402
from kvtrace.store.schema import SCHEMA  # noqa: E402
from kvtrace.store.sql import ident  # noqa: E402
from kvtrace.testing.synth import BASE_NS  # noqa: E402

from support import session_queries  # noqa: E402

DAY = 86_400 * 10**9
ROOT = __import__("pathlib").Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """``plain``: no lookup; ``backfilled``: init after the load; ``live``: init on the empty
    table, then the spans in two inserts (alternate rows: every trace in both parts)."""
    traces = clickhouse_check.tiled_store(tmp_path_factory.mktemp("days"), 3, DAY, sessions=3, turns=3)
    plain = clickhouse_check.load_dir(traces)
    backend = plain.backend
    backfilled = clickhouse_check.load_dir(traces, backend, "kvtrace_lookup.backfilled")
    mviews.init(backend, backfilled.table)
    live = "kvtrace_lookup.live"
    load.create_table(backend, live)
    mviews.init(backend, live)
    rows = load.exporter_table(pa_concat([pq.read_table(p, schema=SCHEMA) for p in list_files(traces)]))
    for half in (0, 1):
        load.insert(backend, live, rows.take(list(range(half, rows.num_rows, 2))))
    parts = backend.query(
        "SELECT count() AS n FROM system.parts WHERE database = 'kvtrace_lookup' AND table = 'live' AND active"
    ).to_pylist()[0]["n"]
    assert parts >= 2
    return {"plain": plain, "backfilled": backfilled, "live": ClickHouseStore(backend, live)}


def pa_concat(parts):
    import pyarrow as pa

    return pa.concat_tables(parts)


def _expected_lookup(store) -> tuple[set, dict]:
    """(session, trace) pairs and trace -> (first start, last end), from the raw rows in Python."""
    t = ident(store.table)
    rows = store.backend.query(
        f"SELECT TraceId, SpanAttributes, toUnixTimestamp64Nano(Timestamp) AS s, toInt64(Duration) AS d FROM {t}"
    ).to_pylist()
    pairs, spans = set(), {}
    for r in rows:
        attrs = dict(r["SpanAttributes"])
        pairs |= {(attrs[a], r["TraceId"]) for a in sc.SESSION_ATTRIBUTES if attrs.get(a)}
        lo, hi = spans.get(r["TraceId"], (r["s"], r["s"] + r["d"]))
        spans[r["TraceId"]] = (min(lo, r["s"]), max(hi, r["s"] + r["d"]))
    return pairs, spans


def _lookup(store) -> tuple[set, dict]:
    n = mviews.names(store.table)
    pairs = store.backend.query(f"SELECT SessionId, TraceId FROM {ident(n.sessions)}").to_pylist()
    spans = store.backend.query(
        f"SELECT TraceId, min(Start) AS lo, max(End) AS hi FROM {ident(n.traces)} GROUP BY TraceId"
    ).to_pylist()
    return {(p["SessionId"], p["TraceId"]) for p in pairs}, {s["TraceId"]: (s["lo"], s["hi"]) for s in spans}


@pytest.mark.parametrize("name", ["backfilled", "live"])
def test_lookup_rows_equal_a_group_by_over_the_table(tables, name):
    store = tables[name]
    expected = _expected_lookup(store)
    assert len(expected[0]) == 9 and len(expected[1]) == 9
    assert _lookup(store) == expected
    assert mviews.state(store.backend, store.table) == mviews.State("current")


def _session_ids(tables) -> list[str]:
    return [r["session_id"] for r in sessions.breakdown(tables["plain"]).to_pylist()]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["backfilled", "live"])
@pytest.mark.parametrize("query", session_queries.SESSION_QUERIES)
def test_one_session_answers_are_the_same_with_the_lookup(tables, name, query):
    """Every session (a sweep of minutes: ``..._for_some_sessions`` is its fast sibling)."""
    fn = session_queries.SESSION_QUERIES[query]
    sids = _session_ids(tables)
    assert len(sids) == 9
    _same_with_and_without(tables, name, fn, [*sids, "nobody"])


@pytest.mark.parametrize("query", session_queries.SESSION_QUERIES)
def test_one_session_answers_are_the_same_for_some_sessions(tables, query):
    """Two sessions (the longest and the shortest) and none, on the table the views filled live."""
    sids = _session_ids(tables)
    _same_with_and_without(tables, "live", session_queries.SESSION_QUERIES[query], [sids[0], sids[-1], "nobody"])


def _same_with_and_without(tables, name, fn, sids) -> None:
    for sid in sids:
        f = Filters(session_id=sid)
        expected, got = fn(tables["plain"], f), fn(tables[name], f)
        assert session_queries.same_answer(got, expected), (sid, got, expected)


def test_breakdown_rows_are_whole_and_equal(tables):
    for sid in _session_ids(tables):
        f = Filters(session_id=sid)
        plain = sessions.breakdown(tables["plain"], f).to_pylist()
        assert len(plain) == 1
        assert sessions.breakdown(tables["backfilled"], f).to_pylist() == plain
        # two parts: floats summed in another order (1e-9 relative), everything else exactly
        assert session_queries.same_answer(sessions.breakdown(tables["live"], f).to_pylist(), plain)


def _rows_read(store, fn) -> int:
    before = store.backend.rows_read
    fn()
    return store.backend.rows_read - before


def test_the_scan_reads_the_sessions_traces_only(tables):
    sid = _session_ids(tables)[4]
    f = Filters(session_id=sid)
    plain, looked = narrowed(tables["plain"], f), narrowed(tables["backfilled"], f)
    assert (plain.session, looked.session) == (None, sid)
    assert looked.bounds == plain.bounds
    without = _rows_read(tables["plain"], lambda: sessions.breakdown(tables["plain"], f))
    with_ = _rows_read(tables["backfilled"], lambda: sessions.breakdown(tables["backfilled"], f))
    assert with_ < 0.6 * without, (with_, without)


def test_init_twice_changes_nothing(tables):
    store = tables["live"]
    before = _lookup(store)
    assert mviews.init(store.backend, store.table) == {"sessions": 9, "traces": 9, "rows": 189}
    assert _lookup(store) == before
    f = Filters(session_id=_session_ids(tables)[0])
    assert session_queries.same_answer(
        sessions.breakdown(store, f).to_pylist(), sessions.breakdown(tables["plain"], f).to_pylist()
    )


def test_the_sql_file_is_the_generated_ddl():
    assert (ROOT / "collectors" / "clickhouse-kvtrace-views.sql").read_text() == mviews.sql_file()


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_an_older_lookup_is_ignored_and_refused_in_one_line(tables, capsys):
    backend = tables["plain"].backend
    table = "kvtrace_lookup.older"
    load.create_table(backend, table)
    backend.command(f"INSERT INTO {ident(table)} SELECT * FROM {ident(tables['plain'].table)}")
    for sql in mviews.ddl_statements(table, version=0) + mviews_sql.mark_statements(table, mviews.comment(0)):
        backend.command(sql)
    assert mviews.state(backend, table) == mviews.State("old", (mviews.comment(0),))
    store = ClickHouseStore(backend, table)
    sid = _session_ids(tables)[1]
    scoped = narrowed(store, Filters(session_id=sid))
    assert not store.has_lookup and scoped.session is None
    assert (
        sessions.breakdown(scoped, Filters(session_id=sid)).to_pylist()
        == sessions.breakdown(tables["plain"], Filters(session_id=sid)).to_pylist()
    )
    url = f"chdb:{backend.path}"
    advice = mviews.advice(table, mviews.State("old", (mviews.comment(0),)), url)
    assert _cli(capsys, "clickhouse", "init", "--clickhouse", url, "--table", table) == (
        2,
        "",
        f"kvtrace clickhouse: error: {advice}\n",
    )
    rc, out, err = _cli(capsys, "clickhouse", "init", "--clickhouse", url, "--table", table, "--replace")
    assert (rc, err) == (0, "")
    assert (
        out == f"kvtrace clickhouse: {url} table {table}: materialized tables {mviews.COMMENT} ready "
        "(9 sessions, 9 traces, 189 classified rows)\n"
    )
    assert ClickHouseStore(backend, table).has_lookup


def test_the_v1_session_lookup_is_old(tables):
    """kvtrace's first version (the session lookup alone, comment ``kvtrace session lookup v1``) is
    told apart, ignored (the raw table is read) and named in the advice."""
    backend = tables["plain"].backend
    table = "kvtrace_lookup.v1"
    load.create_table(backend, table)
    backend.command(
        f"CREATE TABLE {ident(table + mviews.SESSIONS)} (SessionId String, TraceId String) "
        "ENGINE = ReplacingMergeTree ORDER BY (SessionId, TraceId) COMMENT 'kvtrace session lookup v1'"
    )
    st = mviews.state(backend, table)
    assert st == mviews.State("old", ("kvtrace session lookup v1",))
    assert not ClickHouseStore(backend, table).has_lookup
    assert mviews.advice(table, st, "chdb:X") == (
        f"{table}: materialized tables are kvtrace session lookup v1, this kvtrace reads {mviews.COMMENT} (until "
        f"then it reads the raw table): rebuild them with `kvtrace clickhouse init --clickhouse chdb:X --table {table} "
        "--replace`"
    )


def test_doctor_says_how_to_add_the_lookup(tables, capsys):
    plain = tables["plain"]
    url = f"chdb:{plain.backend.path}"
    _, out, _ = _cli(capsys, "doctor", "--clickhouse", url, "--table", plain.table)
    line = (
        f"{plain.table}: no materialized tables (every answer reads the raw table): add them with "
        f"`kvtrace clickhouse init --clickhouse {url} --table {plain.table}`"
    )
    assert out.splitlines()[-1] == line
    _, out, _ = _cli(capsys, "doctor", "--clickhouse", url, "--table", tables["backfilled"].table)
    assert "materialized tables" not in out


def test_init_on_a_missing_table_or_an_unreachable_server_is_one_line(tables, capsys):
    url = f"chdb:{tables['plain'].backend.path}"
    rc, out, err = _cli(capsys, "clickhouse", "init", "--clickhouse", url, "--table", "kvtrace_lookup.nothing")
    assert (rc, out) == (2, "") and err.startswith("kvtrace clickhouse: error: table kvtrace_lookup.nothing: ")
    assert err.count("\n") == 1 and "UNKNOWN_TABLE" in err
    pytest.importorskip("clickhouse_connect")
    rc, out, err = _cli(capsys, "clickhouse", "init", "--clickhouse", "http://127.0.0.1:9")
    assert (rc, out) == (2, "") and err.startswith("kvtrace clickhouse: error: cannot connect to ClickHouse at ")
    assert err.count("\n") == 1


def test_copies_take_the_stores_answer_until_it_checks_again(tables):
    plain = tables["plain"]
    later = "kvtrace_lookup.later"
    plain.backend.command(f"CREATE TABLE {ident(later)} AS {ident(plain.table)}")
    plain.backend.command(f"INSERT INTO {ident(later)} SELECT * FROM {ident(plain.table)}")
    store = ClickHouseStore(plain.backend, later)
    assert not store.has_lookup
    mviews.init(store.backend, later)  # kvtrace clickhouse init while the store is open
    assert not store.cursor().has_lookup and not store.bounded(0, 1).has_lookup  # checked once: the store's
    store.refresh()  # the dashboard's Refresh
    assert store.cursor().has_lookup and store.bounded(0, 1).has_lookup
    day = Filters(start_ns=BASE_NS + DAY, end_ns=BASE_NS + 2 * DAY)  # the second copy's day
    expected = sessions.totals(plain, day)
    assert expected["sessions"] > 0 and session_queries.same_answer(sessions.totals(store, day), expected)


def test_init_without_ddl_rights_is_one_line(tables, capsys):
    """chDB has no users: ``readonly = 1`` on its connection is the closest real thing (what a
    ClickHouse user profile with readonly sets): init fails in one line, reads still answer.  Last in
    the module: it cannot be unset."""
    backend = tables["plain"].backend
    table = "kvtrace_lookup.readonly"
    load.create_table(backend, table)
    backend.command("SET readonly = 1")
    try:
        with pytest.raises(BackendError) as err:
            mviews.init(backend, table)
        assert str(err.value).startswith(f"cannot create the materialized tables of {table}: ")
        assert "READONLY" in str(err.value) and "\n" not in str(err.value)
        assert mviews.state(backend, table) == mviews.State("absent")
        # reading needs no more than SELECT: the materialized tables answer, the raw table too
        f = Filters(session_id=_session_ids(tables)[2])
        shaped = ClickHouseStore(backend, tables["backfilled"].table)
        assert shaped.has_lookup
        assert session_queries.same_answer(
            sessions.breakdown(shaped, f).to_pylist(), sessions.breakdown(tables["plain"], f).to_pylist()
        )
    finally:
        ChdbBackend.shutdown()
