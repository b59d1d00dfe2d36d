"""The dashboard's filters on ClickHouse: pushed down to ``Timestamp`` bounds
(:mod:`kvtrace.analysis.pushdown`), the same answers as DuckDB, and less of the table read.

A three-day store (the same sessions each day, new ids) is loaded into chDB as the Collector's
exporter writes it; every session-scoped named query (sessions page, drill-down, latency) with a
time range, a session id, both, a service, or a session that does not exist, must equal DuckDB's
answer on the Parquet directory, while chDB reads a fraction of the rows it reads unfiltered.
"""

from __future__ import annotations

import pytest

pytest.importorskip("sqlglot")
pytest.importorskip("chdb")
clickhouse_check = pytest.importorskip("support.clickhouse_check")

from kvtrace.analysis import sessions  # noqa: E402
from kvtrace.analysis.filters import Filters  # noqa: E402
from kvtrace.analysis.pushdown import narrowed  # noqa: E402
from kvtrace.store import connect  # noqa: E402
from kvtrace.testing.synth import BASE_NS, PROXY  # noqa: E402

from support import session_queries  # noqa: E402

DAY = 86_400 * 10**9


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    traces = clickhouse_check.tiled_store(tmp_path_factory.mktemp("days"), 3, DAY, sessions=3, turns=3)
    return connect(traces), clickhouse_check.load_dir(traces)


DAY1 = Filters(start_ns=BASE_NS + DAY, end_ns=BASE_NS + 2 * DAY - 1)
CASES = {
    "day 1": DAY1,
    "from day 1 on": Filters(start_ns=BASE_NS + DAY),
    "until day 0 ends": Filters(end_ns=BASE_NS + DAY - 1),
    "one session": Filters(session_id="session-1-1"),
    "session and its day": Filters(session_id="session-1-1", start_ns=DAY1.start_ns, end_ns=DAY1.end_ns),
    "session, another day": Filters(session_id="session-1-1", start_ns=BASE_NS, end_ns=BASE_NS + DAY - 1),
    "service and day": Filters(service=PROXY, start_ns=DAY1.start_ns, end_ns=DAY1.end_ns),
    "no such session": Filters(session_id="nobody"),
    "nothing": None,
}
QUERIES = session_queries.SESSION_QUERIES
same = session_queries.same_answer


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize("case", CASES)
def test_filtered_answers_equal_duckdb(stores, query, case):
    duck, ch = stores
    expected, got = QUERIES[query](duck, CASES[case]), QUERIES[query](ch, CASES[case])
    assert same(got, expected), (got, expected)


def test_the_day_has_its_sessions_only(stores):
    duck, _ = stores
    assert sessions.totals(duck, DAY1)["sessions"] == 3
    assert sessions.totals(duck)["sessions"] == 9


def test_drill_down_and_facets_equal_duckdb(stores):
    duck, ch = stores
    assert same(sessions.session_info(ch, "session-1-1"), sessions.session_info(duck, "session-1-1"))
    assert sessions.session_info(ch, "nobody") == sessions.session_info(duck, "nobody") == {}
    got, expected = (
        sessions.spans_of_session(c, "session-1-1", clip_ns=BASE_NS + DAY + 60_000_000_000) for c in (ch, duck)
    )
    assert len(got) == len(expected) > 30 and same(got, expected)
    assert same(sessions.facets(ch, DAY1), sessions.facets(duck, DAY1))
    assert sessions.facets(ch, DAY1)["spans"] == sessions.facets(duck)["spans"] // 3
    assert same(sessions.time_span(ch), sessions.time_span(duck))


def test_filters_become_timestamp_bounds(stores):
    duck, ch = stores
    one = narrowed(ch, Filters(session_id="session-1-1"))
    info = sessions.session_info(duck, "session-1-1")
    assert one.bounds[0] == info["start_ns"] and one.bounds[1] >= info["end_ns"]
    day = narrowed(ch, DAY1)
    assert BASE_NS + DAY <= day.bounds[0] < day.bounds[1] < BASE_NS + 2 * DAY
    assert narrowed(ch, Filters(session_id="nobody")).bounds == (1, 0)
    assert narrowed(ch, Filters(service=PROXY)) is ch and narrowed(ch, None) is ch
    assert narrowed(duck, DAY1) is not duck  # DuckDB pushes a time range down too (its lookups' bounds)


def _rows_read(store, fn) -> int:
    before = store.backend.rows_read
    fn()
    return store.backend.rows_read - before


@pytest.mark.parametrize("case", ["day 1", "one session"])
def test_pushed_down_filters_read_less(stores, case):
    """The filtered query reads about one day of three (partition pruning on ``Timestamp``).  The
    bounds query before it reads session / request spans only, which the table's sort key
    (service, span name, time) finds by granule; in a store this small every day is one granule,
    so that part shows at scale (benchmarks/clickhouse)."""
    _, ch = stores
    everything = ch.bounded(0, 2**63 - 1)  # the same store, filters not pushed down
    full = _rows_read(everything, lambda: sessions.breakdown(everything, CASES[case]))
    bounded = narrowed(ch, CASES[case])
    pushed = _rows_read(bounded, lambda: sessions.breakdown(bounded, CASES[case]))
    assert pushed <= 0.4 * full, (pushed, full)
    assert (
        sessions.breakdown(bounded, CASES[case]).to_pylist() == sessions.breakdown(everything, CASES[case]).to_pylist()
    )
