"""The KV reuse page opens with the offers whose KV belongs to other tokens (P's check of D's digest):
most wrong tokens first, where the prompt first differs, and why the offer was made where the kvtrace
proxy forwarded the request; `kvtrace report` lists the same rows."""

from __future__ import annotations

import pytest

pytest.importorskip("streamlit")

from kvtrace import semconv as sc  # noqa: E402
from kvtrace.analysis import reuse  # noqa: E402
from kvtrace.analysis.report import text  # noqa: E402
from kvtrace.store import connect  # noqa: E402
from kvtrace.testing.synth import SIM_P, SpanBuilder  # noqa: E402

from support.dashboard_app import render_app  # noqa: E402

PAGE = "app_pages/reuse.py"
# request, verified, first mismatch, wrong tokens, pulled, the proxy's request span (offered, continuity) or None
DECISIONS = [
    ("r-match", sc.VERIFIED_MATCH, None, None, 300, (True, sc.CONTINUITY_EXTENDS)),
    ("r-small", sc.VERIFIED_MISMATCH, 256, 44, 300, None),
    ("r-ext", sc.VERIFIED_MISMATCH, 64, 90, 300, (True, sc.CONTINUITY_EXTENDS)),
    ("r-big", sc.VERIFIED_MISMATCH, 128, 172, 300, (True, sc.CONTINUITY_NEW)),
    ("r-inj", sc.VERIFIED_MISMATCH, 0, 150, 150, (False, sc.CONTINUITY_NEW)),
    ("r-none", sc.VERIFIED_UNVERIFIABLE, None, None, 0, None),
]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("mismatches")
    b = SpanBuilder()
    for i, (rid, verified, first, wrong, pulled, proxy) in enumerate(DECISIONS):
        session = f"s-{rid}"
        attrs = {
            sc.GEN_AI_REQUEST_ID: rid,
            sc.SESSION_ID: session,
            sc.TURN_INDEX: 1,
            sc.KV_DIRECTION: sc.DIRECTION_D2P,
            sc.KV_OUTCOME: sc.OUTCOME_PULLED if pulled else sc.OUTCOME_UNVERIFIED,
            sc.KV_PROMPT_TOKENS: 400,
            sc.KV_LOCAL_HIT_TOKENS: 0,
            sc.KV_REMOTE_TOKENS: 300,
            sc.KV_PULLED_TOKENS: pulled,
            sc.KV_RECOMPUTED_TOKENS: 400 - pulled,
            sc.KV_PEER_ENGINE_ID: "d0",
            sc.KV_VERIFIED: verified,
            sc.KV_VERIFY_MODE: sc.VERIFY_RECORD,
            sc.KV_VERIFIED_TOKENS: 300 if verified == sc.VERIFIED_MATCH else (first or 0),
        }
        if first is not None:
            attrs[sc.KV_VERIFY_MISMATCH_TOKEN] = first
            attrs[sc.KV_VERIFY_WRONG_TOKENS] = wrong
        if proxy is not None:
            offered, continuity = proxy
            extra = {sc.SESSION_CONTINUITY: continuity, sc.SESSION_SOURCE: sc.SOURCE_CONVERSATION_ID}
            reason = sc.OFFER_OFFERED if offered else sc.OFFER_NO_ENTRY
            at = 100.0 * i
            b.request(session, 1, rid, at, at + 50, 20.0, offered=offered, offer_reason=reason, extra=extra)
        b.span(sc.SPAN_KV_DECISION, 100.0 * i + 1, 100.0 * i + 5, service=SIM_P, attrs=attrs)
    b.write(root)
    return root


EXPECTED = [  # request, first mismatch, wrong tokens, cause: most wrong tokens first
    ("r-big", 128, 172, reuse.CAUSE_REUSED_ID),
    ("r-inj", 0, 150, reuse.CAUSE_INJECTED),
    ("r-ext", 64, 90, reuse.CAUSE_RENDERED),
    ("r-small", 256, 44, None),
]


def test_the_mismatches_query_names_the_cause_where_the_proxy_saw_the_request(traces):
    got = reuse.mismatches(connect(traces)).to_pylist()
    assert [(r["request_id"], r["first_mismatch_token"], r["wrong_tokens"], r["cause"]) for r in got] == EXPECTED
    assert [(r["verify_mode"], r["remote_tokens"], r["prompt_tokens"]) for r in got] == [
        (sc.VERIFY_RECORD, 300, 400)
    ] * 4


def test_the_reuse_page_opens_with_the_mismatched_offers(monkeypatch, traces):
    at = render_app(monkeypatch, traces, page=PAGE)
    first, mix = at.dataframe[0].value, at.dataframe[1].value
    cols = ("request_id", "first_mismatch_token", "wrong_tokens", "cause")
    assert list(zip(*(first[c] for c in cols), strict=True)) == [
        (rid, start, wrong, cause or "–") for rid, start, wrong, cause in EXPECTED
    ]
    assert list(zip(mix["verified"], mix["decisions"], mix["wrong_tokens"], strict=True)) == [
        (sc.VERIFIED_MISMATCH, 4, 172 + 150 + 90 + 44),
        (sc.VERIFIED_UNVERIFIABLE, 1, 0),
        (sc.VERIFIED_MATCH, 1, 0),
    ]
    assert at.subheader[0].value == "Offered KV checked against the prompt"


def test_the_report_lists_the_same_mismatches_with_their_causes(traces):
    _, rows = text.mismatch_rows(connect(traces))
    assert [(r[2], r[5], r[6], r[7]) for r in rows] == [
        (rid, str(start), str(wrong), cause or "–") for rid, start, wrong, cause in EXPECTED
    ]


def test_the_reuse_page_has_no_check_table_without_checked_offers(monkeypatch, tmp_path):
    b = SpanBuilder()
    attrs = {sc.GEN_AI_REQUEST_ID: "r-1", sc.KV_DIRECTION: sc.DIRECTION_D2P, sc.KV_OUTCOME: sc.OUTCOME_NO_REMOTE}
    b.span(sc.SPAN_KV_DECISION, 0, 5, service=SIM_P, attrs={**attrs, sc.KV_PROMPT_TOKENS: 10})
    b.write(tmp_path)
    at = render_app(monkeypatch, tmp_path, page=PAGE)
    assert "Offered KV checked against the prompt" not in [h.value for h in at.subheader]


def test_the_mismatches_query_gives_the_same_rows_on_clickhouse(traces):
    pytest.importorskip("chdb")
    pytest.importorskip("sqlglot")
    from support import clickhouse_check

    store = clickhouse_check.load_dir(traces)
    assert reuse.mismatches(store).to_pylist() == reuse.mismatches(connect(traces)).to_pylist()
