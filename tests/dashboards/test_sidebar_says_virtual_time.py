"""The sidebar says in one line when a run's times are simulated (its simulated workers ran on the
virtual clock: resource ``kvtrace.sim.clock``), and says nothing of the kind for a wall-clock run."""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit")

from kvtrace import semconv as sc  # noqa: E402
from kvtrace.testing.synth import SIM_P, SpanBuilder  # noqa: E402

from support.dashboard_app import render_app  # noqa: E402

CAPTION = "Simulated time (virtual clock): every time and timestamp is the model's, wall ones included."


def _store(root, clock: str) -> None:
    b = SpanBuilder()
    b.session("s", 0, 1000)
    resource = {sc.ENGINE_ID: "sim-prefill-0", sc.ENGINE_ROLE: sc.ROLE_PREFILL, sc.SUBSTRATE: sc.SUBSTRATE_SIM}
    resource[sc.SIM_CLOCK] = clock
    b.span(sc.SPAN_ENGINE_PREFILL, 10, 20, service=SIM_P, attrs={sc.SESSION_ID: "s"}, resource=resource)
    b.write(root)


@pytest.mark.parametrize(("clock", "shown"), [(sc.CLOCK_VIRTUAL, True), (sc.CLOCK_WALL, False)])
def test_the_sidebar_names_simulated_time(monkeypatch, tmp_path, clock, shown):
    _store(tmp_path, clock)
    at = render_app(monkeypatch, tmp_path, page="app_pages/sessions.py")
    captions = [c.value for c in at.sidebar.caption]
    assert (CAPTION in captions) is shown, captions
