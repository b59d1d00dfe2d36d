"""The KV reuse page breaks reuse down per instance on a fleet (several P or D behind the proxy):
each endpoint's requests, why routing sent them there and the instance's own decisions, for the
filters set; one P and one D get no such section."""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit")

from kvtrace import semconv as sc  # noqa: E402
from kvtrace.analysis import instances  # noqa: E402
from kvtrace.analysis.filters import Filters  # noqa: E402
from kvtrace.store import connect  # noqa: E402
from kvtrace.testing.synth import SIM_P, SpanBuilder  # noqa: E402

from support.dashboard_app import render_app  # noqa: E402

PAGE = "app_pages/reuse.py"
P0, P1, D0 = "http://127.0.0.1:8100", "http://127.0.0.1:8101", "http://127.0.0.1:8200"
# request, its P, why, pulled tokens (P's d2p decision)
TURNS = [("r0", P0, sc.ROUTE_ROTATION, 0), ("r1", P1, sc.ROUTE_ROTATION, 300), ("r2", P0, sc.ROUTE_LEAST_LOADED, 500)]


def _store(root, turns, dead: str | None = None) -> None:
    """The turns' request and decision spans; with ``dead``, each turn's first P leg went to that worker
    and never reached it."""
    b = SpanBuilder()
    for i, (rid, p, why, pulled) in enumerate(turns):
        at = 1000.0 * i
        request = b.span(
            sc.SPAN_PROXY_REQUEST,
            at,
            at + 500,
            service="kvtrace-proxy",
            attrs={
                sc.GEN_AI_REQUEST_ID: rid,
                sc.SESSION_ID: "s",
                sc.PROXY_PREFILL_ENDPOINT: p,
                sc.PROXY_DECODE_ENDPOINT: D0,
                sc.ROUTE_POLICY: sc.ROUTING_ROUND_ROBIN,
                sc.ROUTE_PREFILL_REASON: why,
                sc.ROUTE_DECODE_REASON: sc.ROUTE_ROTATION,
            },
        )
        attrs = {
            sc.GEN_AI_REQUEST_ID: rid,
            sc.SESSION_ID: "s",
            sc.KV_DIRECTION: sc.DIRECTION_D2P,
            sc.KV_OUTCOME: sc.OUTCOME_PULLED if pulled else sc.OUTCOME_NO_REMOTE,
            sc.KV_PROMPT_TOKENS: 600,
            sc.KV_LOCAL_HIT_TOKENS: 0,
            sc.KV_PULLED_TOKENS: pulled,
            sc.KV_RECOMPUTED_TOKENS: 600 - pulled,
        }
        b.span(sc.SPAN_KV_DECISION, at + 10, at + 20, service=SIM_P, attrs=attrs)
        if dead is not None:
            leg = {sc.GEN_AI_REQUEST_ID: rid, sc.SESSION_ID: "s", sc.PROXY_PREFILL_ENDPOINT: dead}
            leg |= {sc.PROXY_UNREACHABLE: True, sc.ERROR_TYPE: "ClientConnectorError"}
            b.span(sc.SPAN_PROXY_PREFILL, at + 1, at + 4, parent=request, service="kvtrace-proxy", attrs=leg)
    b.write(root)


def test_the_reuse_page_shows_each_prefillers_routing_and_pulls(monkeypatch, tmp_path):
    _store(tmp_path, TURNS)
    at = render_app(monkeypatch, tmp_path, page=PAGE)
    assert "Reuse per instance" in [h.value for h in at.subheader]
    shown = at.dataframe[-1].value
    rows = list(zip(shown["role"], shown["endpoint"], shown["requests"], shown["pulled_tokens"], strict=True))
    assert rows == [(sc.ROLE_PREFILL, P0, 2, 500), (sc.ROLE_PREFILL, P1, 1, 300), (sc.ROLE_DECODE, D0, 3, 0)]
    assert list(shown[sc.ROUTE_LEAST_LOADED]) == [1, 0, 0]


def test_a_dead_prefiller_is_a_row_of_its_own(monkeypatch, tmp_path):
    """No request ends at a worker that cannot be reached: its row comes from the proxy's legs."""
    dead = "http://127.0.0.1:8199"
    _store(tmp_path, TURNS, dead=dead)
    at = render_app(monkeypatch, tmp_path, page=PAGE)
    shown = at.dataframe[-1].value
    legs = shown[["failed_legs", "unreachable_legs"]].fillna(-1).astype(int)  # -1: no leg names the worker
    rows = list(zip(shown["endpoint"], shown["requests"], legs["failed_legs"], legs["unreachable_legs"], strict=True))
    assert rows == [(P0, 2, -1, -1), (P1, 1, -1, -1), (dead, 0, 3, 3), (D0, 3, -1, -1)]
    assert list(shown["failed_leg_ms"])[2] == 9.0  # three legs of 3 ms
    later = instances.per_instance(connect(tmp_path), Filters(start_ns=SpanBuilder().ns(1000))).to_pylist()
    assert [(r["endpoint"], r["requests"], r["legs"]) for r in later] == [
        (P0, 1, None),
        (P1, 1, None),
        (dead, 0, 2),
        (D0, 2, None),
    ]


def test_filters_select_the_requests(tmp_path):
    _store(tmp_path, TURNS)
    con = connect(tmp_path)
    start = SpanBuilder().ns(1000)  # from the second turn on
    rows = instances.per_instance(con, Filters(start_ns=start)).to_pylist()
    assert [(r["endpoint"], r["requests"]) for r in rows] == [(P0, 1), (P1, 1), (D0, 2)]
    assert instances.per_instance(con, Filters(session_id="nobody")).num_rows == 0


def test_one_p_and_one_d_get_no_section(monkeypatch, tmp_path):
    _store(tmp_path, [t for t in TURNS if t[1] == P0])
    at = render_app(monkeypatch, tmp_path, page=PAGE)
    assert "Reuse per instance" not in [h.value for h in at.subheader]
