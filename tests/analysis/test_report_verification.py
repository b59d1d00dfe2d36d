"""`kvtrace report`'s KV section: P's check of D's digest, mismatched offers first."""

from __future__ import annotations

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis.report import document, text
from kvtrace.store import connect
from kvtrace.testing.synth import SIM_P, SpanBuilder

# (request, session, turn, verified, mode, outcome, first mismatch, wrong tokens, pulled)
DECISIONS = [
    ("r-match", "s1", 1, sc.VERIFIED_MATCH, sc.VERIFY_RECORD, sc.OUTCOME_PULLED, None, None, 300),
    ("r-small", "s2", 1, sc.VERIFIED_MISMATCH, sc.VERIFY_RECORD, sc.OUTCOME_PULLED, 256, 44, 300),
    ("r-none", "s3", 2, sc.VERIFIED_UNVERIFIABLE, sc.VERIFY_ENFORCE, sc.OUTCOME_UNVERIFIED, None, None, 0),
    ("r-big", "s4", 3, sc.VERIFIED_MISMATCH, sc.VERIFY_ENFORCE, sc.OUTCOME_PULLED, 128, 172, 128),
]


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    root = tmp_path_factory.mktemp("verified")
    b = SpanBuilder()
    for i, (rid, sess, turn, verified, mode, outcome, first, wrong, pulled) in enumerate(DECISIONS):
        attrs = {
            sc.GEN_AI_REQUEST_ID: rid,
            sc.SESSION_ID: sess,
            sc.TURN_INDEX: turn,
            sc.KV_DIRECTION: sc.DIRECTION_D2P,
            sc.KV_OUTCOME: outcome,
            sc.KV_PROMPT_TOKENS: 400,
            sc.KV_LOCAL_HIT_TOKENS: 0,
            sc.KV_REMOTE_TOKENS: 300,
            sc.KV_PULLED_TOKENS: pulled,
            sc.KV_RECOMPUTED_TOKENS: 400 - pulled,
            sc.KV_PEER_ENGINE_ID: "d0",
            sc.KV_VERIFIED: verified,
            sc.KV_VERIFY_MODE: mode,
            sc.KV_VERIFIED_TOKENS: first if first is not None else (300 if verified == sc.VERIFIED_MATCH else 0),
        }
        if first is not None:
            attrs[sc.KV_VERIFY_MISMATCH_TOKEN] = first
            attrs[sc.KV_VERIFY_WRONG_TOKENS] = wrong
        b.span(sc.SPAN_KV_DECISION, 100.0 * i, 100.0 * i + 5, service=SIM_P, attrs=attrs)
    # a p2d decision is never checked: not counted
    b.span(sc.SPAN_KV_DECISION, 900, 905, service=SIM_P, attrs={sc.KV_DIRECTION: sc.DIRECTION_P2D})
    b.write(root)
    return connect(root)


def test_the_verification_mix_lists_mismatches_first(con):
    cols, rows = text.verification_rows(con)
    assert cols == ["offered KV verified", "decisions", "pulled", "tokens from other KV"]
    assert rows == [["mismatch", "2", "2", "216"], ["unverifiable", "1", "0", "0"], ["match", "1", "1", "0"]]


def test_mismatched_offers_are_listed_most_wrong_tokens_first(con):
    cols, rows = text.mismatch_rows(con)
    assert cols == [
        "session",
        "turn",
        "request",
        "verify",
        "outcome",
        "first mismatch",
        "tokens from other KV",
        "cause",
        "pulled",
    ]
    assert rows == [
        ["s4", "3", "r-big", "enforce", "pulled", "128", "172", "–", "128"],  # no kvtrace proxy: no cause
        ["s2", "1", "r-small", "record", "pulled", "256", "44", "–", "300"],
    ]


def test_the_kv_section_opens_with_the_check(con, tmp_path):
    doc, _ = document.build(con, str(tmp_path), plots=False)
    kv = next(body for kind, body in doc if kind == "md" and body.startswith("## KV reuse"))
    assert kv.index("offered KV verified") < kv.index("Mismatched offers") < kv.index("P reuse decisions (d2p)")
