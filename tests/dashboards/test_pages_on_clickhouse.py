"""The dashboard on an ``otel_traces`` table (chDB): every page renders, the time range comes
first (it opens on the last day of data), and its numbers are DuckDB's for the same filters."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("sqlglot")
pytest.importorskip("chdb")
clickhouse_check = pytest.importorskip("support.clickhouse_check")

from kvtrace.analysis import sessions  # noqa: E402
from kvtrace.analysis.filters import Filters  # noqa: E402
from kvtrace.store import connect  # noqa: E402

DASH = Path(__file__).resolve().parents[2] / "dashboards"
PAGES = [
    "app_pages/sessions.py",
    "app_pages/drilldown.py",
    "app_pages/reuse.py",
    "app_pages/retention.py",
    "app_pages/latency.py",
]
DAY = 86_400 * 10**9


@pytest.fixture(scope="module")
def two_days(tmp_path_factory):
    traces = clickhouse_check.tiled_store(tmp_path_factory.mktemp("dash-ch"), 2, 2 * DAY)
    store = clickhouse_check.load_dir(traces)
    return traces, f"chdb:{store.backend.path}", store.table


@pytest.fixture
def env(monkeypatch, two_days):
    traces, url, table = two_days
    monkeypatch.setenv("KVTRACE_CLICKHOUSE", url)  # wins over the trace directory _render sets
    monkeypatch.setenv("KVTRACE_CLICKHOUSE_TABLE", table)
    return two_days


def _render(monkeypatch, page: str):
    from support.dashboard_app import render_app

    return render_app(monkeypatch, "not-read", page=page)


@pytest.mark.parametrize("page", PAGES)
def test_pages_render_on_clickhouse(env, monkeypatch, page):
    at = _render(monkeypatch, page)
    assert at.title[0].value
    assert not at.info, [i.value for i in at.info]
    assert any("ClickHouse: chdb:" in c.value for c in at.sidebar.caption)


def test_opens_on_the_last_day_with_duckdbs_numbers(env, monkeypatch):
    traces, _, _ = env
    at = _render(monkeypatch, "app_pages/sessions.py")
    duck = connect(traces)
    span = sessions.time_span(duck)
    from kvtrace.dashboards import common

    last_day = Filters(
        start_ns=common._ns(common._dt(span["end_ns"] - common.DEFAULT_WINDOW_NS)),
        end_ns=common._ns(common._dt(span["end_ns"]) + dt.timedelta(seconds=1)),
    )
    slider = at.sidebar.slider[0]
    assert (common._ns(slider.value[0]), common._ns(slider.value[1])) == (last_day.start_ns, last_day.end_ns)
    metrics = {m.label: m.value for m in at.metric}
    expected = sessions.totals(duck, last_day)
    assert expected["sessions"] == 3 and sessions.totals(duck)["sessions"] == 6
    assert metrics["Sessions"] == f"{expected['sessions']:,}" and metrics["Turns"] == f"{expected['turns']:,}"
    table = at.dataframe[0].value
    assert sorted(table["session_id"]) == sorted(
        r["session_id"] for r in sessions.breakdown(duck, last_day).to_pylist()
    )


def test_says_in_one_line_how_to_add_the_materialized_tables_until_they_are_there(env, monkeypatch):
    from kvtrace.store.clickhouse import mviews

    traces, url, table = env
    at = _render(monkeypatch, "app_pages/sessions.py")
    notes = [c.value for c in at.sidebar.caption if "materialized tables" in c.value]
    cmd = f"kvtrace clickhouse init --clickhouse {url} --table {table}"
    assert notes == [f"{table}: no materialized tables (every answer reads the raw table): add them with `{cmd}`"]
    shaped = clickhouse_check.load_dir(traces, clickhouse_check.chdb_backend(), table + "_shaped")
    mviews.init(shaped.backend, shaped.table)
    monkeypatch.setenv("KVTRACE_CLICKHOUSE_TABLE", shaped.table)
    at = _render(monkeypatch, "app_pages/sessions.py")
    assert not [c.value for c in at.sidebar.caption if "materialized tables" in c.value]
    assert {m.label: m.value for m in at.metric}["Sessions"] == "3"  # the same last day, from the shaped tables
