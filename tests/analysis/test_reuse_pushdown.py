"""The KV reuse and retention pages' questions through ``Timestamp`` bounds on DuckDB (issue #40,
:func:`kvtrace.analysis.pushdown.request_scoped`): a day's, a minute's or a session's answers are
exactly those of the whole store's raw spans, recompute priced at the whole store's prefill rates, on
the multi-day store whose sessions, requests, retentions and traces cross files, hours and midnight
(and a request and a retention of no session), whether every file, some or none has its lookups; and
the bounded cursor reads fewer spans."""

from __future__ import annotations

import shutil

import pytest

from kvtrace.analysis import pushdown, reuse
from kvtrace.analysis.common import rows
from kvtrace.analysis.filters import Filters
from kvtrace.store import bounds, connect, scan_index
from kvtrace.store.reader import trace_files

from support import multiday, session_queries

DAYS = 3


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """``raw``: no lookups; ``partials``: every file indexed; ``half``: every other file indexed."""
    root = tmp_path_factory.mktemp("multiday")
    whole_dir = multiday.build(root / "whole", days=DAYS)
    half_dir = shutil.copytree(whole_dir, root / "half")
    assert scan_index.build(trace_files(whole_dir), min_bytes=0)
    assert scan_index.build(trace_files(half_dir)[::2], min_bytes=0)
    return {
        "raw": connect(whole_dir, scan_index=False),
        "partials": connect(whole_dir, read_only=True),
        "half": connect(half_dir, read_only=True),
    }


@pytest.fixture
def unbounded(monkeypatch):
    """A reuse question as it was answered before its pushdown: every span read, the rates over the views."""

    def run(query, con, filters):
        with monkeypatch.context() as m:
            m.setattr(pushdown.duck_bounds, "bounded", lambda con, lo, hi: con)
            m.setattr(reuse, "_over", lambda con: reuse._VIEWS)
            return session_queries.REUSE_QUERIES[query](con, filters)

    return run


def _midnight_request(con) -> dict:
    """The turn of the midnight session whose request's spans cross 00:00 (its LLM call starts 0.2 s before)."""
    sid = multiday.midnight_session(0)
    [row] = [r for r in reuse.requests(con, Filters(session_id=sid)).to_pylist() if r["turn"] == 1]
    return row


def _bare_prefill(con) -> int:
    [(start,)] = con.execute(
        "SELECT start_ns FROM engine_requests WHERE request_id = $r", {"r": multiday.bare_request(0)}
    ).fetchall()
    return start


def _cases(con) -> dict[str, Filters]:
    lo, _ = multiday.day_range(1)
    cases = {"everything": Filters()}
    cases.update({f"day {d}": Filters(*multiday.day_range(d)) for d in range(DAYS)})
    cases["midnight"] = Filters(start_ns=lo - 60 * 10**9, end_ns=lo + 60 * 10**9)
    cases["from midnight"], cases["until midnight"] = Filters(start_ns=lo), Filters(end_ns=lo)
    at = _midnight_request(con)["start_ns"]  # a range holding its decision only: the request's other spans lie outside
    cases["one decision"] = Filters(start_ns=at, end_ns=at)
    bare = _bare_prefill(con)  # a range holding the prefill of a request of no session, not its decision
    cases["one bare prefill"] = Filters(start_ns=bare, end_ns=bare)
    cases["day 1, service"] = Filters(*multiday.day_range(1), service="kvtrace-proxy")
    cases["day 0, substrate"] = Filters(*multiday.day_range(0), substrate="sim")
    cases["after everything"] = Filters(start_ns=multiday.day_range(DAYS)[0])
    sids = {r["session_id"] for r in reuse.requests(con).to_pylist()} - {None}
    for sid in [*sorted(sids)[:3], multiday.midnight_session(0), "nobody"]:
        cases[f"session {sid}"] = Filters(session_id=sid)
    return cases


def test_the_store_has_reuse_to_answer(store):
    con = store["raw"]
    assert reuse.summary(con)["pulled_requests"] > 0
    row = _midnight_request(con)
    spans = con.execute(
        "SELECT min(start_ns), max(end_ns) FROM spans WHERE request_id = $r", {"r": row["request_id"]}
    ).fetchall()[0]
    lo, _ = multiday.day_range(1)
    assert spans[0] < lo < spans[1] and row["outcome"] == "pulled"
    # the request of no session: tokens by source takes its split from the decision, 0.3 s after the prefill
    bare = Filters(start_ns=_bare_prefill(con), end_ns=_bare_prefill(con))
    assert reuse.tokens_by_source(con, bare).to_pylist() == [
        {"turn": 0, "requests": 1, "local_hit_tokens": 0, "pulled_tokens": 1600, "computed_tokens": 400}
    ]


@pytest.mark.parametrize("query", session_queries.REUSE_QUERIES)
def test_bounded_reuse_answers_equal_the_whole_stores(store, unbounded, query):
    cases = _cases(store["raw"])
    for name, f in cases.items():
        expected = unbounded(query, store["raw"], f)
        for kind in ("raw", "partials", "half"):
            got = session_queries.REUSE_QUERIES[query](store[kind], f)
            assert session_queries.same_answer(got, expected), (name, kind, got, expected)


@pytest.mark.parametrize("kind", ["raw", "partials", "half"])
def test_the_lookups_rates_are_the_views(store, kind):
    con = store[kind]
    by_views = rows(con, reuse.PREFILL_RATE_SQL + " ORDER BY engine_id NULLS FIRST")
    assert len(by_views) > 1 and session_queries.same_answer(reuse.prefill_rates(con), by_views)
    assert session_queries.same_answer(reuse.break_even(con), rows(con, reuse.BREAK_EVEN_SQL))
    # a bounded cursor still prices recompute at the whole store's rates
    day = pushdown.request_scoped(con, Filters(*multiday.day_range(0)))
    assert session_queries.same_answer(reuse.prefill_rates(day), by_views)


def _count(con) -> int:
    return con.execute("SELECT count(*) FROM kvtrace_raw").fetchall()[0][0]


def test_a_request_is_read_whole_and_the_rest_is_not_read(store):
    con = store["partials"]
    row = _midnight_request(con)
    [(lo, hi)] = (
        store["raw"]
        .execute("SELECT min(start_ns), max(end_ns) FROM spans WHERE request_id = $r", {"r": row["request_id"]})
        .fetchall()
    )
    got = bounds.requests_bounds(con, row["start_ns"], row["start_ns"])
    assert got is not None and got[0] <= lo and got[1] >= hi
    everything = _count(con)
    one = pushdown.request_scoped(con, Filters(start_ns=row["start_ns"], end_ns=row["start_ns"]))
    assert 0 < _count(one) < everything / DAYS
    assert 0 < _count(pushdown.request_scoped(con, Filters(*multiday.day_range(1)))) < everything
    assert _count(pushdown.request_scoped(con, Filters(session_id="nobody"))) == 0
    assert pushdown.request_scoped(con, Filters(service="kvtrace-proxy")) is con  # no time, no session
    assert pushdown.request_scoped(con, None) is con
    sid = Filters(session_id=multiday.midnight_session(0))
    assert pushdown.request_scoped(con, sid, by_session=False) is con  # continuity: an agent's other session
    assert _count(con) == everything  # the variables are the cursor's own
