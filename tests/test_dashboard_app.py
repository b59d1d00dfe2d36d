"""Every dashboard page renders without exception (Streamlit AppTest), on a populated store, on
an empty trace directory, and with the run comparison configured."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from kvtrace.analysis import compare, reuse, sessions  # noqa: E402
from kvtrace.store import connect  # noqa: E402
from kvtrace.testing.synth import sample_store  # noqa: E402

APP = Path(__file__).resolve().parents[1] / "dashboards" / "app.py"
PAGES = ["app_pages/sessions.py", "app_pages/drilldown.py", "app_pages/reuse.py", "app_pages/retention.py", "app_pages/latency.py",
         "app_pages/whatif.py", "app_pages/compare.py"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dash")
    sample_store(root / "bidir", sessions=3, turns=4, pull=True)
    sample_store(root / "baseline", sessions=3, turns=4, pull=False)
    return root


def _render(monkeypatch, traces, compare=None, page=None) -> AppTest:
    monkeypatch.setenv("KVTRACE_TRACES_DIR", str(traces))
    if compare:
        monkeypatch.setenv("KVTRACE_COMPARE_DIR", str(compare))
    else:
        monkeypatch.delenv("KVTRACE_COMPARE_DIR", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


@pytest.mark.parametrize("page", PAGES)
def test_pages_render_on_traces(monkeypatch, runs, page):
    at = _render(monkeypatch, runs / "bidir", compare=runs / "baseline", page=page)
    assert at.title[0].value  # the page got past its header
    assert not at.info, [i.value for i in at.info]  # data everywhere: no "no data" notes


@pytest.mark.parametrize("page", PAGES)
def test_pages_render_on_empty_dir(monkeypatch, tmp_path, page):
    at = _render(monkeypatch, tmp_path / "nothing-here", page=page)
    assert at.info  # tells the user how to get data


def test_overview_numbers_match_the_views(monkeypatch, runs):
    at = _render(monkeypatch, runs / "bidir", page="app_pages/sessions.py")
    con = connect(runs / "bidir")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Sessions"] == f"{sessions.totals(con)['sessions']:,}"
    shown = at.dataframe[0].value
    assert list(shown["session_id"]) == [r["session_id"] for r in sessions.breakdown(con, limit=500).to_pylist()]


def test_reuse_page_numbers_match(monkeypatch, runs):
    at = _render(monkeypatch, runs / "bidir", page="app_pages/reuse.py")
    s = reuse.summary(connect(runs / "bidir"))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Pulled tokens"] == f"{s['pulled_tokens']:,}"
    assert metrics["Break-even"] == f"{s['break_even_tokens']:,.0f} tokens"


def test_whatif_page_numbers_match_the_replay(monkeypatch, runs):
    from kvtrace.analysis import whatif_summary

    at = _render(monkeypatch, runs / "bidir", page="app_pages/whatif.py")
    a = whatif_summary.advice(connect(runs / "bidir"))
    rc = a["recommendation"]
    picked = next(r for r in a["rows"] if (r["ttl_s"], r["threshold"]) == (rc["ttl_s"], rc["threshold"]))
    recorded = next(r for r in a["rows"] if r["recorded"])
    metrics = {m.label: (m.value, m.delta) for m in at.metric}
    assert metrics["Pulled"] == (f"{picked['pulled']:,} of {picked['decisions']:,}", f"recorded {recorded['pulled']:,}")
    assert metrics["KV held"][0] == f"{picked['gib_s_held']:,.1f} GiB·s"
    assert (at.select_slider[0].value, at.select_slider[1].value) == (rc["ttl_s"], rc["threshold"])
    at.select_slider[0].set_value(0.0).run()  # TTL 0: nothing retained, nothing pulled
    assert at.metric[1].value == "0.0 GiB·s" and at.metric[3].value.startswith("0 of ")
    shown = at.dataframe[0].value
    assert len(shown) == len(a["rows"]) and shown["recorded"].sum() == 1


def test_compare_page_shows_ratios(monkeypatch, runs):
    at = _render(monkeypatch, runs / "bidir", compare=runs / "baseline", page="app_pages/compare.py")
    shown = at.dataframe[0].value
    expected = compare.compare_runs(connect(runs / "baseline"), connect(runs / "bidir"))
    assert list(shown["turn"]) == [str(r["turn"]) for r in expected]
    assert list(shown["ratio"].round(6)) == [round(r["ratio"], 6) for r in expected]
    assert compare.row(expected, "ttft_ms", 3)["verdict"] == "faster"  # later turns: pulling beats recomputing


def test_drilldown_filters_to_one_session(monkeypatch, runs):
    monkeypatch.setenv("KVTRACE_TRACES_DIR", str(runs / "bidir"))
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page("app_pages/drilldown.py").run()
    at.sidebar.text_input[1].input("session-2").run()
    assert not at.exception
    assert at.subheader[-1].value.startswith("Spans (")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Turns"] == "4"


def test_a_directory_with_several_runs_is_refused_not_blended(monkeypatch, runs):
    monkeypatch.setenv("KVTRACE_TRACES_DIR", str(runs))  # holds bidir/ and baseline/
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception
    assert [e.value for e in at.error] == [
        f"{runs} holds 2 runs, which kvtrace does not merge: {runs / 'baseline'}, {runs / 'bidir'}. Pick one with "
        f"--traces (e.g. --traces {runs / 'baseline'}); compare two with --traces A --compare B (kvtrace report, "
        "kvtrace dashboard)"]
