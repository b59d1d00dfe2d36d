"""The dashboard under Streamlit's AppTest, for the page tests (on Parquet and on ClickHouse).
Import it after ``pytest.importorskip("streamlit")``."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = Path(__file__).resolve().parents[2] / "dashboards" / "app.py"


def render_app(monkeypatch, traces, compare=None, page=None) -> AppTest:
    """The app on ``traces`` (and ``compare``), switched to ``page``; no exception, no error element."""
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
