"""Every dashboard page renders without exception (Streamlit AppTest), on a populated store, on
an empty trace directory, and with the run comparison configured."""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from kvtrace.analysis import compare, retention, reuse, sessions  # noqa: E402
from kvtrace.store import connect  # noqa: E402
from kvtrace.testing.synth import sample_store  # noqa: E402

from support.dashboard_app import APP, render_app  # noqa: E402

PAGES = [
    "app_pages/sessions.py",
    "app_pages/drilldown.py",
    "app_pages/reuse.py",
    "app_pages/retention.py",
    "app_pages/latency.py",
    "app_pages/whatif.py",
    "app_pages/compare.py",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dash")
    sample_store(root / "bidir", sessions=3, turns=4, pull=True)
    sample_store(root / "baseline", sessions=3, turns=4, pull=False)
    return root


@pytest.mark.parametrize("page", PAGES)
def test_pages_render_on_traces(monkeypatch, runs, page):
    at = render_app(monkeypatch, runs / "bidir", compare=runs / "baseline", page=page)
    assert at.title[0].value  # the page got past its header
    assert not at.info, [i.value for i in at.info]  # data everywhere: no "no data" notes


@pytest.mark.parametrize("page", PAGES)
def test_pages_render_on_empty_dir(monkeypatch, tmp_path, page):
    at = render_app(monkeypatch, tmp_path / "nothing-here", page=page)
    assert at.info  # tells the user how to get data


def test_overview_numbers_match_the_views(monkeypatch, runs):
    at = render_app(monkeypatch, runs / "bidir", page="app_pages/sessions.py")
    con = connect(runs / "bidir")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Sessions"] == f"{sessions.totals(con)['sessions']:,}"
    shown = at.dataframe[0].value
    assert list(shown["session_id"]) == [r["session_id"] for r in sessions.breakdown(con, limit=500).to_pylist()]


def test_reuse_page_numbers_match(monkeypatch, runs):
    at = render_app(monkeypatch, runs / "bidir", page="app_pages/reuse.py")
    s = reuse.summary(connect(runs / "bidir"))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Pulled tokens"] == f"{s['pulled_tokens']:,}"
    assert metrics["Break-even"] == f"{s['break_even_tokens']:,.0f} tokens"


def test_whatif_page_numbers_match_the_replay(monkeypatch, runs):
    from kvtrace.analysis.whatif import summary as whatif_summary

    at = render_app(monkeypatch, runs / "bidir", page="app_pages/whatif.py")
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
    at = render_app(monkeypatch, runs / "bidir", compare=runs / "baseline", page="app_pages/compare.py")
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
        "kvtrace dashboard)"
    ]


URLS = {
    "sessions": "Sessions",
    "drilldown": "Session drill-down",
    "reuse": "KV reuse",
    "retention": "Retention",
    "latency": "Latency by turn",
    "whatif": "What-if",
    "compare": "Run comparison",
}


def test_every_page_has_its_own_url_and_the_root_opens_sessions(monkeypatch, runs):
    """Streamlit serves its default page at "/" only (its url_path is ignored: /sessions was "Page not
    found"); the default is a hidden page that switches to the sessions page."""
    at = render_app(monkeypatch, runs / "bidir")
    assert at.title[0].value == "Sessions"
    registered = {info["url_pathname"]: info["page_name"] for info in at._registered_pages.values()}
    assert registered == {"": "kvtrace", **URLS}


def _formats(element) -> dict:
    import json

    return {
        name: (c.get("label"), c.get("type_config", {}).get("format"))
        for name, c in json.loads(element.proto.columns).items()
    }


@pytest.mark.parametrize("page", PAGES)
def test_tables_show_times_gib_and_sensible_precision(monkeypatch, runs, page):
    import pandas as pd

    at = render_app(monkeypatch, runs / "bidir", compare=runs / "baseline", page=page)
    assert at.dataframe, page
    for element in at.dataframe:
        frame, formats = element.value, _formats(element)
        assert not [c for c in frame.columns if c.endswith("_ns") or "bytes" in c], (page, list(frame.columns))
        for name in frame.columns:
            if pd.api.types.is_datetime64_any_dtype(frame[name]):
                assert str(frame[name].dt.tz) == "UTC" and formats[name] == (f"{name} (UTC)", "YYYY-MM-DD HH:mm:ss")
            elif pd.api.types.is_numeric_dtype(frame[name]) and not pd.api.types.is_bool_dtype(frame[name]):
                # every number has a chosen format (booleans show as checkboxes)
                assert formats[name][1] in ("%,.1f", "%,.2f", "%.2f", "%,d", "%d", "%.4g"), (page, name, formats[name])
                if name.endswith("_ms"):
                    assert formats[name] == (name.replace("_", " "), "%,.1f")


def test_session_table_values_are_the_views_in_display_units(monkeypatch, runs):
    import pandas as pd

    at = render_app(monkeypatch, runs / "bidir", page="app_pages/sessions.py")
    shown = at.dataframe[0].value
    rows = sessions.breakdown(connect(runs / "bidir"), limit=500).to_pylist()
    assert list(shown["start"]) == [pd.Timestamp(r["start_ns"], unit="ns", tz="UTC") for r in rows]
    assert list(shown["user_pause_ms"]) == [r["user_pause_ms"] for r in rows] and rows[0]["user_pause_ms"] > 0
    metrics = {m.label: m.value for m in at.metric}
    tot = sessions.totals(connect(runs / "bidir"))
    assert metrics["User pauses"] == f"{tot['user_pause_ms'] / tot['wall_ms']:.0%}"
    # the retention engine table: GiB, not bytes
    at = render_app(monkeypatch, runs / "bidir", page="app_pages/retention.py")
    (held,) = retention.summary(connect(runs / "bidir"))
    engines = at.dataframe[0].value
    assert list(engines["peak_GiB"]) == [held["peak_bytes"] / 2**30]
    assert _formats(at.dataframe[0])["GiB_seconds"] == ("GiB·s", "%,.2f")


def test_never_read_says_it_is_a_run_total_beside_the_peak(monkeypatch, runs):
    at = render_app(monkeypatch, runs / "bidir", page="app_pages/retention.py")
    tot = retention.totals(connect(runs / "bidir"))
    metrics = {m.label: m for m in at.metric}
    assert "Never read" not in metrics and metrics["Never read (run total)"].value.endswith(("MiB", "GiB", "KiB", "B"))
    assert metrics["Peak held"].value and tot["peak_bytes_sum"] > 0
    assert any("Never read adds up over the run" in c.value for c in at.caption)


def test_charts_use_the_shared_palette(monkeypatch, runs):
    import json

    from kvtrace.analysis import palette

    def scales(at):
        out = []
        for chart in at.get("vega_lite_chart"):
            spec = json.loads(chart.proto.spec)
            for layer in [spec, *spec.get("layer", [])]:
                scale = layer.get("encoding", {}).get("color", {}).get("scale")
                if scale:
                    out.append((scale["domain"], scale["range"]))
        return out

    parts = (palette.labels(palette.PARTS), palette.colours(palette.PARTS))
    sources = (palette.labels(palette.SOURCES), palette.colours(palette.SOURCES))
    assert scales(render_app(monkeypatch, runs / "bidir", page="app_pages/sessions.py")) == [parts, parts]
    assert scales(render_app(monkeypatch, runs / "bidir", page="app_pages/drilldown.py")) == [parts]
    assert sources in scales(render_app(monkeypatch, runs / "bidir", page="app_pages/reuse.py"))


def test_trace_directory_box_stays_within_the_directories_given_at_start(monkeypatch, runs, tmp_path):
    """The sidebar's box (and the comparison page's baseline box) opens the directory
    the dashboard was started with, or one below it, nothing else on the server."""
    (runs / "bidir" / "link-out").symlink_to(tmp_path)  # a way out through a symlink
    try:
        at = render_app(monkeypatch, runs / "bidir", compare=runs / "baseline")
        for outside in ("/etc", str(runs), str(runs / "bidir" / "link-out"), str(runs / "bidir" / ".." / "..")):
            at.sidebar.text_input[0].input(outside).run()
            assert [e.value for e in at.error] == [
                f"Trace directory `{outside}` is outside the trace directories this dashboard was started with "
                f"(`{runs / 'bidir'}`, `{runs / 'baseline'}`); choose one of them or a directory below it."
            ]
            assert not at.metric and not at.dataframe  # nothing of it was read
        for inside in (str(runs / "baseline"), str(runs / "bidir" / "date=2026-01-01")):
            at.sidebar.text_input[0].input(inside).run()
            assert not at.error and at.metric, inside
        at = render_app(monkeypatch, runs / "bidir", compare=runs / "baseline", page="app_pages/compare.py")
        baseline_box = next(t for t in at.main.text_input if t.label == "Baseline trace directory")
        baseline_box.input("/").run()
        assert [e.value for e in at.error][0].startswith("Baseline trace directory `/` is outside")
    finally:
        (runs / "bidir" / "link-out").unlink()


def test_waterfall_bars_have_a_minimum_width(runs):
    from kvtrace.dashboards.common import MIN_BAR, waterfall

    spans = sessions.spans_of_session(connect(runs / "bidir"), "session-0")
    frame = waterfall(spans)
    total = frame["end_ms"].max() - frame["start_ms"].min()
    widths = frame["bar_end_ms"] - frame["start_ms"]
    assert (widths >= MIN_BAR * total - 1e-9).all()
    short = frame["end_ms"] - frame["start_ms"] < MIN_BAR * total
    assert short.any() and (frame.loc[~short, "bar_end_ms"] == frame.loc[~short, "end_ms"]).all()
    assert list(frame["duration_ms"]) == [s["duration_ms"] for s in spans]  # the tooltip keeps the real length


def test_the_launcher_is_streamlit_with_the_pages_imports_done_first(tmp_path):
    import ast
    import subprocess
    import sys

    from kvtrace.dashboards import launch as cli
    from kvtrace.dashboards import serve

    assert cli.command("d")[:4] == [sys.executable, str(cli.SERVE), "run", str(cli.APP)]
    # run from a directory holding a ``kvtrace`` package without ``dashboards`` (a source checkout's
    # root with kvtrace installed non-editable, where the README's commands are run)
    (tmp_path / "kvtrace").mkdir()
    (tmp_path / "kvtrace" / "__init__.py").write_text("")
    out = subprocess.run(
        cli.command("d")[:2] + ["--version"], capture_output=True, text=True, timeout=120, check=True, cwd=tmp_path
    ).stdout
    assert out.startswith("Streamlit, version ")
    # what it preloads is what every page imports (through common.py) and Streamlit does not load itself
    tree = ast.parse((APP.parent / "common.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert set(serve.PRELOAD) - {"duckdb"} <= imported  # duckdb: what kvtrace.store connects with
    code = "import sys, streamlit.web.cli; print(sorted(set(sys.argv[1:]) & set(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", code, *serve.PRELOAD], capture_output=True, text=True, timeout=120, check=True
    ).stdout.strip()
    assert loaded == "[]", loaded
