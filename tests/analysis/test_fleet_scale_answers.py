"""Answers at fleet scale on DuckDB (issue #40): a day's or a session's question is read through
the files' partials (scan indexes and lookups, :mod:`kvtrace.store.lookup`) and the time bounds they
give, and answers exactly what the raw spans of the whole store answer, on a multi-day store whose
sessions, turns and traces cross files, hours and days, with late spans and a trace in two files,
whether every file, some or none has its partials; the dashboard's first page reads no raw span."""

from __future__ import annotations

import os
import shutil

import pytest

from kvtrace.analysis import pushdown, sessions
from kvtrace.analysis.filters import Filters
from kvtrace.store import bounds, connect, lookup, narrow, scan_index
from kvtrace.store.reader import trace_files

from support import multiday, session_queries

DAYS = 3


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """``raw``: no partials (every answer from the raw spans); ``partials``: every file indexed;
    ``half``: every other file indexed."""
    root = tmp_path_factory.mktemp("multiday")
    whole_dir = multiday.build(root / "whole", days=DAYS)
    half_dir = shutil.copytree(whole_dir, root / "half")  # the same spans (ids included)
    assert scan_index.build(trace_files(whole_dir), min_bytes=0)
    files = trace_files(half_dir)
    assert scan_index.build(files[::2], min_bytes=0)
    return {
        "dir": whole_dir,
        "raw": connect(whole_dir, scan_index=False),
        "partials": connect(whole_dir, read_only=True),
        "half": connect(half_dir, read_only=True),
    }


def _cases(con) -> dict[str, Filters]:
    cases = {"everything": Filters()}
    for d in range(DAYS):
        cases[f"day {d}"] = Filters(*multiday.day_range(d))
    lo, _ = multiday.day_range(1)  # the minute around the first midnight, and a bound at midnight itself
    cases["midnight"] = Filters(start_ns=lo - 60 * 10**9, end_ns=lo + 60 * 10**9)
    cases["from midnight"] = Filters(start_ns=lo)
    ids = sessions.list_sessions(con, limit=1000)
    # one session of each kind: kvtrace's own (crossing midnight, crossing an hour, in two files), each
    # other convention's, a prefix session that lost to the agent's, and none
    picked = [multiday.midnight_session(0), *ids[:2], *[i for i in ids if not i.startswith(("session-", "midnight-"))]]
    for sid in [*dict.fromkeys(picked), "prefix-aaa-100", "nobody"]:
        cases[f"session {sid}"] = Filters(session_id=sid)
    return cases


def test_the_store_has_what_the_issue_names(store):
    con = store["raw"]
    ids = sessions.list_sessions(con, limit=1000)
    assert multiday.midnight_session(0) in ids and len(ids) >= 12
    by_day = [sessions.totals(con, Filters(*multiday.day_range(d)))["sessions"] for d in range(DAYS)]
    assert all(n > 0 for n in by_day) and sum(by_day) > len(ids)  # sessions that cross midnight count twice


@pytest.mark.parametrize("query", session_queries.SESSION_QUERIES)
def test_day_and_session_answers_equal_the_raw_spans(store, whole, query):
    cases = _cases(store["raw"])
    assert len(cases) > 12
    for name, f in cases.items():
        expected = whole(query, store["raw"], f)
        for kind in ("raw", "partials", "half"):
            got = session_queries.SESSION_QUERIES[query](store[kind], f)
            assert session_queries.same_answer(got, expected), (name, kind, got, expected)


@pytest.mark.parametrize("view", ["session_breakdown", "turn_breakdown", "sessions", "kv_decisions"])
def test_whole_views_equal(store, view):
    sql = f"SELECT * FROM {view} ORDER BY ALL"
    expected = store["raw"].sql(sql).to_arrow_table().to_pylist()
    assert expected
    for kind in ("partials", "half"):
        assert session_queries.same_answer(store[kind].sql(sql).to_arrow_table().to_pylist(), expected), kind


def test_lookups_equal_the_raw_spans_and_are_what_is_read(store):
    raw, partials = store["raw"], store["partials"]
    merged = {  # a file's rows repeat what another file says of the same session or trace: merged
        lookup.SESSIONS: f"SELECT DISTINCT * FROM {lookup.SESSIONS}",
        lookup.TRACES: f"SELECT trace_id, min(lo), max(hi) FROM {lookup.TRACES} GROUP BY ALL",
        lookup.FACETS: f"SELECT service_name, substrate, sum(spans), min(start_ns), max(end_ns) FROM {lookup.FACETS} "
        "GROUP BY ALL",
    }
    for view, body in merged.items():
        sql = f"{body} ORDER BY ALL"
        assert partials.sql(sql).fetchall() == raw.sql(sql).fetchall(), view
        plan = "\n".join(r[1] for r in partials.execute(f"EXPLAIN {sql}").fetchall())
        assert ".parquet" not in plan.replace(".kvtrace-scan", "")  # only the lookups' files
    assert sessions.facets(partials) == sessions.facets(raw)
    facets = sessions.facets(raw)
    assert facets["spans"] == raw.sql("SELECT count(*) FROM spans").fetchall()[0][0] > 0
    assert (
        sessions.time_span(partials)
        == sessions.time_span(raw)
        == {k: facets[k] for k in ("start_ns", "end_ns", "spans")}
    )


def test_a_days_facets_are_its_spans(store):
    """The facets of a time range (the sessions page's day) from one grouped pass: the values the
    spans starting in it have; an empty range has none and no span."""
    raw = store["raw"]
    lo, hi = multiday.day_range(1)
    got = sessions.facets(store["partials"], Filters(start_ns=lo, end_ns=hi))
    assert got == sessions.facets(raw, Filters(start_ns=lo, end_ns=hi))
    rows = raw.sql(
        "SELECT service_name, substrate, start_ns, end_ns FROM spans WHERE start_ns BETWEEN $lo AND $hi",
        params={"lo": lo, "hi": hi},
    ).fetchall()
    assert got == {
        "services": sorted({r[0] for r in rows if r[0]}),
        "substrates": sorted({r[1] for r in rows if r[1] is not None}),
        "start_ns": min(r[2] for r in rows),
        "end_ns": max(r[3] for r in rows),
        "spans": len(rows),
    }
    assert len(got["services"]) > 1 and got["spans"] < sessions.facets(raw)["spans"]
    none = sessions.facets(raw, Filters(start_ns=1, end_ns=2))
    assert none == {"services": [], "substrates": [], "start_ns": None, "end_ns": None, "spans": 0}


def test_a_days_bounds_cover_its_sessions_whole(store):
    con = store["partials"]
    lo, hi = multiday.day_range(0)
    got = bounds.window_bounds(con, lo, hi)
    assert got is not None and got[0] < lo + 10 * 3600 * 10**9 and got[1] > hi  # the midnight session's end
    everything = bounds.window_bounds(con, None, None)
    assert everything == (sessions.time_span(con)["start_ns"], everything[1])
    assert bounds.window_bounds(con, everything[1] + 1, None) is None


def _corrupt_data_pages(path: str) -> None:
    """Zero a trace file's data pages, keeping its size, footer and mtime (so its partials stay
    current): whatever still reads its spans fails or answers differently."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        footer = int.from_bytes(f.read(4), "little")
        f.seek(4)
        f.write(b"\0" * (st.st_size - 12 - footer))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_the_first_page_reads_no_raw_span(tmp_path, monkeypatch):
    """The sessions page on opening (facets, the time span, the last day's totals and rows) once every
    file has its partials: the same answers with the raw spans destroyed."""
    directory = multiday.build(tmp_path, days=DAYS)
    monkeypatch.setenv("KVTRACE_SCAN_INDEX_MIN_BYTES", "0")

    def first_page(con):
        span = sessions.time_span(con)
        day = Filters(start_ns=span["end_ns"] - 24 * 3600 * 10**9, end_ns=span["end_ns"])
        return sessions.facets(con), span, session_queries.SESSION_QUERIES["overview"](con, day)

    expected = first_page(connect(directory))  # builds every file's partials
    for path in trace_files(directory):
        _corrupt_data_pages(path)
    con = connect(directory, read_only=True)
    assert session_queries.same_answer(first_page(con), expected)
    with pytest.raises(Exception):  # noqa: B017 - any error: the raw spans are gone
        con.sql("SELECT sum(length(SpanName)) FROM kvtrace_raw").fetchall()


def test_a_bounded_cursor_opens_only_the_files_its_bounds_reach(store):
    con = store["partials"]
    rows = con.execute(f"SELECT path FROM {narrow.RANGES} WHERE list = $l", {"l": narrow.FILES}).fetchall()
    everything = {r[0] for r in rows}
    lo, hi = multiday.day_range(0)
    cur = pushdown.narrowed(con, Filters(start_ns=lo, end_ns=lo + 3600 * 10**9))  # day 0's first hour
    listed = cur.execute(f"SELECT getvariable('{narrow.FILES}')").fetchall()[0][0]
    indexes = cur.execute(f"SELECT getvariable('{narrow.INDEXES}')").fetchall()[0][0]
    assert set(listed) < everything and 0 < len(indexes) == len(listed)
    plan = "\n".join(r[1] for r in cur.execute("EXPLAIN SELECT * FROM session_breakdown").fetchall())
    assert plan.count(".kvscan") <= len(indexes)  # not every index file
    assert con.execute(f"SELECT getvariable('{narrow.FILES}')").fetchall()[0][0] is None  # the cursor's own
