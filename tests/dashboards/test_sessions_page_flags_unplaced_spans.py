"""The sessions page warns when sessions hold agent spans the breakdown could not place."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from kvtrace import semconv as sc  # noqa: E402
from kvtrace.testing.synth import SpanBuilder  # noqa: E402

APP = Path(__file__).resolve().parents[2] / "dashboards" / "app.py"
OI = sc.OPENINFERENCE_SPAN_KIND


def _page(monkeypatch, traces: Path) -> AppTest:
    monkeypatch.setenv("KVTRACE_TRACES_DIR", str(traces))
    monkeypatch.delenv("KVTRACE_COMPARE_DIR", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page("app_pages/sessions.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_sessions_page_warns_about_unplaced_spans(monkeypatch, tmp_path):
    b = SpanBuilder()
    root = b.span("agent", 0, 1000, attrs={OI: sc.OI_AGENT, sc.SESSION_ID: "s-odd"})
    b.span("llm", 100, 400, parent=root, attrs={OI: sc.OI_LLM})
    b.span("odd", 500, 520, parent=root, attrs={OI: sc.OI_UNKNOWN})
    b.write(tmp_path / "odd")
    at = _page(monkeypatch, tmp_path / "odd")
    assert [w.value for w in at.warning] == [
        "1 session(s) hold 1 agent-side span(s) the breakdown could not place; their time counts as unattributed "
        f"(column `unplaced_spans`). `kvtrace doctor --traces {tmp_path / 'odd'}` lists them."
    ]
    assert list(at.dataframe[0].value["unplaced_spans"]) == [1]


def test_sessions_page_has_no_warning_when_everything_is_placed(monkeypatch, tmp_path):
    b = SpanBuilder()
    root = b.span("agent", 0, 1000, attrs={OI: sc.OI_AGENT, sc.SESSION_ID: "s-ok"})
    b.span("llm", 100, 400, parent=root, attrs={OI: sc.OI_LLM})
    b.write(tmp_path / "ok")
    assert not _page(monkeypatch, tmp_path / "ok").warning
